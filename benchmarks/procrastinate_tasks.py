"""The procrastinate peer's app: ``python -m procrastinate --app=benchmarks.procrastinate_tasks.app worker``.

Set up as procrastinate's quick start does: an ``App`` on a ``PsycopgConnector`` (to
``$BENCH_PG_URL``) and async tasks. ``noop`` does nothing (throughput); ``late`` records how
late it started against the due time it is given (unix seconds) through
``benchmarks.lateness_log``. ``make_app`` builds the same app on another database, for the
benchmark's own process.
"""

from __future__ import annotations

import os
import time

import procrastinate

from . import lateness_log


def make_app(conninfo: str) -> procrastinate.App:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))

    @app.task(name="noop")
    async def noop(i: int, body: str) -> None:
        """Nothing: the figure is procrastinate's own cost per job."""

    @app.task(name="late")
    async def late(due: float) -> None:
        lateness_log.note((time.time() - due) * 1000)

    return app


app = make_app(os.environ.get("BENCH_PG_URL", ""))
