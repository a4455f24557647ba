"""Prometheus metrics of a worker, and the HTTP endpoint every tidemq process serves them on.

Workers measure what only they see: how late a handler starts after its message's effect_time,
how long it runs, and what came of it. The broker's own metrics are in ``tidemq_broker.metrics``
and the console's in ``tidemq_admin.metrics``; all register in prometheus_client's default
registry, which also holds its process and platform collectors (CPU, memory, open files).

Labels are bounded: ``topic`` (topics are declared by operators and code, never derived from
data) and ``outcome``; never a message id. prometheus_client is the ``metrics`` extra: without
it the metrics below do nothing, and asking for an endpoint is a configuration error.
"""

from __future__ import annotations

import contextlib
import logging
import time
from datetime import datetime
from typing import Any, Optional

from .clock import to_epoch_ms
from .config import Settings
from .errors import ConfigurationError
from .lifecycle import HandlerOutcome

__all__ = ["HANDLER_SECONDS", "LATENESS_SECONDS", "MESSAGES_FAILED", "MESSAGES_RETRIED", "MESSAGES_SUCCEEDED",
           "child", "handler_started", "handler_finished", "serve_metrics", "AVAILABLE"]

log = logging.getLogger(__name__)

try:
    import prometheus_client
except ModuleNotFoundError:  # the base install: metrics are no-ops
    prometheus_client = None  # type: ignore[assignment]

AVAILABLE = prometheus_client is not None

#: Seconds from effect_time to handler start: tidemq's delays are precise to milliseconds, and a
#: backlog makes them minutes or hours late, so the buckets span both.
LATENESS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 7.5, 10.0,
                    15.0, 20.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0)
#: Seconds a handler runs: from a no-op to the longest ttr a lease allows with heartbeats.
HANDLER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                   60.0, 300.0, 1800.0)


class _Noop:
    """Stands in for a metric when prometheus_client is not installed."""

    def labels(self, *args: Any, **kwargs: Any) -> "_Noop":
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass

    def set(self, value: float) -> None:
        pass

    def time(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
    """A Counter in the default registry (``name`` without ``_total``), or a no-op."""
    return prometheus_client.Counter(name, doc, labels) if AVAILABLE else _Noop()


def histogram(name: str, doc: str, buckets: tuple[float, ...], labels: tuple[str, ...] = ()) -> Any:
    """A Histogram in the default registry, or a no-op."""
    return prometheus_client.Histogram(name, doc, labels, buckets=buckets) if AVAILABLE else _Noop()


def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
    """A Gauge in the default registry, or a no-op."""
    return prometheus_client.Gauge(name, doc, labels) if AVAILABLE else _Noop()


_children: dict[tuple[Any, tuple[str, ...]], Any] = {}


def child(metric: Any, *labels: str) -> Any:
    """``metric.labels(*labels)``, kept for the next call: prometheus_client checks the values
    and takes a lock on every ``labels()``, which was a tenth of a worker's Python per message.
    The label values are bounded (topics and outcomes), and so is what is kept."""
    key = (metric, labels)
    found = _children.get(key)
    if found is None:
        found = _children[key] = metric.labels(*labels)
    return found


MESSAGES_SUCCEEDED = counter("tidemq_messages_succeeded", "Handlers that returned (the message goes to SUCCESS), "
                             "counted by the worker when the handler ends.", ("topic",))
MESSAGES_RETRIED = counter("tidemq_messages_retried", "Handlers that raised while the message had retries left "
                           "(it goes back to NEW after its backoff).", ("topic",))
MESSAGES_FAILED = counter("tidemq_messages_failed", "Handlers that raised on the message's last attempt (it goes "
                          "to FAIL, the dead letters).", ("topic",))
MESSAGES_CANCELLED = counter("tidemq_messages_cancelled", "Handlers that stopped after their message's cancel was "
                             "requested (it goes to CANCELLED).", ("topic",))
PROGRESS_RATIO = gauge("tidemq_progress_ratio", "The latest progress (done / total) a running handler of the topic "
                       "reported, on this worker.", ("topic",))
_COUNTERS = {HandlerOutcome.SUCCESS: MESSAGES_SUCCEEDED, HandlerOutcome.RETRY: MESSAGES_RETRIED,
             HandlerOutcome.FAIL: MESSAGES_FAILED, HandlerOutcome.CANCELLED: MESSAGES_CANCELLED}
HANDLER_SECONDS = histogram("tidemq_handler_duration_seconds", "Seconds a handler ran, by outcome "
                            "(success or failure).", HANDLER_BUCKETS, ("topic", "outcome"))
LATENESS_SECONDS = histogram("tidemq_lateness_seconds", "Seconds from a message's effect_time to the start of its "
                             "handler, measured by the worker's clock (negative would mean early).",
                             LATENESS_BUCKETS, ("topic",))


def handler_started(topic: str, effect_time: datetime) -> float:
    """Record how late a handler of ``topic`` starts (``effect_time`` aware, or naive UTC);
    return a start mark for ``handler_finished``."""
    # time.time() and the effect time's own epoch seconds: datetime.now(timezone.utc) cost
    # several times as much, once per message.
    due = effect_time.timestamp() if effect_time.tzinfo is not None else to_epoch_ms(effect_time) / 1000
    child(LATENESS_SECONDS, topic).observe(time.time() - due)
    return time.perf_counter()


def progress_reported(topic: str, done: float, total: Optional[float]) -> None:
    """Record a handler's progress report as its topic's latest progress ratio."""
    if total:
        child(PROGRESS_RATIO, topic).set(done / total)


def handler_finished(topic: str, started: float, outcome: HandlerOutcome) -> None:
    """Record a handler's duration and its outcome (decided by the runner, see
    :func:`tidemq.lifecycle.handler_outcome`)."""
    success = outcome is HandlerOutcome.SUCCESS
    child(HANDLER_SECONDS, topic, "success" if success else "failure").observe(time.perf_counter() - started)
    child(_COUNTERS[outcome], topic).inc()


def serve_metrics(settings: Settings, what: str) -> Optional[Any]:
    """Serve the default registry on ``settings.metrics_host:metrics_port`` (a daemon thread) when
    the port is set; return the server (``.shutdown()``), or None when metrics are off."""
    if not settings.metrics_port:
        return None
    if not AVAILABLE:
        raise ConfigurationError("TIDEMQ_METRICS_PORT (--metrics-port) needs prometheus_client: "
                                 "pip install 'tidemq[metrics]'")
    try:
        server, _ = prometheus_client.start_http_server(settings.metrics_port, settings.metrics_host)
    except OSError as exc:
        raise ConfigurationError(f"TIDEMQ_METRICS_PORT: cannot listen on {settings.metrics_host}:"
                                 f"{settings.metrics_port}: {exc.strerror}") from None
    log.info("%s metrics on http://%s:%d/metrics", what, settings.metrics_host, settings.metrics_port)
    return server
