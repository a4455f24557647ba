"""Who calls a broker and what it may do: tokens, principals, roles and topic patterns.

With ``TIDEMQ_AUTH=token`` every call carries ``authorization: Bearer <token>`` metadata. The
``TokenInterceptor`` looks the token's SHA-256 up among the active principals (a cache the
broker reloads from ``tidemq_principal`` every ``REFRESH_SECONDS``, so a revoked token stops
working on every broker within that time) and answers UNAUTHENTICATED when it is missing,
unknown or revoked. The RPC then runs with its principal in ``CALLER``, and each method asks
``authorize`` before it changes anything: the role must allow the method, and the principal's
topic patterns must cover every topic involved. Topics of existing messages are read from the
stored rows, never taken from the request.
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import re
import secrets
import threading
import time
from fnmatch import fnmatchcase
from typing import Any, Callable, Iterable, Iterator, Optional

import grpc

from .errors import (AuthenticationError, MalformedRequestError, PermissionDeniedError, RetriableError,
                     ValidationError, quote)
from .storage import Principal, PrincipalStore

__all__ = ["CALLER", "ROLES", "Principals", "TokenInterceptor", "authorize", "checks_topics", "new_token",
           "parse_patterns", "token_hash"]

log = logging.getLogger(__name__)

ROLES = ("producer", "consumer", "admin")
# The methods each role may call. An admin may do everything on the topics it covers.
_ALLOWED = {
    "producer": {"Produce", "Cancel", "Requeue", "PutSchedule", "Results", "Workflow"},
    "consumer": {"Pull", "Ack", "Touch", "Extend", "Release", "Results", "Workflow"},
    "admin": {"Produce", "Cancel", "Requeue", "Pull", "Ack", "Touch", "Extend", "Release", "PutSchedule", "Results",
              "Workflow"},
}
REFRESH_SECONDS = 2.0  # how stale a broker's view of the principals may be (revocation delay)
_MISS_RELOAD_SECONDS = 0.5  # an unknown token reloads at most this often (a new principal works at once)
_PATTERN = re.compile(r"[A-Za-z0-9._:*-]{1,255}")
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_BEARER = "bearer "

CALLER: contextvars.ContextVar[Optional[Principal]] = contextvars.ContextVar("tidemq_caller", default=None)


def new_token() -> str:
    """A fresh secret: ``tmq_`` and 32 random bytes, URL-safe."""
    return "tmq_" + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """What is stored of a token. Tokens carry 256 random bits, so SHA-256 is enough: a slow
    password hash only helps secrets a person chose."""
    return hashlib.sha256(token.encode()).hexdigest()


def check_name(name: str) -> str:
    """A principal name: 1-64 of [A-Za-z0-9._-]."""
    if not _NAME.fullmatch(name or ""):
        raise ValidationError(f"a principal name is 1-64 of A-Z a-z 0-9 . _ -, got {quote(name)}")
    return name


def check_role(role: str) -> str:
    if role not in ROLES:
        raise ValidationError(f"role must be one of {', '.join(ROLES)}, got {quote(role)}")
    return role


def parse_patterns(text: str) -> tuple[str, ...]:
    """Comma-separated topic patterns (``orders.*,billing``); ``*`` matches any run of characters."""
    patterns = tuple(part.strip() for part in (text or "").split(",") if part.strip())
    if not patterns:
        raise ValidationError("--topics needs at least one topic pattern, e.g. 'orders.*' or '*'")
    for pattern in patterns:
        if not _PATTERN.fullmatch(pattern):
            raise ValidationError(
                f"topic pattern {quote(pattern)} may hold only topic characters [A-Za-z0-9._:-] and * (1-255 of them)")
    if len(",".join(patterns)) > 1024:
        raise ValidationError("topic patterns take at most 1024 characters in all")
    return patterns


def covers(principal: Principal, topic: str) -> bool:
    """Whether one of ``principal``'s patterns matches ``topic``."""
    return any(fnmatchcase(topic, pattern) for pattern in principal.topics)


def checks_topics() -> bool:
    """Whether the caller's topics must be looked up before ``authorize`` (not for ``*``)."""
    principal = CALLER.get()
    return principal is not None and principal.topics != ("*",)


def authorize(method: str, topics: Iterable[str] = ()) -> None:
    """Raise ``PermissionDeniedError`` unless the caller may call ``method`` on every topic in
    ``topics``. Without authentication (no caller) everything is allowed."""
    principal = CALLER.get()
    if principal is None:
        return
    if method not in _ALLOWED.get(principal.role, ()):
        raise PermissionDeniedError(f"principal {quote(principal.name)} ({principal.role}) may not call {method}")
    for topic in sorted(set(topics)):
        if not covers(principal, topic):
            raise PermissionDeniedError(
                f"principal {quote(principal.name)} ({principal.role}) may not call {method} on topic {quote(topic)}")


class Principals:
    """The active principals by token hash, reloaded every ``refresh`` seconds."""

    def __init__(self, store: PrincipalStore, refresh: float = REFRESH_SECONDS) -> None:
        self._store = store
        self._refresh = refresh
        self._by_hash: dict[str, Principal] = {}
        self._loaded = float("-inf")
        self._lock = threading.Lock()

    def lookup(self, token: str) -> Optional[Principal]:
        """The active principal of ``token``, or None."""
        digest = token_hash(token)
        if time.monotonic() - self._loaded > self._refresh:
            self._reload(wait=self._loaded == float("-inf"))
        found = self._by_hash.get(digest)
        if found is None and time.monotonic() - self._loaded > _MISS_RELOAD_SECONDS:
            self._reload(wait=True)
            found = self._by_hash.get(digest)
        return found

    def _reload(self, wait: bool) -> None:
        # One thread reloads; the others go on with the current view unless they must wait.
        if not self._lock.acquire(blocking=wait):
            return
        try:
            self._by_hash = self._store.active()
            self._loaded = time.monotonic()
        except RetriableError:
            if self._loaded == float("-inf"):
                raise  # nothing to go on: the call fails as retriable
            # Keep the last view while the database is away (which the database logs once);
            # try again in half a second.
            log.debug("cannot reload principals; keeping the last view", exc_info=True)
            self._loaded = time.monotonic() - self._refresh + _MISS_RELOAD_SECONDS
        finally:
            self._lock.release()


def bearer_token(metadata: Iterable[tuple[str, Any]]) -> str:
    """The token of an ``authorization: Bearer ...`` metadata entry, or ''."""
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str) and value[:len(_BEARER)].lower() == _BEARER:
            return value[len(_BEARER):].strip()
    return ""


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses calls without the token of an active principal; runs the others as it.

    The token is checked before the request is read. grpc reads a unary request whole before
    its handler runs, so each method is served as a client-streaming one whose single message is
    taken only once the caller is known: an anonymous call is refused having cost the broker no
    more than what HTTP/2 flow control let its client send ahead (see ``server.py``), not a
    request of up to the receive limit. On the wire the call stays unary."""

    def __init__(self, principals: Principals, error_key: str) -> None:
        self._principals = principals
        self._error_key = error_key

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return handler
        if handler.stream_stream is not None:
            return self._checked_stream(handler)
        if handler.unary_unary is None:
            return handler
        inner = handler.unary_unary

        def checked(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            principal = self._caller(context)
            request = next(requests, None)
            if request is None:  # the client closed its side without sending the request
                context.set_trailing_metadata(((self._error_key, MalformedRequestError.__name__),))
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call carried no request message")
            reset = CALLER.set(principal)
            try:
                return inner(request, context)
            finally:
                CALLER.reset(reset)

        return grpc.stream_unary_rpc_method_handler(checked, request_deserializer=handler.request_deserializer,
                                                    response_serializer=handler.response_serializer)

    def _checked_stream(self, handler: Any) -> Any:
        """A stream's token is checked when it opens, before its first request is read, and
        again as each request is read (a token revoked while the stream is open stops it)."""
        inner = handler.stream_stream

        def checked(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
            self._caller(context)

            def as_caller() -> Iterator[Any]:
                for request in requests:
                    CALLER.set(self._caller(context))  # the request is served in this thread next
                    yield request

            try:
                yield from inner(as_caller(), context)
            finally:
                CALLER.set(None)

        return grpc.stream_stream_rpc_method_handler(checked, request_deserializer=handler.request_deserializer,
                                                     response_serializer=handler.response_serializer)

    def _caller(self, context: grpc.ServicerContext) -> Principal:
        """The principal whose token the call carries; aborts the call when there is none."""
        token = bearer_token(context.invocation_metadata())
        principal = None
        try:
            principal = self._principals.lookup(token) if token else None
        except RetriableError as exc:
            context.set_trailing_metadata(((self._error_key, type(exc).__name__),))
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        if principal is None:
            reason = "an unknown or revoked token" if token else "no token (authorization: Bearer ...)"
            context.set_trailing_metadata(((self._error_key, AuthenticationError.__name__),))
            context.abort(grpc.StatusCode.UNAUTHENTICATED, f"this broker authenticates callers: the call "
                          f"carried {reason}; set TIDEMQ_TOKEN to a token from `tidemq auth add`")
        return principal  # type: ignore[return-value]
