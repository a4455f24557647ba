"""What the durable peers on PostgreSQL share: their workers' start and stop, and the batch
produce, consume and delay workloads. A peer says how to send one job, a batch and delayed jobs,
how to start a worker, and how to read from its own tables what has run.

Consume is timed as tidemq's is, from the times the peer itself stored: first job started to
last job finished (PGQueuer's ``pgqueuer_log``, procrastinate's ``procrastinate_events``), so no
worker start-up is in it; a measurement ends when the queue is drained or after ``budget``
seconds, and the rate is jobs finished over that stored span. Delayed jobs record how late they
started (now - due time, ms) through ``benchmarks.lateness_log``.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

from .env import Cluster, Proc, stop_all, wait_until
from .lateness_log import LatenessFiles
from .postgres_server import PostgreSQL

__all__ = ["PgPeer", "Sender", "BatchSender", "BODY"]

Sender = tuple[Callable[[int], None], Callable[[], None]]  # send(i), close()
BatchSender = tuple[Callable[[list[int]], None], Callable[[], None]]  # send(ids), close()
DelaySender = tuple[Callable[[float, list[int]], None], Callable[[], None]]  # send(due unix time, ids), close()
BODY = "benchmark-payload-" + "x" * 24  # raw.payload's body: every system gets the same data


class PgPeer:
    """A job queue on PostgreSQL measured beside tidemq. ``variants`` are worker configurations;
    the first is the peer's default, the one the targets are judged on."""

    name = ""
    ready_text = ""  # what a worker's log says once it takes jobs
    variants: list[str] = []

    def __init__(self, pg: PostgreSQL, cluster: Cluster, progress: Callable[[str], None]) -> None:
        import psycopg

        self.pg, self.cluster, self.progress = pg, cluster, progress
        self.sql = psycopg.connect(pg.url, autocommit=True)  # the benchmark's own reads and truncates
        self.version = ""

    # -- what each peer says -----------------------------------------------------------------
    def describe(self, variant: str) -> str:
        raise NotImplementedError

    def command(self, i: int, variant: str) -> list[str]:
        """The command line of worker ``i`` of ``variant``."""
        raise NotImplementedError

    def sender(self, k: int) -> Sender:
        """For thread ``k``: publish one no-op job per call, as an application would."""
        raise NotImplementedError

    def batch_sender(self, k: int) -> BatchSender:
        """For thread ``k``: publish one no-op job per id in one call."""
        raise NotImplementedError

    def delay_sender(self, k: int) -> DelaySender:
        """For thread ``k``: publish jobs due at one unix time that record their lateness."""
        raise NotImplementedError

    def queued(self) -> int:
        """Jobs in the peer's queue table (run or not)."""
        raise NotImplementedError

    def unfinished(self) -> int:
        """Jobs not finished yet."""
        raise NotImplementedError

    def span(self) -> tuple[int, float]:
        """(jobs finished, seconds from the first job started to the last finished), stored times."""
        raise NotImplementedError

    def truncate(self) -> None:
        """Empty the peer's tables."""
        raise NotImplementedError

    def close(self) -> None:
        self.sql.close()

    # -- the workloads -----------------------------------------------------------------------
    def workers(self, count: int, variant: str, env: dict[str, str] | None = None) -> list[Proc]:
        """``count`` workers of ``variant``, started and taking jobs."""
        slug = self.name.lower()
        procs = [Proc(f"{slug}-{variant}-{i}", self.command(i, variant), {"BENCH_PG_URL": self.pg.url, **(env or {})},
                      self.cluster.dir) for i in range(count)]
        starts = {p.log_path: os.path.getsize(p.log_path) for p in procs}  # logs are appended across runs

        def ready() -> bool:
            for proc in procs:
                proc.check_alive()
            return all(self.ready_text in _tail(p.log_path, starts[p.log_path]) for p in procs)

        try:
            wait_until(ready, 90, 0.1, f"{count} {self.name} workers")
        except BaseException:
            stop_all(procs)
            raise
        return procs

    def produce_batched(self, n: int, threads: int, batch: int) -> float:
        """Jobs published per second in calls of ``batch`` from ``threads`` threads (connections
        made before the clock starts)."""
        per_thread = n // threads // batch * batch
        calls = [[list(range(k * per_thread + s, k * per_thread + s + batch)) for s in range(0, per_thread, batch)]
                 for k in range(threads)]
        seconds = _run(threads, self.batch_sender, lambda send, k: [send(ids) for ids in calls[k]])
        return per_thread * threads / seconds

    def load(self, n: int) -> None:
        """Put ``n`` no-op jobs in the queue, untimed (calls of 1,000 from 4 threads)."""
        self.progress(f"{self.name}: loading {n:,} jobs")
        threads = 4 if n >= 4000 else 1
        batch = min(1000, max(1, n // threads))
        per_thread = n // threads // batch * batch
        self.produce_batched(n, threads, batch)
        rest = n - per_thread * threads
        if rest:
            send, close = self.batch_sender(0)
            try:
                send(list(range(n - rest, n)))
            finally:
                close()

    def consume(self, n: int, workers: int, variant: str, budget: float) -> tuple[float, int]:
        """(no-op jobs run per second, jobs run) by ``workers`` workers of ``variant``, over ``n``
        jobs or ``budget`` seconds, whichever ends first."""
        self.truncate()
        self.load(n)
        procs = self.workers(workers, variant)
        try:
            began = time.monotonic()
            while True:
                left = self.unfinished()
                if left == 0 or time.monotonic() - began > budget:
                    break
                self.progress(f"{self.name} ({variant}): {workers} workers, {n - left:,}/{n:,} run")
                for proc in procs:
                    proc.check_alive()
                time.sleep(0.25)
            done, seconds = self.span()
        finally:
            stop_all(procs)
            self.truncate()
        return (done / seconds if seconds > 0 else 0.0), done

    def delay(self, due: int, window: float, workers: int, per_call: int = 10) -> tuple[list[float], int]:
        """(lateness in ms of ``due`` jobs due over ``window`` s, how many had not run in time),
        published in calls of ``per_call`` sharing a due time from 4 threads (tidemq's delay
        load), run by ``workers`` workers of the peer's default configuration. Jobs still not
        run 120 s after the last was due count as late as the last one due would be then: a lower
        bound, so a peer that falls behind gets no better figures than one that keeps up."""
        self.truncate()
        prefix = os.path.join(self.cluster.dir, f"{self.name.lower()}-lateness-{time.monotonic_ns()}")
        procs = self.workers(workers, self.variants[0], {"BENCH_LATENESS_FILE": prefix})
        try:
            first = time.time() + 3.0 + due / 4000
            calls = [list(range(k, min(k + per_call, due))) for k in range(0, due, per_call)]

            def publish(send: Callable[[float, list[int]], None], k: int) -> None:
                for ids in calls[k::4]:
                    send(first + window * ids[0] / max(due, 1), ids)

            self.progress(f"{self.name}: publishing {due:,} delayed jobs")
            _run(4, self.delay_sender, publish)
            marks = LatenessFiles(prefix)
            last = first + window
            while True:
                values = marks.new()
                if len(values) >= due:
                    return values, 0
                self.progress(f"{self.name}: {len(values):,}/{due:,} delayed jobs run")
                if time.time() > last + 120:
                    missing = due - len(values)
                    return values + [(time.time() - last) * 1000] * missing, missing
                for proc in procs:
                    proc.check_alive()
                time.sleep(0.25)
        finally:
            stop_all(procs)
            self.truncate()


def _tail(path: str, start: int) -> str:
    with open(path, errors="replace") as fh:
        fh.seek(start)
        return fh.read()


def _run(threads: int, prepare: Callable[[int], tuple[Callable, Callable[[], None]]],
         work: Callable[[Any, int], Any]) -> float:
    """Seconds for ``threads`` threads to each run ``work(send, k)``; each makes its sender with
    ``prepare(k)`` before the clock starts."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads + 1)

    def run(k: int) -> None:
        close = None
        try:
            send, close = prepare(k)
            barrier.wait()
            work(send, k)
        except threading.BrokenBarrierError:
            pass
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
        finally:
            if close is not None:
                close()

    workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    began = time.perf_counter()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - began
