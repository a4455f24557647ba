"""enqueue: how soon a waiting consumer gets a message enqueued in an application transaction,
beside a produced one, in the same run.

One message at a time, alternating ``tidemq.enqueue`` + COMMIT (an application transaction on
the benchmark's own SQLAlchemy engine) and ``tidemq.produce`` (through the broker), with a
pause between them so the consumer is always waiting in a long-poll when a message arrives: the
case where a broker must learn of a commit it did not make. A pull thread in this process
records when each message reaches it (one clock for both ends).

Latency is from the moment the application asks for the message to be durable to its receipt:
enqueue from the start of COMMIT (and, also shown, from COMMIT's return), produce from the
start of the ``produce`` call (its RPC, group commit and answer are the same step for it).
"""

from __future__ import annotations

import random
import threading
import time
from argparse import Namespace

from sqlalchemy import create_engine

import tidemq
from tidemq import BatchConsumer

from . import raw
from .env import Cluster, CpuMeter
from .report import Report, summarize

__all__ = ["run"]

TOPIC = "bench.enqueue"


def run(cluster: Cluster, report: Report, args: Namespace) -> None:
    raw.truncate(cluster.db_url)
    client = cluster.client()
    engine = create_engine(cluster.db_url, pool_size=2)
    received: dict[int, float] = {}
    stop = threading.Event()
    consumer = BatchConsumer(TOPIC, ttr=30, client=client)

    def pull_forever() -> None:
        while not stop.is_set():
            batch = consumer.pull(max_messages=100, wait=2.0)
            at = time.perf_counter()
            for message in batch:
                received[message.id] = at
            if batch:
                consumer.ack(succeeded=[m.id for m in batch])

    puller = threading.Thread(target=pull_forever, name="bench-enqueue-pull", daemon=True)
    puller.start()
    enqueue_ms: list[float] = []
    after_commit_ms: list[float] = []
    produce_ms: list[float] = []
    try:
        consumer.pull(max_messages=1, wait=0.0)  # connect before timing anything
        report.progress("enqueue: broker CPU with a pull waiting and nothing to deliver")
        with CpuMeter({"broker": [cluster.brokers[0].pid]}) as idle:
            time.sleep(args.enqueue_idle_seconds)
        report.record("enqueue", "broker CPU, idle with a pull waiting", idle.shares()["broker"], "cores",
                      "the 20 ms probe of recent inserts")
        samples = args.enqueue_samples
        with CpuMeter({"broker": [cluster.brokers[0].pid]}) as cpu:
            for i in range(samples):
                report.progress(f"enqueue: {i}/{samples} of each")
                for kind in (("enqueue", "produce") if i % 2 == 0 else ("produce", "enqueue")):
                    time.sleep(random.uniform(0.03, 0.06))  # the consumer is back in its long-poll
                    if kind == "enqueue":
                        with engine.connect() as conn:
                            msg_id = tidemq.enqueue(conn, TOPIC, {"i": i})
                            started = time.perf_counter()
                            conn.commit()
                            committed = time.perf_counter()
                        at = _wait_for(received, msg_id)
                        enqueue_ms.append((at - started) * 1000)
                        after_commit_ms.append((at - committed) * 1000)
                    else:
                        started = time.perf_counter()
                        msg_id = client.produce(TOPIC, {"i": i})
                        produce_ms.append((_wait_for(received, msg_id) - started) * 1000)
        enq = report.record("enqueue", "enqueue: COMMIT start -> received", summarize(enqueue_ms), "ms")
        after = report.record("enqueue", "enqueue: COMMIT return -> received", summarize(after_commit_ms), "ms")
        prod = report.record("enqueue", "produce: call -> received (baseline)", summarize(produce_ms), "ms")
        report.record("enqueue", "enqueue/produce p50", round(enq["p50"] / prod["p50"], 2), "x")
        report.record("enqueue", "enqueue/produce p99", round(enq["p99"] / prod["p99"], 2), "x")
        report.record("enqueue", "broker CPU during the samples", cpu.shares()["broker"], "cores")
        report.target("enqueue", "enqueue p99 ms after COMMIT", after["p99"], "<=", 50.0)
    finally:
        stop.set()
        puller.join(5)
        client.close()
        engine.dispose()
        raw.truncate(cluster.db_url)


def _wait_for(received: dict[int, float], msg_id: int, timeout: float = 30.0) -> float:
    deadline = time.monotonic() + timeout
    while msg_id not in received:
        if time.monotonic() > deadline:
            raise TimeoutError(f"message {msg_id} was not delivered within {timeout:.0f} s")
        time.sleep(0.0005)
    return received[msg_id]
