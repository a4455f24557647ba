"""The dashboard: per topic counts, backlog, oldest due age, alarms and hourly charts."""

from __future__ import annotations

from flask import Blueprint, render_template

from tidemq import clock
from tidemq.lifecycle import STATUSES, MessageStatus
from tidemq_broker.storage import TopicBacklog, hours_ago

from ..charts import line_chart
from . import console

__all__ = ["bp"]

bp = Blueprint("dashboard", __name__)
CHART_HOURS = 48
REFRESH_SECONDS = 5  # how often an open dashboard refreshes its figures in place


@bp.route("/")
def index():  # type: ignore[no-untyped-def]
    c = console()
    now = clock.now()
    topics = {t.name for t in c.storage.topics.list_topics()}
    present = c.storage.console.topics_present()
    backlog = c.storage.console.backlog(sorted(topics | set(present)), now)
    # NEW is the backlog query's due + scheduled: counted once, now.
    new = MessageStatus.NEW.value
    counted = c.storage.console.topic_counts(known={name: {new: b.due + b.scheduled} for name, b in backlog.items()},
                                   topics=present)
    counts = counted.counts
    names = sorted(set(counts) | topics)
    since = hours_ago(now, CHART_HOURS - 1)
    stats = c.storage.console.topic_stats(since)
    hours = [hours_ago(now, CHART_HOURS - 1 - i) for i in range(CHART_HOURS)]
    labels = [h.strftime("%H:00") for h in hours]
    rows = []
    for name in names:
        b = backlog.get(name) or TopicBacklog()
        by_hour = {r["hour"]: r for r in stats.get(name, [])}
        charts = []
        if by_hour:
            def col(key: str):  # type: ignore[no-untyped-def]
                return [(by_hour[h][key] if h in by_hour and by_hour[h][key] is not None else None) for h in hours]

            charts.append(line_chart(f"{name}: messages per hour", labels, [
                ("produced", "s-produced", col("produced")), ("succeeded", "s-success", col("succeeded")),
                ("failed", "s-fail", col("failed"))]))
            if any(v is not None for v in col("lateness_p95_ms")):
                charts.append(line_chart(f"{name}: delay lateness", labels, [
                    ("p50", "s-produced", col("lateness_p50_ms")), ("p95", "s-success", col("lateness_p95_ms")),
                    ("p99", "s-fail", col("lateness_p99_ms"))], unit="ms"))
        oldest_age = (now - b.oldest_due).total_seconds() if b.oldest_due else None
        rows.append({"name": name, "counts": counts.get(name, {}), "backlog": b, "oldest_age": oldest_age,
                     "charts": charts})
    totals = {s.value: sum(counts.get(n, {}).get(s.value, 0) for n in names) for s in STATUSES}
    # A refresh asks for the page again (tidemq.js) and swaps in its #live part: same view, no reload.
    return render_template("dashboard.html", rows=rows, totals=totals, alarms=c.storage.console.open_alarms(),
                           hours=CHART_HOURS, now=now, counted=counted, refresh_seconds=REFRESH_SECONDS)
