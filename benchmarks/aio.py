"""aio: one message per ``produce()`` call, from N threads of the synchronous client (the
baseline) and from N coroutines of ``tidemq.aio`` on one event loop, through the same broker.

Both clients coalesce concurrent calls into shared Produce RPCs. Each (client, N) slice runs
``--aio-warmup`` seconds untimed, then counts the calls that end inside ``--aio-seconds``;
clients alternate over ``--rounds`` slices. Printed: msg/s and latency of each, the client
process's CPU per message, and the ratio async / sync.
"""

from __future__ import annotations

import asyncio
import threading
import time
from argparse import Namespace

from .env import Cluster
from .report import Report, summarize

__all__ = ["run"]

TOPIC = "bench.aio"
_BODY = "benchmark-payload-" + "x" * 24


def _sync_slice(client, callers: int, warmup: float, seconds: float) -> tuple[int, list[float], float]:
    stop = threading.Event()
    window: list[float] = []  # [start, end] once the warmup is over
    counted: list[list[float]] = [[] for _ in range(callers)]

    def run(k: int) -> None:
        i = 0
        while not stop.is_set():
            began = time.perf_counter()
            client.produce(TOPIC, {"i": i, "body": _BODY})
            ended = time.perf_counter()
            if window and window[0] <= began and ended <= window[1]:
                counted[k].append((ended - began) * 1000)
            i += 1

    threads = [threading.Thread(target=run, args=(k,)) for k in range(callers)]
    for t in threads:
        t.start()
    time.sleep(warmup)  # untimed calls: channels, caches, the broker's pools
    cpu = time.process_time()
    now = time.perf_counter()
    window.extend([now, now + seconds])
    time.sleep(seconds)
    cpu = time.process_time() - cpu
    stop.set()
    for t in threads:
        t.join()
    latencies = [x for k in counted for x in k]
    return len(latencies), latencies, cpu


async def _async_slice(client, callers: int, warmup: float, seconds: float) -> tuple[int, list[float], float]:
    stop = asyncio.Event()
    window: list[float] = []
    latencies: list[float] = []

    async def run() -> None:
        i = 0
        while not stop.is_set():
            began = time.perf_counter()
            await client.produce(TOPIC, {"i": i, "body": _BODY})
            ended = time.perf_counter()
            if window and window[0] <= began and ended <= window[1]:
                latencies.append((ended - began) * 1000)
            i += 1

    tasks = [asyncio.create_task(run()) for _ in range(callers)]
    await asyncio.sleep(warmup)
    cpu = time.process_time()
    now = time.perf_counter()
    window.extend([now, now + seconds])
    await asyncio.sleep(seconds)
    cpu = time.process_time() - cpu
    stop.set()
    await asyncio.gather(*tasks)
    return len(latencies), latencies, cpu


def run(cluster: Cluster, report: Report, args: Namespace) -> None:
    from tidemq import Settings
    from tidemq.aio import AsyncClient

    sync_client = cluster.client()
    loop = asyncio.new_event_loop()
    async_client = loop.run_until_complete(_make(AsyncClient, Settings.from_env(env=cluster.settings_env)))
    per_slice = args.aio_seconds / args.rounds
    try:
        for callers in args.aio_callers:
            totals = {"sync": [0, [], 0.0], "async": [0, [], 0.0]}
            for round_ in range(args.rounds):
                order = ("sync", "async") if round_ % 2 == 0 else ("async", "sync")
                for system in order:
                    report.progress(f"aio: {system} client, {callers} callers, round {round_ + 1}/{args.rounds}")
                    if system == "sync":
                        done, lat, cpu = _sync_slice(sync_client, callers, args.aio_warmup, per_slice)
                    else:
                        done, lat, cpu = loop.run_until_complete(
                            _async_slice(async_client, callers, args.aio_warmup, per_slice))
                    totals[system][0] += done
                    totals[system][1] += lat
                    totals[system][2] += cpu
            rates = {}
            for system, (done, lat, cpu) in totals.items():
                label = "threads" if system == "sync" else "coroutines"
                rates[system] = report.record("aio", f"{system} produce(), {callers} {label}",
                                              round(done / args.aio_seconds, 1), "msg/s")
                report.record("aio", f"{system} latency, {callers} callers", summarize(lat), "ms")
                report.record("aio", f"{system} client CPU, {callers} callers",
                              round(cpu / max(done, 1) * 1e6, 1), "us/msg")
            report.record("aio", f"async / sync, {callers} callers",
                          round(rates["async"] / rates["sync"], 3) if rates["sync"] else float("nan"), "x")
    finally:
        loop.run_until_complete(async_client.close())
        loop.close()
        sync_client.close()


async def _make(cls, settings):
    client = cls(settings)
    # The first call waits for discovery and opens the channel (untimed).
    await client.produce(TOPIC, {"warm": True}, timeout=30)
    return client
