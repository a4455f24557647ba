"""The broker pool: which brokers are alive, one channel each, calls that fail over."""

from __future__ import annotations

import itertools
import logging
import re
import threading
import time
from typing import Any, Callable, Optional

import grpc

from .config import MAX_REQUEST_BYTES
from .coordinator import Coordinator
from .errors import (BrokerUnavailableError, MalformedRequestError, PullCancelledError, RetriableError, TidemqError,
                     error_from_name)
from .link import PullHandle
from .outage import Outage
from .produce_stream import ProduceStreams
from .rpc import tidemq_pb2_grpc as pb_grpc

__all__ = ["BrokerPool", "ERROR_KEY", "MAX_MESSAGE_BYTES", "CHANNEL_OPTIONS", "rpc_failure"]

log = logging.getLogger(__name__)
ERROR_KEY = "tidemq-error"
MAX_MESSAGE_BYTES = MAX_REQUEST_BYTES  # what a client sends and reads at most per call
_QUARANTINE = 2.0  # seconds a broker that failed a call is passed over
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Reconnect quickly to a broker that comes back on the same address.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
#: Codes that mean the broker (not the request) failed: the call moves to another broker.
_FAILOVER_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN,
                   grpc.StatusCode.INTERNAL)
#: grpc's answer, before anything runs, from a server already running its maximum_concurrent_rpcs.
_BUSY = "Concurrent RPC limit exceeded"
_TOO_LARGE = re.compile(r"message larger than max \((\d+) vs\. (\d+)\)")


class BrokerPool:
    """Spreads calls round-robin over live brokers; a call that finds a broker dead moves on.

    Brokers come from a static list or from ``<root>/brokers`` in the coordinator (watched, so
    a dead broker leaves the pool as soon as its ephemeral node goes). While the coordinator is
    unreachable the last list it gave stays in use.

    Faults are logged once, not per call: a broker that stops answering when it first fails (and
    when it answers again), and calls that fail for every broker (none answers, or the brokers
    report a retriable error such as their database being away) at the first such failure and
    when a call succeeds again (:class:`tidemq.outage.Outage`).
    """

    def __init__(self, static: tuple[str, ...] = (), coordinator: Optional[Coordinator] = None,
                 credentials: Optional[grpc.ChannelCredentials] = None, token: str = "",
                 streams: Optional[ProduceStreams] = None) -> None:
        self._credentials = credentials  # TLS, or None for plaintext
        # Sent with every call to brokers that authenticate (TIDEMQ_AUTH=token).
        self._metadata: Optional[tuple[tuple[str, str], ...]] = (
            (("authorization", f"Bearer {token}"),) if token else None)
        self._lock = threading.Condition()
        self._addresses: list[str] = list(static)
        self._stubs: dict[str, tuple[grpc.Channel, pb_grpc.BrokerStub]] = {}
        self._failed_at: dict[str, float] = {}
        self._failing: dict[str, float] = {}  # address -> when it first failed, until it answers
        self.outage = Outage(log, "calls to tidemq's brokers")
        self._turn = itertools.count()
        self._closed = False
        self.streams = streams  # Produce calls go on open streams (tidemq.produce_stream)
        if not static and coordinator is not None:
            coordinator.watch_brokers(self._set_addresses)

    def _set_addresses(self, addresses: list[str]) -> None:
        with self._lock:
            self._addresses = list(addresses)
            for gone in set(self._stubs) - set(addresses):
                channel, _ = self._stubs.pop(gone)
                self._close_channel(channel)
                if self.streams is not None:
                    self.streams.forget(gone)
            for gone in set(self._failing) - set(addresses):
                del self._failing[gone]
            self._lock.notify_all()

    def _close_channel(self, channel: Any) -> None:
        channel.close()

    def addresses(self) -> list[str]:
        with self._lock:
            return list(self._addresses)

    def _stub(self, address: str) -> pb_grpc.BrokerStub:
        with self._lock:
            if address not in self._stubs:
                if self._credentials is None:
                    channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
                else:
                    channel = grpc.secure_channel(address, self._credentials, options=CHANNEL_OPTIONS)
                self._stubs[address] = (channel, pb_grpc.BrokerStub(channel))
            return self._stubs[address][1]

    def _pick_now(self, avoid: set[str]) -> Optional[str]:
        """The next live broker not in ``avoid``, round robin; None when there is none (lock held)."""
        now = time.monotonic()
        live = [a for a in self._addresses if a not in avoid and now - self._failed_at.get(a, -1e9) > _QUARANTINE]
        if not live:  # everything failed recently: try the quarantined ones again
            live = [a for a in self._addresses if a not in avoid]
        return live[next(self._turn) % len(live)] if live else None

    def _live(self, address: str) -> bool:
        """Whether ``address`` is a registered broker that has not failed a call lately."""
        with self._lock:
            return address in self._addresses and time.monotonic() - self._failed_at.get(address, -1e9) > _QUARANTINE

    def _pick(self, deadline: float, avoid: set[str], track: Optional[PullHandle] = None) -> Optional[str]:
        """A live broker not in ``avoid``, waiting until ``deadline`` for one to register; None
        when there is none by then, or once ``track`` is cancelled (a stopping worker's pull must
        not wait out its long-poll's deadline for brokers that are gone)."""
        with self._lock:
            while not self._closed and not (track is not None and track.cancelled):
                address = self._pick_now(avoid)
                if address is not None:
                    return address
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._lock.wait(min(remaining, 0.1))
                avoid.clear()  # the list may have changed: every broker deserves another try
            return None

    def call(self, method: str, request: Any, timeout: float, on_attempt: Optional[Callable[[str], None]] = None,
             track: Optional[PullHandle] = None, prefer: str = "") -> Any:
        """Call ``method`` on some live broker within ``timeout`` seconds.

        Transport failures (broker dead or unreachable) move the call to another broker; errors a
        broker reports are raised as the matching tidemq exception. ``track``, when given, can
        cancel each attempt while it is in flight; a cancelled call raises PullCancelledError
        and is not retried. ``prefer``: the broker to try first while it is live (one that read
        what this call reads about; see ``tidemq.inputs``).
        """
        try:
            reply = self._call(method, request, timeout, on_attempt, track, prefer)
        except RetriableError as exc:
            self.outage.failed(exc)
            raise
        self.outage.succeeded()
        return reply

    def _call(self, method: str, request: Any, timeout: float, on_attempt: Optional[Callable[[str], None]],
              track: Optional[PullHandle], prefer: str = "") -> Any:
        deadline = time.monotonic() + timeout
        tried: set[str] = set()
        last_error = "no broker is registered"
        while True:
            address = prefer if prefer and not tried and self._live(prefer) else self._pick(deadline, tried, track)
            if track is not None and track.cancelled:
                raise PullCancelledError(f"{method} was cancelled before it was sent")
            remaining = deadline - time.monotonic()
            if address is None or remaining <= 0:
                raise BrokerUnavailableError(f"no broker answered {method} within {timeout:.1f} s ({last_error})")
            if on_attempt is not None:
                on_attempt(address)
            try:
                reply = self._attempt(address, method, request, remaining, track)
            except grpc.RpcError as exc:
                if (exc.code() == grpc.StatusCode.CANCELLED and _tidemq_error(exc) is None
                        and track is not None and track.cancelled):
                    raise PullCancelledError(f"{method} on {address} was cancelled") from None
                error = rpc_failure(exc, method, address, timeout)
                if error is not None:
                    self._answered(address)
                    raise error from None
                last_error = self._failed(exc, method, address)
                tried.add(address)
                continue
            self._answered(address)
            return reply

    def _attempt(self, address: str, method: str, request: Any, remaining: float,
                 track: Optional[PullHandle]) -> Any:
        if track is None:
            if method == "Produce" and self.streams is not None:
                return self.streams.call(address, self._stub(address), request, remaining, self._metadata)
            return getattr(self._stub(address), method)(request, timeout=remaining, metadata=self._metadata)
        if track.cancelled:
            raise PullCancelledError(f"{method} was cancelled before it was sent")
        future = getattr(self._stub(address), method).future(request, timeout=remaining, metadata=self._metadata)
        track.bind(future.cancel)
        try:
            return future.result()
        except grpc.FutureCancelledError:
            raise PullCancelledError(f"{method} on {address} was cancelled") from None
        finally:
            track.bind(None)

    def _answered(self, address: str) -> None:
        """``address`` answered a call: if it had been failing, say that it is back."""
        if address not in self._failing:  # the common case, without the lock
            return
        with self._lock:
            since = self._failing.pop(address, None)
            self._failed_at.pop(address, None)
        if since is not None:
            log.info("broker %s answers again after %.1f s", address, time.monotonic() - since)

    def _failed(self, exc: grpc.RpcError, method: str, address: str) -> str:
        """Quarantine ``address`` after a transport failure; returns what to report if every broker fails.

        The first failure of a broker is logged; the next ones are not until it has answered again."""
        code = exc.code()
        now = time.monotonic()
        with self._lock:
            self._failed_at[address] = now
            first = address not in self._failing
            if first:
                self._failing[address] = now
        if first:
            log.warning("broker %s does not answer (%s on %s: %s); calls go to other brokers until it does",
                        address, code.name, method, exc.details())
        else:
            log.debug("broker %s failed %s (%s); trying another", address, method, code.name)
        return f"{address}: {code.name} {exc.details()}{self._hint(exc.details() or '')}"

    def _hint(self, details: str) -> str:
        """What to check when a connection fails the way a TLS mismatch makes it fail."""
        lowered = details.lower()
        if self._credentials is None and ("socket closed" in lowered or "connection reset" in lowered
                                          or "handshake" in lowered):
            return " (if the broker serves TLS, set TIDEMQ_TLS_CA to the CA that signed its certificate)"
        if self._credentials is not None and ("ssl" in lowered or "handshake" in lowered or "certificate" in lowered):
            return (" (TLS failed: check that TIDEMQ_TLS_CA signed the broker's certificate for this address, "
                    "and TIDEMQ_TLS_CERT/TIDEMQ_TLS_KEY if the broker requires a client certificate)")
        return ""

    def close(self) -> None:
        if self.streams is not None:
            self.streams.close()
        with self._lock:
            self._closed = True
            for channel, _ in self._stubs.values():
                channel.close()
            self._stubs.clear()
            self._lock.notify_all()


def rpc_failure(exc: grpc.RpcError, method: str, address: str, timeout: float) -> Optional[TidemqError]:
    """The tidemq exception to raise for a failed call; None when the broker, not the request,
    failed and the call should move to another broker (synchronous and grpc.aio calls alike)."""
    error = _tidemq_error(exc)
    if error is not None:
        return error
    code = exc.code()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return BrokerUnavailableError(f"{method} on {address} did not finish within {timeout:.1f} s")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return _exhausted(exc.details() or "", method, address)
    if code not in _FAILOVER_CODES:
        return TidemqError(f"{method} on {address} failed: {code.name}: {exc.details()}")
    return None


def _exhausted(details: str, method: str, address: str) -> Optional[TidemqError]:
    """The error of a RESOURCE_EXHAUSTED call, or None for a busy broker.

    A broker that answered is alive: a request or reply over a size limit, or an answer whose
    trailers this client refused as too large, is an error of this call, and every other broker
    would answer it alike. Only a broker at its limit of concurrent calls ran nothing and may be
    replaced by another."""
    if _BUSY in details:
        return None
    size = _TOO_LARGE.search(details)
    if size:
        return MalformedRequestError(
            f"{method} on {address}: a message of {int(size[1]):,} bytes is over the limit of {int(size[2]):,} "
            "bytes per call (a broker reads requests up to TIDEMQ_MAX_REQUEST_BYTES, a client sends and reads "
            "up to 64 MiB): send or pull fewer or smaller messages per call")
    if "metadata" in details:
        return TidemqError(f"{method} on {address}: the broker answered, but its reply's trailers were over the "
                           f"size this client accepts, so its error is unknown (RESOURCE_EXHAUSTED: {details})")
    return TidemqError(f"{method} on {address} failed: RESOURCE_EXHAUSTED: {details}")


def _tidemq_error(exc: grpc.RpcError) -> Optional[TidemqError]:
    """The tidemq exception a broker reported in trailing metadata, if it reported one."""
    for key, value in exc.trailing_metadata() or ():
        if key == ERROR_KEY:
            return error_from_name(value, exc.details() or value)
    return None
