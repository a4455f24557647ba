"""How a tidemq error raised by a handler reaches the client: a gRPC status code, the error's
text and, in trailing metadata, the exception's class name (the client raises the same class)."""

from __future__ import annotations

import functools
from typing import Any, Callable, NoReturn, TypeVar

import grpc

from tidemq.pool import ERROR_KEY  # trailing metadata: the class name of the tidemq error

from . import errors
from .errors import DatabaseOutOfReachError, PermissionDeniedError, RetriableError, TidemqError, ValidationError

__all__ = ["ERROR_KEY", "MAX_DETAILS_BYTES", "abort_with", "rpc"]

#: The longest error text a reply carries. It travels in the grpc-message trailer, where every
#: byte outside printable ASCII takes three; clients refuse trailers beyond 8 KiB, and a refused
#: reply would reach the caller as RESOURCE_EXHAUSTED instead of its error.
MAX_DETAILS_BYTES = 2048
F = TypeVar("F", bound=Callable[..., Any])


def rpc(method: F) -> F:
    """Map tidemq errors to gRPC status codes, naming the exception class for the client."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except TidemqError as exc:
            abort_with(context, exc)

    return wrapper  # type: ignore[return-value]


def abort_with(context: grpc.ServicerContext, exc: TidemqError) -> NoReturn:
    """End the call with the status of ``exc`` (grpc's ``abort`` raises, leaving the handler).

    A database out of this broker's reach (``storages.reach``) is the broker's failure, not the
    request's: UNAVAILABLE without the error's name, which a client's pool takes as it takes a
    broker that does not answer, moving the call (and the next ones, for a while) elsewhere."""
    if not isinstance(exc, DatabaseOutOfReachError):
        context.set_trailing_metadata(((ERROR_KEY, _public_name(exc)),))
    context.abort(_code(exc), _details(exc))
    raise AssertionError("grpc's abort returned")  # it always raises; this satisfies NoReturn


def _public_name(exc: TidemqError) -> str:
    """The name of the client's class for ``exc``: its own, or for a class the broker keeps to
    itself (``storages.database.NoConnectionError``) the nearest public one it derives from."""
    return next(cls.__name__ for cls in type(exc).__mro__ if cls.__name__ in errors.__all__)


def _code(exc: TidemqError) -> grpc.StatusCode:
    if isinstance(exc, ValidationError):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, PermissionDeniedError):
        return grpc.StatusCode.PERMISSION_DENIED
    if isinstance(exc, RetriableError):
        return grpc.StatusCode.UNAVAILABLE
    return grpc.StatusCode.FAILED_PRECONDITION


def _details(exc: Exception) -> str:
    """The error's text, at most MAX_DETAILS_BYTES of UTF-8. Messages quote input through
    ``tidemq.errors.quote`` already; this holds for any other text too, such as a library's."""
    data = str(exc).encode("utf-8")
    if len(data) <= MAX_DETAILS_BYTES:
        return str(exc)
    return data[:MAX_DETAILS_BYTES].decode("utf-8", "ignore") + "..."
