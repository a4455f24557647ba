"""Results and progress as stored: the JSON a handler's return value, its failure and its
progress become, shared by the worker, the handle, the stub broker and the broker.

A result is strict JSON (the encoder rules of message data: no NaN or Infinity) of at most
``TIDEMQ_MAX_RESULT_BYTES`` bytes (default :data:`tidemq.limits.DEFAULT_MAX_RESULT_BYTES`). A
failure is stored as ``{"type": "<module.QualName>", "message": "...", "traceback": "..."}``
with the traceback's last :data:`~tidemq.limits.MAX_ERROR_TRACEBACK` characters. Progress is
``{"done": x, "total": y or null, "note": "...", "at": <epoch ms>}`` within 1024 characters.
"""

from __future__ import annotations

import json
import math
import os
import traceback as tb
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional

from .errors import ConfigurationError, InvalidResultError, MalformedRequestError, RemoteError, ResultTooLargeError
from .lifecycle import FINAL_STATUSES, MessageStatus
from .limits import DEFAULT_MAX_RESULT_BYTES, MAX_ERROR_TRACEBACK, MAX_PROGRESS_NOTE
from .validation import parse_strict

__all__ = ["Progress", "MessageState", "max_result_bytes", "encode_result", "check_result_text", "error_result",
           "remote_error", "progress_text", "parse_progress", "PROGRESS_MAX_CHARS"]

#: The progress column's width.
PROGRESS_MAX_CHARS = 1024


@dataclass(frozen=True)
class Progress:
    """A running message's latest progress report: ``done`` of ``total`` (None: unknown), a
    short ``note``, and ``at``, when it was reported (milliseconds since the Unix epoch)."""

    done: float
    total: Optional[float]
    note: str
    at: int

    @property
    def ratio(self) -> Optional[float]:
        """done / total, or None without a (positive) total."""
        return self.done / self.total if self.total else None


@dataclass(frozen=True)
class MessageState:
    """What a broker answers about one message: whether it is stored (``found``), its status,
    its result (JSON text: the return value on SUCCESS, the error after a failure), its latest
    progress, when it is due and when it finished, and whether its cancel was requested."""

    id: int
    found: bool
    status: Optional[MessageStatus] = None
    result: Optional[str] = None
    progress: Optional[Progress] = None
    effect_time: Optional[datetime] = None
    finish_time: Optional[datetime] = None
    cancel_requested: bool = False

    @property
    def final(self) -> bool:
        """True once the message is SUCCESS, FAIL or CANCELLED (or not stored)."""
        return not self.found or self.status in FINAL_STATUSES


def max_result_bytes() -> int:
    """The result size limit: ``TIDEMQ_MAX_RESULT_BYTES``, or 1 MiB."""
    raw = os.environ.get("TIDEMQ_MAX_RESULT_BYTES", "").strip()
    if not raw:
        return DEFAULT_MAX_RESULT_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(f"TIDEMQ_MAX_RESULT_BYTES must be a whole number of bytes, got {raw!r}") from None
    if value < 1:
        raise ConfigurationError(f"TIDEMQ_MAX_RESULT_BYTES must be 1 or more, got {value}")
    return value


# One encoder for every result: ``json.dumps`` with options of its own builds a new one per call,
# a third of what encoding a small result costs. Encoding keeps no state in the encoder.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _check_size(text: str, limit: int) -> str:
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    if size > limit:
        raise ResultTooLargeError(f"the result is {size} bytes as JSON; the limit is {limit} bytes "
                                  "(TIDEMQ_MAX_RESULT_BYTES): store large output elsewhere and return its key")
    return text


def encode_result(value: Any, limit: Optional[int] = None) -> Optional[str]:
    """A handler's return value as JSON text (None for None: nothing to store)."""
    if value is None:
        return None
    try:
        text = _ENCODER.encode(value)
    except (TypeError, ValueError) as exc:
        raise InvalidResultError(f"the handler's return value must be JSON-serialisable: {exc}") from None
    except RecursionError:
        raise InvalidResultError("the handler's return value nests too deep to be JSON") from None
    return _check_size(text, max_result_bytes() if limit is None else limit)


def check_result_text(text: str, limit: Optional[int] = None) -> Optional[str]:
    """JSON text received as a result over the wire: within the limit and strict JSON; empty
    text is no result (None)."""
    if not text:
        return None
    _check_size(text, max_result_bytes() if limit is None else limit)
    try:
        parse_strict(text)
    except (ValueError, RecursionError) as exc:
        raise MalformedRequestError(f"a result must be JSON text: {exc}") from None
    return text


def error_result(exc: BaseException) -> str:
    """A failure as stored: the exception's type (module and qualified name), message and the
    end of its traceback."""
    kind = type(exc)
    module = kind.__module__
    name = kind.__qualname__ if module in ("builtins", "__main__") else f"{module}.{kind.__qualname__}"
    trace = "".join(tb.format_exception(kind, exc, exc.__traceback__))
    return json.dumps({"type": name, "message": str(exc)[:MAX_ERROR_TRACEBACK],
                       "traceback": trace[-MAX_ERROR_TRACEBACK:]}, ensure_ascii=False)


def remote_error(text: Optional[str]) -> RemoteError:
    """The RemoteError a stored failure (:func:`error_result`) stands for."""
    try:
        fields = json.loads(text) if text else {}
    except ValueError:
        fields = {}
    if not isinstance(fields, dict):
        fields = {}
    return RemoteError(str(fields.get("type") or "Exception"), str(fields.get("message") or "the handler failed"),
                       str(fields.get("traceback") or ""))


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise MalformedRequestError(f"progress {what} must be a finite number, got {value!r}")
    return float(value)


def progress_text(done: Any, total: Any, note: Any, at_ms: int) -> str:
    """A progress report as stored (the note cut so the whole fits the column)."""
    done_value = _number(done, "done")
    total_value = None if total is None else _number(total, "total")
    text_note = str(note or "")[:MAX_PROGRESS_NOTE]
    while True:
        text = json.dumps({"done": done_value, "total": total_value, "note": text_note, "at": int(at_ms)},
                          ensure_ascii=False)
        if len(text) <= PROGRESS_MAX_CHARS:
            return text
        text_note = text_note[: len(text_note) // 2]


def parse_progress(text: Optional[str]) -> Optional[Progress]:
    """A stored progress report, or None."""
    if not text:
        return None
    fields = json.loads(text)
    return Progress(fields["done"], fields.get("total"), fields.get("note", ""), int(fields.get("at", 0)))
