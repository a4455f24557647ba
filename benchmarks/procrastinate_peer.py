"""The procrastinate peer: PostgreSQL (fsync on), procrastinate's schema applied as its docs say.

Workers are ``procrastinate worker`` (``python -m procrastinate``) on the quick start's app
(``benchmarks.procrastinate_tasks``): its defaults (concurrency 1, LISTEN/NOTIFY, a poll every
5 s, INFO logs), then ``--concurrency`` as the tuned variant. The benchmark defers from threads
through one app opened synchronously, as its docs show for synchronous code (its connector's
psycopg pool, default size); ``batch_defer`` sends a batch in one call. Jobs stay in
``procrastinate_jobs`` with their status; ``procrastinate_events`` keeps the time of each change.
"""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from typing import Callable

from .env import Cluster
from .pg_peer import BODY, BatchSender, DelaySender, PgPeer, Sender
from .postgres_server import PostgreSQL

__all__ = ["ProcrastinatePeer"]


class ProcrastinatePeer(PgPeer):
    """procrastinate; ``variants``: its defaults, then ``--concurrency`` ``concurrency``."""

    name = "procrastinate"
    ready_text = "Starting worker on"

    def __init__(self, pg: PostgreSQL, cluster: Cluster, concurrency: int, progress: Callable[[str], None]) -> None:
        import procrastinate

        from . import procrastinate_tasks

        super().__init__(pg, cluster, progress)
        self.concurrency = concurrency
        self.variants = ["default", "tuned"]
        self.version = f"procrastinate {procrastinate.__version__}"
        self.app = procrastinate_tasks.make_app(pg.url)
        self.app.open()
        self.app.schema_manager.apply_schema()  # what `procrastinate schema --apply` does

    def describe(self, variant: str) -> str:
        if variant == "default":
            return "procrastinate worker, its defaults (concurrency 1, listen/notify, 5 s poll)"
        return f"procrastinate worker --concurrency {self.concurrency}"

    def command(self, i: int, variant: str) -> list[str]:
        cmd = [sys.executable, "-m", "procrastinate", "--app=benchmarks.procrastinate_tasks.app", "worker",
               f"--name=bench-{variant}-{i}"]
        return cmd + (["--concurrency", str(self.concurrency)] if variant == "tuned" else [])

    def sender(self, k: int) -> Sender:
        task = self.app.tasks["noop"]
        return (lambda i: task.defer(i=i, body=BODY)), (lambda: None)

    def batch_sender(self, k: int) -> BatchSender:
        task = self.app.tasks["noop"]
        return (lambda ids: task.batch_defer(*[{"i": i, "body": BODY} for i in ids])), (lambda: None)

    def delay_sender(self, k: int) -> DelaySender:
        task = self.app.tasks["late"]

        def send(due: float, ids: list[int]) -> None:
            when = datetime.fromtimestamp(due, tz=timezone.utc)
            task.configure(schedule_at=when).batch_defer(*[{"due": due} for _ in ids])

        return send, (lambda: None)

    def queued(self) -> int:
        return int(self.sql.execute("SELECT count(*) FROM procrastinate_jobs").fetchone()[0])

    def unfinished(self) -> int:
        return int(self.sql.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')").fetchone()[0])

    def span(self) -> tuple[int, float]:
        done, seconds = self.sql.execute(
            "SELECT count(*) FILTER (WHERE type = 'succeeded'),"
            " EXTRACT(EPOCH FROM max(at) FILTER (WHERE type = 'succeeded') - min(at) FILTER (WHERE type = 'started'))"
            " FROM procrastinate_events").fetchone()
        return int(done), float(seconds or 0.0)

    def truncate(self) -> None:
        self.sql.execute("TRUNCATE procrastinate_events, procrastinate_jobs CASCADE")

    def close(self) -> None:
        self.app.close()
        super().close()
