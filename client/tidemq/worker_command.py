"""What ``tidemq worker`` and ``manage.py tidemq_worker`` share: their options and how they run.

Both commands take the same flags, import the modules that declare consumers, serve metrics,
export traces where the ``OTEL_*`` variables say, and run a :class:`~tidemq.worker.Worker` until
SIGTERM/SIGINT (or ``--max-idle``). The command line adds its global flags and reads the
environment; Django's command reads ``settings.TIDEMQ`` and finds ``consumers.py`` in installed
apps. Neither copies the other: this module is the one implementation, in the client package so
that both (the CLI above it, ``tidemq.contrib.django`` inside it) may import it.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Any, Iterable, Optional, Sequence

from . import heap, tracing_env
from .client import Client
from .config import Settings
from .consumer import ConsumerSpec
from .metrics import serve_metrics
from .worker import Worker

__all__ = ["add_worker_options", "run_worker"]

log = logging.getLogger(__name__)


def add_worker_options(parser: Any) -> None:
    """Add the worker's flags to ``parser`` (an argparse parser, Django's command parser included)."""
    parser.add_argument("--drain-timeout", type=float, default=30.0, help="seconds to let handlers finish on SIGTERM")
    parser.add_argument("--concurrency", type=int,
                        help="async def handlers running at once per consumer that sets none (default 16)")
    parser.add_argument("--max-idle", type=_positive_seconds, metavar="SECONDS",
                        help="exit (status 0, after a drain) once no message has been held for this long: "
                             "for process managers that start workers on backlog and let idle ones go")
    parser.add_argument("--metrics-port", type=int,
                        help="serve Prometheus metrics on this HTTP port (TIDEMQ_METRICS_PORT; 0: none)")


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--max-idle takes seconds (a number), got {text!r}") from None
    if not 0 < value <= 7 * 24 * 3600:
        raise argparse.ArgumentTypeError(f"--max-idle must be more than 0 and at most 604800 seconds (a week), "
                                         f"got {text}")
    return value


def run_worker(settings: Settings, modules: Iterable[str] = (), *, drain_timeout: float = 30.0,
               concurrency: Optional[int] = None, max_idle: Optional[float] = None,
               service_name: str = "tidemq-worker", specs: Optional[Sequence[ConsumerSpec]] = None) -> int:
    """Import ``modules`` (their ``@mq_consumer`` declarations register), then run every declared
    consumer until SIGTERM/SIGINT or ``max_idle`` seconds without work; return the exit status.

    ``settings.metrics_port`` serves metrics; ``OTEL_*`` variables configure span export
    (``service_name`` unless ``OTEL_SERVICE_NAME`` names another). ``specs``: the consumers to
    run, when not every registered one as declared (Django's command wraps their handlers).
    """
    serve_metrics(settings, "worker")
    sys.path.insert(0, ".")
    for module in modules:
        importlib.import_module(module)
    # After the imports: a provider one of the modules installed is kept (tracing_env says so).
    provider = tracing_env.configure(settings, service_name)
    try:
        worker = Worker(specs, client=Client(settings), drain_timeout=drain_timeout, concurrency=concurrency,
                        max_idle=max_idle)
        # Every module is imported and the client built: that is most of what the process will
        # ever hold, and none of it garbage (tidemq.heap).
        heap.settle(settings.gc)
        worker.run()
        return 0
    finally:
        tracing_env.shutdown(provider)
