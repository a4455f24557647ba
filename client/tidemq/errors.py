"""The one exception tree of tidemq.

Every error tidemq raises derives from :class:`TidemqError`. Input errors derive from
:class:`ValidationError` (also a ``ValueError``); their message names the limit or the expected
form. Errors a caller may retry derive from :class:`RetriableError`.
"""

from __future__ import annotations

import reprlib
from typing import Any

__all__ = [
    "TidemqError",
    "ConfigurationError",
    "ValidationError",
    "InvalidTopicError",
    "InvalidDataError",
    "DataTooLargeError",
    "InvalidDelayError",
    "InvalidRetryError",
    "InvalidMessageTypeError",
    "InvalidScheduleError",
    "MalformedRequestError",
    "RetriableError",
    "BrokerUnavailableError",
    "StorageUnavailableError",
    "DatabaseOutOfReachError",
    "CoordinationError",
    "LeaseLostError",
    "PullCancelledError",
    "AuthenticationError",
    "PermissionDeniedError",
    "InvalidResultError",
    "ResultTooLargeError",
    "MessageNotFoundError",
    "MessageCancelledError",
    "RemoteError",
    "ResultTimeoutError",
    "DependencyError",
    "UnknownDependencyError",
    "DependencyCycleError",
    "WorkflowTooLargeError",
    "InputError",
    "error_from_name",
    "quote",
    "QUOTE_CHARS",
]

#: How much of a value an error message quotes. Messages travel back to callers in gRPC trailing
#: metadata, which clients refuse beyond 8 KiB: an echoed value must never decide the size.
QUOTE_CHARS = 60
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = QUOTE_CHARS
_REPR.maxlist = _REPR.maxtuple = _REPR.maxset = _REPR.maxdict = 6
_REPR.maxlevel = 3


class TidemqError(Exception):
    """Raised when tidemq cannot do what was asked; the base of every tidemq error."""


class ConfigurationError(TidemqError):
    """Raised when the configuration is missing or contradictory (names the setting to fix)."""


class ValidationError(TidemqError, ValueError):
    """Raised when input is rejected; nothing was stored."""


class InvalidTopicError(ValidationError):
    """Raised when a topic name is empty, too long or has characters outside [A-Za-z0-9._:-]."""


class InvalidDataError(ValidationError):
    """Raised when message data is not JSON-serialisable."""


class DataTooLargeError(InvalidDataError):
    """Raised when serialised message data exceeds the size limit."""


class InvalidDelayError(ValidationError):
    """Raised when a delay or effect time is negative, too far ahead, or both are given."""


class InvalidRetryError(ValidationError):
    """Raised when a retry count or retry schedule is not of the accepted form."""


class InvalidMessageTypeError(ValidationError):
    """Raised when a message type is not one of MessageType's members."""


class InvalidScheduleError(ValidationError):
    """Raised when a schedule's name, cron expression, time zone or missed-tick policy is not of
    the accepted form."""


class MalformedRequestError(ValidationError):
    """Raised when a request is structurally wrong (bad field, too many items, unknown id form)."""


class AuthenticationError(TidemqError):
    """Raised when a broker does not accept the caller's token (missing, unknown or revoked)."""


class PermissionDeniedError(TidemqError):
    """Raised when the caller's principal may not do this on this topic; nothing was changed."""


class RetriableError(TidemqError):
    """Raised when the operation failed for a passing reason; the same call may succeed later."""


class BrokerUnavailableError(RetriableError):
    """Raised when no broker answered in time; nothing is known to be stored."""


class StorageUnavailableError(RetriableError):
    """Raised when the database cannot be reached or timed out; the request was not applied."""


class DatabaseOutOfReachError(StorageUnavailableError):
    """Raised when this process gets no answer at all from the database (a network partition),
    before anything is sent. Another process may reach it: a broker answers its callers
    UNAVAILABLE, and their pools move the call to another broker."""


class CoordinationError(RetriableError):
    """Raised when ZooKeeper (or the in-process coordinator) cannot serve the request."""


class LeaseLostError(TidemqError):
    """Raised when an ack or touch is refused because the consumer no longer holds the lease."""


class PullCancelledError(TidemqError):
    """Raised when a pull is cancelled through its PullHandle before its reply arrived; give
    back its lease token with ``release`` in case the broker locked messages under it."""


class InvalidResultError(ValidationError):
    """Raised when a handler's return value (or a batch consumer's result) is not JSON: the
    attempt fails with this error instead of storing half a result."""


class ResultTooLargeError(InvalidResultError):
    """Raised when a result is larger than TIDEMQ_MAX_RESULT_BYTES as JSON (the message names
    the size and the limit)."""


class MessageNotFoundError(TidemqError):
    """Raised when a result or status is read for a message id that is not stored (never
    produced, cancelled before it ran, or removed by retention or the archive)."""


class MessageCancelledError(TidemqError):
    """Raised when a message's cancel was requested: by ``message.checkpoint()`` in its handler,
    and by ``Handle.result()`` for a message that ended CANCELLED."""


class RemoteError(TidemqError):
    """Raised by ``Handle.result()`` when the handler failed: ``type`` (module and qualified
    name of the handler's exception), ``message`` and ``traceback`` (bounded) say how."""

    def __init__(self, type: str, message: str, traceback: str = "") -> None:
        super().__init__(f"{type}: {message}")
        self.type = type
        self.message = message
        self.traceback = traceback


class ResultTimeoutError(TidemqError, TimeoutError):
    """Raised when ``Handle.result(timeout)`` ran out of time before the message finished; the
    message runs on, and a later call may still get its result."""


class DependencyError(ValidationError):
    """Raised when messages with dependencies are refused; nothing of the submission was stored."""


class UnknownDependencyError(DependencyError):
    """Raised when a dependency names a message id that is not stored (never produced, cancelled
    before it ran, or removed by retention or the archive); the message names the ids."""


class DependencyCycleError(DependencyError):
    """Raised when the steps of one submission depend on each other in a cycle, or a step on
    itself; the message names the steps of the cycle."""


class WorkflowTooLargeError(DependencyError):
    """Raised when a submission has more steps, or a step more dependencies, than the limits
    ``tidemq.limits.MAX_WORKFLOW_STEPS`` and ``MAX_DEPENDENCIES`` allow (the message names it)."""


class InputError(TidemqError):
    """Raised by a handler's ``message.input`` or ``message.inputs`` when its dependencies'
    results cannot be its input: ``input`` on a message with other than one dependency (the
    message names the count), ``inputs`` when a dependency did not succeed or is no longer stored
    (it names the dependency; ``message.outcomes`` shows every one)."""


def error_from_name(name: str, message: str) -> TidemqError:
    """Rebuild the exception a broker reported by class name (unknown names give TidemqError)."""
    cls = globals().get(name)
    if isinstance(cls, type) and issubclass(cls, TidemqError) and cls is not RemoteError:
        return cls(message)
    return TidemqError(message)


def quote(value: Any, limit: int = QUOTE_CHARS) -> str:
    """``value`` as an error message quotes it: its ``repr``, cut to about ``limit`` characters,
    with the full length said when a string or bytes value was cut.

    Every message that echoes input goes through here, so a 10,000-character field comes back as
    its first characters and its length, never in full."""
    if isinstance(value, (str, bytes, bytearray)) and len(value) > limit:
        unit = "characters" if isinstance(value, str) else "bytes"
        return f"{value[:limit]!r}... ({len(value):,} {unit})"
    text = _REPR.repr(value)
    return text if len(text) <= 2 * limit else text[:2 * limit] + "..."
