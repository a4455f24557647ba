"""Cluster: live brokers, the maintenance leader, and per topic its consumers with rank/total."""

from __future__ import annotations

from flask import Blueprint, render_template

from tidemq.coordinator import sequence_of

from . import console

__all__ = ["bp"]

bp = Blueprint("cluster", __name__)


@bp.route("/cluster")
def index():  # type: ignore[no-untyped-def]
    c = console()
    snap = c.cluster.snapshot()
    topics = []
    for topic, nodes in sorted(snap.consumers.items()):
        model = "TOPIC (broadcast)" if topic in snap.broadcast_topics else "QUEUE / SERIAL_QUEUE"
        total = len(nodes)
        topics.append({
            "name": topic,
            "model": model,
            "consumers": [{"node": n, "instance": n.rsplit("-", 1)[0], "seq": sequence_of(n), "rank": i,
                           "total": total} for i, n in enumerate(nodes)],
        })
    return render_template("cluster.html", snap=snap, topics=topics, zk_hosts=c.settings.zk_hosts,
                           zk_root=c.settings.zk_root)
