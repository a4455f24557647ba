"""The PGQueuer peer's workers: ``python -m benchmarks.pgqueuer_tasks [--batch-size N]``.

What ``pgq run benchmarks.pgqueuer_tasks:create`` does, through the same supervisor
(``pgqueuer.run``, on uvloop when it is installed, as the CLI does): the CLI of pgqueuer 1.6.0
fails at start under typer 0.29 (its ``--log-level`` parser hands a str where an enum is read).
The factory is set up as PGQueuer's quick start does: one asyncpg connection (to ``$BENCH_PG_URL``), a
``PgQueuer`` on it, one async function per entrypoint. ``noop`` does nothing (throughput);
``late`` records how late it started against the due time in its payload (unix seconds, as
text) through ``benchmarks.lateness_log``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator

import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.models import Job

from . import lateness_log

READY = "bench: PGQueuer worker ready"


@asynccontextmanager
async def create() -> AsyncIterator[PgQueuer]:
    connection = await asyncpg.connect(os.environ["BENCH_PG_URL"])
    pgq = PgQueuer.from_asyncpg_connection(connection)

    @pgq.entrypoint("noop")
    async def noop(job: Job) -> None:
        """Nothing: the figure is PGQueuer's own cost per job."""

    @pgq.entrypoint("late")
    async def late(job: Job) -> None:
        lateness_log.note((time.time() - float(job.payload or b"0")) * 1000)

    print(READY, flush=True)
    try:
        yield pgq
    finally:
        await connection.close()


def main() -> None:
    import pgqueuer

    parser = argparse.ArgumentParser(description="run a PGQueuer worker on the benchmark's entrypoints")
    parser.add_argument("--batch-size", type=int, default=10, help="jobs per dequeue (PGQueuer's default: 10)")
    args = parser.parse_args()
    work = pgqueuer.run(create, batch_size=args.batch_size)
    try:
        import uvloop
    except ImportError:
        asyncio.run(work)
    else:
        uvloop.run(work)


if __name__ == "__main__":
    main()
