"""OpenTelemetry tracing, optional: every helper is a no-op when ``opentelemetry-api`` is missing.

A message carries the W3C ``traceparent`` of the span that produced it (``trace_context``):
the client injects it at produce, the broker stores it in the message's row and returns it
with every delivery, and the worker extracts it so each attempt's handler span is a child of
the producer's span, in whatever process and after however many retries. Spans follow the
OpenTelemetry messaging conventions where they fit: ``messaging.system`` is ``tidemq``,
``messaging.destination.name`` the topic, ``messaging.message.id`` the message id.

The API is imported on first use, never at import time, so tidemq runs without it (the
``otel`` extra installs it with the SDK). Without an SDK configured, the API's tracer makes
no spans at all (see ``_active``) and injects a context only when the caller has one.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import time
from typing import Any, ContextManager, Iterable, Iterator, Optional, Sequence

from .errors import quote

__all__ = ["available", "current_traceparent", "produce_span", "rpc_span", "commit_span", "record_lock",
           "handler_span", "start_process_span", "end_process_span", "use_span", "set_message_ids", "now_ns",
           "trace_id_of", "current_trace_id", "check_traceparent", "TRACEPARENT_MAX"]

SYSTEM = "tidemq"
MAX_LINKS = 128  # the SDK's default limit of links per span
TRACER_NAME = "tidemq"
TRACEPARENT_MAX = 255
# version-trace_id-parent_id-flags; a later version may append fields after another dash.
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}(-[0-9A-Za-z._-]*)?")
_UNSET = object()
_api: Any = _UNSET  # (trace module, propagate module) or None: looked up once
_recording = False  # a tracer provider other than the API's stand-ins was seen (see _active)
_provider_in_env = False  # OTEL_PYTHON_TRACER_PROVIDER was set when the API was looked up


def _otel() -> Optional[tuple[Any, Any]]:
    """The OpenTelemetry API modules, or None when they are not installed."""
    global _api, _provider_in_env
    if _api is _UNSET:
        try:
            _api = (importlib.import_module("opentelemetry.trace"), importlib.import_module("opentelemetry.propagate"))
            names = importlib.import_module("opentelemetry.environment_variables")
            _provider_in_env = names.OTEL_PYTHON_TRACER_PROVIDER in os.environ
        except ImportError:
            _api = None
    return _api


def available() -> bool:
    """True when the OpenTelemetry API is installed."""
    return _otel() is not None


def _active() -> Optional[tuple[Any, Any]]:
    """The API modules when a tracer provider is installed (an SDK's: spans are recorded), else
    None: then tidemq makes no spans at all, which would cost a handler run about a fifth of
    its time and record nothing."""
    global _recording
    if _recording:
        return _api
    api = _otel()
    if api is None:
        return None
    # Until a provider is set, the API's get_tracer_provider() looks for one named in the
    # environment on every call: a tenth of a worker's Python per message, asked once per message
    # and per call. Its global (None until then) answers first; an API without that global
    # takes the public path every time.
    if getattr(api[0], "_TRACER_PROVIDER", _UNSET) is None and not _provider_in_env:
        return None
    provider = api[0].get_tracer_provider()
    if isinstance(provider, (api[0].ProxyTracerProvider, api[0].NoOpTracerProvider)):
        return None
    # The API sets its global provider once per process: once seen, it stays.
    _recording = True
    return api


def check_traceparent(value: str) -> str:
    """``value`` if it is a W3C traceparent of at most TRACEPARENT_MAX characters, else ValueError."""
    if value and (len(value) > TRACEPARENT_MAX or not _TRACEPARENT.fullmatch(value)):
        raise ValueError(f"trace_context must be a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>), "
                         f"at most {TRACEPARENT_MAX} characters, got {quote(value)}")
    return value


def trace_id_of(traceparent: str) -> str:
    """The 32-hex trace id inside a traceparent ("" for none)."""
    match = _TRACEPARENT.fullmatch(traceparent or "")
    return match.group(1) if match else ""


def current_traceparent() -> str:
    """The W3C traceparent of the current span ("" when there is none or no OpenTelemetry)."""
    api = _otel()
    if api is None or not api[0].get_current_span().get_span_context().is_valid:
        return ""
    carrier: dict[str, str] = {}
    api[1].inject(carrier)
    return carrier.get("traceparent", "")


def current_trace_id() -> str:
    """The current span's trace id as 32 hex characters ("" when there is none)."""
    api = _otel()
    if api is None:
        return ""
    context = api[0].get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else ""


def _context(traceparent: str) -> Any:
    """An OpenTelemetry Context holding the remote span of ``traceparent`` (None for none)."""
    api = _otel()
    if api is None or not traceparent:
        return None
    return api[1].extract({"traceparent": traceparent})


def _add_links(span: Any, traceparents: Iterable[str]) -> None:
    """Link ``span`` to each distinct producer span (at most MAX_LINKS), when it is recorded:
    a span nobody records costs no parsing."""
    api = _otel()
    if api is None or span is None or not span.is_recording():
        return
    seen: set[str] = set()
    for value in traceparents:
        if value and value not in seen:
            seen.add(value)
            context = api[0].get_current_span(_context(value)).get_span_context()
            if context.is_valid:
                span.add_link(context)
            if len(seen) >= MAX_LINKS:
                return


def _parent(traceparents: Sequence[str]) -> Any:
    """A span over messages of one trace context is its child; over several, a span of the
    ambient context with a link to each (the messaging conventions' batch rule)."""
    distinct = {value for value in traceparents if value}
    return _context(next(iter(distinct))) if len(distinct) == 1 else None


def _attributes(topic: str, operation: str, **extra: Any) -> dict[str, Any]:
    values = {"messaging.system": SYSTEM, "messaging.destination.name": topic, "messaging.operation.type": operation}
    values.update({key: value for key, value in extra.items() if value is not None})
    return values


#: What a span function returns while no provider is installed: it enters as None, builds
#: nothing, and (stateless) serves every thread at once. A generator's context manager made
#: just to yield None cost each message and call a few microseconds more.
_NO_SPAN: ContextManager[Any] = contextlib.nullcontext()


@contextlib.contextmanager
def _span(api: tuple[Any, Any], name: str, kind: str, attributes: dict[str, Any],
          context: Any = None, links: Iterable[str] = ()) -> Iterator[Any]:
    """A current span, linked to the producer spans of ``links``; exceptions are recorded on it
    and raised on. ``api``: what ``_active()`` returned; each caller asks it first, so that
    without a provider it builds nothing at all."""
    tracer = api[0].get_tracer(TRACER_NAME)
    with tracer.start_as_current_span(name, context=context, kind=getattr(api[0].SpanKind, kind),
                                      attributes=attributes) as span:
        _add_links(span, links)
        yield span


def produce_span(topic: str, count: int) -> ContextManager[Any]:
    """The producer's span around one produce call (a child of the caller's current span).
    :func:`current_traceparent` inside it names this span, which handlers then join."""
    api = _active()
    if api is None:
        return _NO_SPAN
    return _span(api, f"send {topic}", "PRODUCER",
                 _attributes(topic, "send", **{"messaging.operation.name": "send",
                                               "messaging.batch.message_count": count if count > 1 else None}))


def set_message_ids(span: Any, ids: Sequence[int]) -> None:
    """Name the message a produce span stored (a single message's id only: ids are unbounded)."""
    if span is not None and len(ids) == 1:
        span.set_attribute("messaging.message.id", str(ids[0]))


def rpc_span(method: str, topics: Iterable[str], traceparents: Iterable[str]) -> ContextManager[Any]:
    """The broker's span of one Produce RPC: a child of its messages' producer span. The
    iterables are read only when spans are made."""
    api = _active()
    if api is None:
        return _NO_SPAN
    topics, traceparents = list(topics), list(traceparents)
    parent = _parent(traceparents)
    attributes = {"rpc.system": "grpc", "rpc.service": "tidemq.v1.Broker", "rpc.method": method,
                  "messaging.system": SYSTEM, "messaging.batch.message_count": len(traceparents)}
    if len(set(topics)) == 1:
        attributes["messaging.destination.name"] = topics[0]
    return _span(api, f"tidemq.v1.Broker/{method}", "SERVER", attributes, parent,
                 links=traceparents if parent is None else ())


def commit_span(rows: int, requests: int, traceparents: Iterable[str]) -> ContextManager[Any]:
    """The group commit: one transaction for the rows of several Produce RPCs. It runs in one
    of their threads (a child of that RPC's span) and links every message's producer span
    (``traceparents`` is read only when the span is recorded)."""
    api = _active()
    if api is None:
        return _NO_SPAN
    attributes = {"messaging.system": SYSTEM, "messaging.batch.message_count": rows,
                  "tidemq.commit.requests": requests, "db.operation.name": "INSERT"}
    return _span(api, "tidemq group commit", "INTERNAL", attributes, links=traceparents)


def record_lock(topic: str, start_ns: int, ids: Iterable[int], traceparents: Iterable[str]) -> None:
    """Record the broker's lock of leased messages as a span from ``start_ns`` to now.

    Made after the fact, so a long-poll's empty tries leave no spans. One message (or one
    trace): a child of its producer's span; a batch of several: links to each.
    """
    api = _active()
    if api is None:
        return
    ids, traceparents = list(ids), list(traceparents)
    if not ids:
        return
    parent = _parent(traceparents)
    attributes = _attributes(topic, "receive", **{
        "messaging.operation.name": "lock", "messaging.batch.message_count": len(ids) if len(ids) > 1 else None,
        "messaging.message.id": str(ids[0]) if len(ids) == 1 else None})
    span = api[0].get_tracer(TRACER_NAME).start_span(f"lock {topic}", context=parent, kind=api[0].SpanKind.SERVER,
                                                     attributes=attributes, start_time=start_ns)
    if parent is None:
        _add_links(span, traceparents)
    span.end()


def now_ns() -> int:
    """Wall-clock nanoseconds, as span times are given."""
    return time.time_ns()


def handler_span(topic: str, msg_id: int, attempt: int, traceparent: str) -> ContextManager[Any]:
    """The span of one handler run, a child of the producer's span (``traceparent``). A handler's
    exception is recorded on it (status ERROR) and raised on."""
    api = _active()
    if api is None:
        return _NO_SPAN
    return _span(api, f"process {topic}", "CONSUMER", _process_attributes(topic, msg_id, attempt),
                 _context(traceparent))


def _process_attributes(topic: str, msg_id: int, attempt: int) -> dict[str, Any]:
    return _attributes(topic, "process", **{"messaging.operation.name": "process", "messaging.message.id": str(msg_id),
                                            "tidemq.message.attempt": attempt})


def start_process_span(topic: str, msg_id: int, attempt: int, traceparent: str) -> Any:
    """The ``process <topic>`` span of a message handed to code that is not a handler of ours
    (a BatchConsumer's batch): started now, a child of the producer's span, not made current;
    :func:`end_process_span` ends it with the outcome. None when no spans are made."""
    api = _active()
    if api is None:
        return None
    return api[0].get_tracer(TRACER_NAME).start_span(f"process {topic}", context=_context(traceparent),
                                                     kind=api[0].SpanKind.CONSUMER,
                                                     attributes=_process_attributes(topic, msg_id, attempt))


def end_process_span(span: Any, error: Optional[str] = None, outcome: str = "applied") -> None:
    """End a span of :func:`start_process_span`: status ERROR with ``error`` for a failure, and
    the ack's ``outcome`` (``applied``; ``stale`` when the lease was lost; ``abandoned``)."""
    if span is None:
        return
    api = _otel()
    span.set_attribute("tidemq.ack.outcome", outcome)
    if error is not None and api is not None:
        span.set_status(api[0].Status(api[0].StatusCode.ERROR, error))
    span.end()


@contextlib.contextmanager
def use_span(span: Any) -> Iterator[Any]:
    """Make ``span`` current for the block (spans made inside are its children), without ending
    it; an exception is recorded on it. Does nothing for None."""
    api = _otel()
    if span is None or api is None:
        yield span
        return
    with api[0].use_span(span, end_on_exit=False, record_exception=True, set_status_on_exception=True):
        yield span
