"""Log lines as text or as one JSON object per line (``TIDEMQ_LOG_FORMAT=json``).

A JSON line holds ``time`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger`` and
``message``, then ``message_id``, ``topic`` and ``trace_id`` when the line is about a message:
given with ``extra={"tidemq_message_id": ..., "tidemq_topic": ...}``, or set for a whole
block with :func:`message_context` (the worker sets it around each handler run, so a
handler's own log lines carry them too). ``trace_id`` is the current OpenTelemetry span's,
else the one the message was produced under.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from datetime import datetime, timezone
from typing import Iterator, Optional, Sequence

from . import tracing

__all__ = ["LOG_FORMATS", "JsonFormatter", "message_context", "configure_logging", "TEXT_FORMAT"]

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_OURS = "_tidemq_handler"
#: (message id, topic, W3C traceparent) of the message the current thread works on, if any.
_CURRENT: contextvars.ContextVar[Optional[tuple[int, str, str]]] = contextvars.ContextVar(
    "tidemq_message", default=None)


@contextlib.contextmanager
def message_context(msg_id: int, topic: str, traceparent: str = "") -> Iterator[None]:
    """Log lines made inside the block (in this thread) name message ``msg_id`` of ``topic``
    and the trace of ``traceparent`` (the message's ``trace_context``), parsed only if a line
    is written."""
    token = _CURRENT.set((msg_id, topic, traceparent))
    try:
        yield
    finally:
        _CURRENT.reset(token)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines inside values are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(timespec="milliseconds")
                    .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        current = _CURRENT.get()
        msg_id = getattr(record, "tidemq_message_id", None)
        topic = getattr(record, "tidemq_topic", None)
        if current is not None:
            msg_id = current[0] if msg_id is None else msg_id
            topic = current[1] if topic is None else topic
        if msg_id is not None:
            line["message_id"] = msg_id
        if topic is not None:
            line["topic"] = topic
        trace_id = tracing.current_trace_id() or (tracing.trace_id_of(current[2]) if current is not None else "")
        if trace_id:
            line["trace_id"] = trace_id
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def configure_logging(fmt: str = "text", level: int = logging.INFO, quiet: Sequence[str] = ("kazoo",)) -> None:
    """Send the root logger's records to stderr as ``fmt`` ("text" or "json"); the loggers named
    in ``quiet`` log warnings and above only. Called again, it replaces the handler it added;
    like ``logging.basicConfig``, it adds none where the root logger has handlers of others
    (an application's, a test runner's)."""
    root = logging.getLogger()
    ours = [h for h in root.handlers if getattr(h, _OURS, False)]
    if len(ours) == len(root.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
        setattr(handler, _OURS, True)
        for old in ours:
            root.removeHandler(old)
        root.addHandler(handler)
        root.setLevel(level)
    for name in quiet:
        logging.getLogger(name).setLevel(logging.WARNING)
