"""The PGQueuer peer: PostgreSQL (fsync on), tables installed with PGQueuer's default durability.

Workers run the quick start's factory (``benchmarks.pgqueuer_tasks``) as ``pgq run`` does: one
asyncpg connection each, batches of 10 (its default), then ``--batch-size`` as the tuned variant.
The benchmark publishes from threads as PGQueuer's docs show for synchronous code: a psycopg
connection in autocommit mode per thread, ``SyncQueries`` on it; ``enqueue`` takes lists, so a
batch is one call (one INSERT). Finished jobs are deleted from ``pgqueuer`` and logged in
``pgqueuer_log`` with the time of each status change.
"""

from __future__ import annotations

import asyncio
import sys
import time
from datetime import timedelta
from typing import Callable

from .env import Cluster
from .pg_peer import BatchSender, DelaySender, PgPeer, Sender
from .pgqueuer_tasks import READY
from .postgres_server import PostgreSQL
from .raw import payload

__all__ = ["PGQueuerPeer"]


class PGQueuerPeer(PgPeer):
    """PGQueuer; ``variants``: its defaults, then ``--batch-size`` ``batch``."""

    name = "PGQueuer"
    ready_text = READY

    def __init__(self, pg: PostgreSQL, cluster: Cluster, batch: int, progress: Callable[[str], None]) -> None:
        import pgqueuer

        super().__init__(pg, cluster, progress)
        self.batch = batch
        self.variants = ["default", "tuned"]
        self.version = f"pgqueuer {pgqueuer.__version__}"
        asyncio.run(self._install())

    async def _install(self) -> None:
        import asyncpg
        from pgqueuer import Queries

        conn = await asyncpg.connect(self.pg.url)
        try:
            await Queries.from_asyncpg_connection(conn).install()  # what `pgq install` does: durable tables
        finally:
            await conn.close()

    def describe(self, variant: str) -> str:
        if variant == "default":
            return "pgq run, its defaults (batch 10, one asyncpg connection per worker)"
        return f"pgq run --batch-size {self.batch}"

    def command(self, i: int, variant: str) -> list[str]:
        cmd = [sys.executable, "-m", "benchmarks.pgqueuer_tasks"]
        return cmd + (["--batch-size", str(self.batch)] if variant == "tuned" else [])

    def _queries(self):
        import psycopg
        from pgqueuer.db import SyncPsycopgDriver
        from pgqueuer.queries import SyncQueries

        conn = psycopg.connect(self.pg.url, autocommit=True)
        return SyncQueries(SyncPsycopgDriver(conn)), conn.close

    def sender(self, k: int) -> Sender:
        q, close = self._queries()
        return (lambda i: q.enqueue("noop", payload(i).encode())), close

    def batch_sender(self, k: int) -> BatchSender:
        q, close = self._queries()

        def send(ids: list[int]) -> None:
            q.enqueue(["noop"] * len(ids), [payload(i).encode() for i in ids], [0] * len(ids))

        return send, close

    def delay_sender(self, k: int) -> DelaySender:
        q, close = self._queries()

        def send(due: float, ids: list[int]) -> None:
            # execute_after is relative to the database's clock at the INSERT; the call's own
            # latency makes a job due that much after ``due``, never before it.
            after = timedelta(seconds=max(0.0, due - time.time()))
            q.enqueue(["late"] * len(ids), [repr(due).encode()] * len(ids), [0] * len(ids),
                      execute_after=[after] * len(ids))

        return send, close

    def queued(self) -> int:
        return int(self.sql.execute("SELECT count(*) FROM pgqueuer").fetchone()[0])

    def unfinished(self) -> int:
        return self.queued()  # a finished job is deleted from the queue table

    def span(self) -> tuple[int, float]:
        done, seconds = self.sql.execute(
            "SELECT count(*) FILTER (WHERE status = 'successful'),"
            " EXTRACT(EPOCH FROM max(created) FILTER (WHERE status = 'successful')"
            " - min(created) FILTER (WHERE status = 'picked'))"
            " FROM pgqueuer_log WHERE entrypoint = 'noop'").fetchone()
        return int(done), float(seconds or 0.0)

    def truncate(self) -> None:
        self.sql.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")
