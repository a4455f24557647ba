"""Flow control: what limits and priorities add to the lock, measured in one run.

Three topics get the same due backlog: one with no limits and every message at priority 0 (the
path of a topic without flow control), one with a running limit and a rate (neither binding, so
both lock the same batch size) and priorities 0-9, and the same plus a per-key limit over 100
keys. Each round locks one batch of each topic in turn through the storage layer and acks it
(untimed), so RUNNING stays one batch; the figure is the mean time of ``lock_batch``.
"""

from __future__ import annotations

import random
import time
from argparse import Namespace

from tidemq import clock
from tidemq.link import AckItem
from tidemq_broker.storage import FlowLimits, LockRequest, NewRow, Shard, TopicSettings
from tidemq_broker.storages import open_storage

from .env import Cluster
from .report import Report

SCENARIO = "flow"
TOPICS = {"bench.flow.plain": None,
          "bench.flow.limited": FlowLimits(max_running=100_000, rate_per_second=1_000_000.0),
          "bench.flow.per_key": FlowLimits(max_running=100_000, rate_per_second=1_000_000.0, max_running_per_key=50)}


def run(cluster: Cluster, report: Report, args: Namespace) -> None:
    storage = open_storage(cluster.db_url)
    rng = random.Random(7)
    total, batch, rounds = args.flow_messages, args.flow_batch, args.flow_locks
    try:
        now = clock.now()
        for topic, limits in TOPICS.items():
            report.progress(f"flow: loading {total} due messages of {topic}")
            for start in range(0, total, 1000):
                rows = [NewRow(topic, '{"n": 1}', clock.after(now, -rng.random() * 60), 0,
                               priority=0 if limits is None else rng.randint(0, 9),
                               flow_key=None if limits is None else f"customer-{rng.randrange(100)}")
                        for _ in range(min(1000, total - start))]
                storage.messages.insert_messages(rows, now)
            if limits is not None:
                storage.topics.set_topic_limits(topic, limits, now)
        spent = {topic: 0.0 for topic in TOPICS}
        for n in range(rounds):
            report.progress(f"flow: lock round {n + 1}/{rounds}")
            for topic, limits in TOPICS.items():
                began = time.perf_counter()
                got = storage.leases.lock_batch(LockRequest(Shard(topic), "bench", 60, clock.now(), limit=batch,
                                                            limits=limits))
                spent[topic] += time.perf_counter() - began
                if len(got) != batch:
                    raise RuntimeError(f"{topic}: locked {len(got)} of {batch} (the limits must not bind here)")
                storage.acks.ack([AckItem(m.id, m.lease_token, True) for m in got], clock.now(), "bench", "bench",
                            TopicSettings)
        plain = spent["bench.flow.plain"] / rounds * 1000
        limited = spent["bench.flow.limited"] / rounds * 1000
        per_key = spent["bench.flow.per_key"] / rounds * 1000
        report.record(SCENARIO, "lock, no limits, priority 0 (baseline)", round(plain, 2), "ms",
                      f"{batch} of {total} due, {rounds} locks")
        report.record(SCENARIO, "lock, running limit + rate + priorities 0-9", round(limited, 2), "ms")
        report.record(SCENARIO, "lock, + per-key limit (100 keys)", round(per_key, 2), "ms")
        report.record(SCENARIO, "ratio limits+priorities / baseline", round(limited / plain, 3), "x")
        report.record(SCENARIO, "ratio with per-key / baseline", round(per_key / plain, 3), "x")
        report.target(SCENARIO, "lock cost with limits and priorities", limited / plain, "<=", args.flow_target)
    finally:
        storage.close()
