"""Produce streams: the client's side of ``ProduceStream`` (see ``tidemq_broker.produce_streams``).

A request on an open stream costs less than a unary call of its own. Each stream carries one
request at a time (lockstep: the reply that comes next is this request's), so a client keeps one
stream per flush in flight, per broker: at most ``TIDEMQ_PRODUCE_IN_FLIGHT`` of them in
steady use. A stream unused for ``idle_seconds`` is closed, since it holds a broker thread.

Failures look like those of a unary call, so ``tidemq.pool`` treats them alike: a broken stream
(broker gone, stopping, connection lost) raises its ``grpc.RpcError`` and the call moves to
another broker with the same request id (a request a broker committed is answered from its id,
never stored twice); a broker's error ends the stream with the error's status; a request not
answered within its timeout cancels its stream and raises DEADLINE_EXCEEDED. A broker that
refuses streams (it has its limit open, or predates them) gets unary calls for a while.
"""

from __future__ import annotations

import heapq
import itertools
import queue
import threading
import time
from typing import Any, Optional

import grpc

from .rpc import tidemq_pb2 as pb
from .rpc import tidemq_pb2_grpc as pb_grpc

__all__ = ["ProduceStreams", "StreamFailure", "refused", "FULL_KEY", "IDLE_SECONDS", "UNARY_SECONDS"]

_END = object()  # closes a stream's request side
FULL_KEY = "tidemq-streams"  # a broker's trailer on a stream refused because it has its limit open
UNARY_SECONDS = 30.0  # how long a broker that refused a stream gets unary calls
IDLE_SECONDS = 10.0  # a stream unused this long is closed (it holds a broker thread)


class StreamFailure(grpc.RpcError):
    """A stream that ended without an answer to its request, as a call's error would say it."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple:
        return ()


def refused(exc: grpc.RpcError) -> bool:
    """Whether the broker refused the stream itself (at its limit, or a version without
    streams): nothing of the request ran, and a unary call may carry it."""
    code = exc.code()
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return True
    return code == grpc.StatusCode.RESOURCE_EXHAUSTED and any(
        key == FULL_KEY for key, _ in (exc.trailing_metadata() or ()))


class _Stream:
    """One open ProduceStream; used by one request at a time."""

    def __init__(self, stub: pb_grpc.BrokerStub, metadata: Any) -> None:
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.call = stub.ProduceStream(iter(self._requests.get, _END), metadata=metadata)
        self.used = time.monotonic()
        self.expired = False  # cancelled by the watchdog at its request's deadline

    def send(self, request: pb.ProduceRequest) -> pb.ProduceReply:
        self._requests.put(request)
        try:
            return next(self.call)
        except StopIteration:  # the broker ended the stream (it is stopping) before this request
            raise StreamFailure(grpc.StatusCode.UNAVAILABLE, "the broker ended the produce stream") from None

    def close(self) -> None:
        self._requests.put(_END)
        self.call.cancel()


class ProduceStreams:
    """Open Produce streams, per broker address, reused by one request at a time."""

    def __init__(self, idle_seconds: float = IDLE_SECONDS) -> None:
        self.idle_seconds = idle_seconds
        self._lock = threading.Condition()
        self._idle: dict[str, list[_Stream]] = {}
        self._unary_until: dict[str, float] = {}
        self._deadlines: list[tuple[float, int, _Stream]] = []  # requests in flight, earliest first
        self._turn = itertools.count()
        self._watchdog: Optional[threading.Thread] = None
        self._wake_at = 0.0  # when the watchdog wakes next, unless notified
        self._closed = False
        #: Streams opened and requests sent on them (tests and benchmarks read them).
        self.opened = 0
        self.sent = 0

    def call(self, address: str, stub: pb_grpc.BrokerStub, request: pb.ProduceRequest, timeout: float,
             metadata: Any) -> pb.ProduceReply:
        """Send ``request`` to ``address`` on an open stream (or a unary call where the broker
        serves no stream) and return its reply; raises ``grpc.RpcError`` as a unary call would."""
        with self._lock:
            unary = self._closed or time.monotonic() < self._unary_until.get(address, 0.0)
            idle = None if unary else self._idle.get(address)
            stream = idle.pop() if idle else None
        if unary:
            return stub.Produce(request, timeout=timeout, metadata=metadata)
        if stream is None:
            stream = _Stream(stub, metadata)
            with self._lock:
                self.opened += 1
        request.timeout_seconds = timeout
        entry = (time.monotonic() + timeout, next(self._turn), stream)
        self._watch(entry)
        try:
            reply = stream.send(request)
        except grpc.RpcError as exc:
            self._unwatch(entry)
            stream.close()
            if stream.expired:
                raise StreamFailure(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
            if refused(exc):
                with self._lock:
                    self._unary_until[address] = time.monotonic() + UNARY_SECONDS
                return stub.Produce(request, timeout=timeout, metadata=metadata)
            raise
        except BaseException:
            self._unwatch(entry)
            stream.close()  # interrupted: the stream's next reply would be this request's
            raise
        # A reply that came as its deadline passed: the watchdog took the entry and closes the
        # stream, so the reply stands but the stream is not used again.
        reusable = self._unwatch(entry)
        stream.used = time.monotonic()
        with self._lock:
            self.sent += 1
            if self._closed or not reusable:
                stream.close()
            else:
                self._idle.setdefault(address, []).append(stream)
        return reply

    def forget(self, address: str) -> None:
        """Close the idle streams of a broker that left the pool."""
        with self._lock:
            streams = self._idle.pop(address, [])
        for stream in streams:
            stream.close()

    def close(self) -> None:
        """Close every idle stream; streams in use close when their request ends."""
        with self._lock:
            self._closed = True
            streams = [s for idle in self._idle.values() for s in idle]
            self._idle.clear()
            self._lock.notify_all()
        for stream in streams:
            stream.close()

    # -- the watchdog: deadlines of requests in flight, and idle streams ---------------------
    def _watch(self, entry: tuple[float, int, _Stream]) -> None:
        with self._lock:
            heapq.heappush(self._deadlines, entry)
            if self._watchdog is None:
                self._watchdog = threading.Thread(target=self._run, name="tidemq-produce-streams", daemon=True)
                self._watchdog.start()
            elif entry[0] < self._wake_at:
                self._lock.notify()  # an earlier deadline than the watchdog sleeps towards

    def _unwatch(self, entry: tuple[float, int, _Stream]) -> bool:
        """Stop watching ``entry``; False when the watchdog took it at its deadline."""
        with self._lock:
            try:
                self._deadlines.remove(entry)
            except ValueError:
                return False
            heapq.heapify(self._deadlines)
            return True

    def _run(self) -> None:
        with self._lock:
            while not self._closed:
                now = time.monotonic()
                expired = []
                while self._deadlines and self._deadlines[0][0] <= now:
                    expired.append(heapq.heappop(self._deadlines)[2])
                stale = self._take_stale(now)
                if expired or stale:
                    self._lock.release()
                    try:
                        for stream in expired:
                            stream.expired = True
                            stream.close()
                        for stream in stale:
                            stream.close()
                    finally:
                        self._lock.acquire()
                    continue
                self._wake_at = now + self.idle_seconds
                if self._deadlines:
                    self._wake_at = min(self._wake_at, self._deadlines[0][0])
                self._lock.wait(max(self._wake_at - now, 0.001))

    def _take_stale(self, now: float) -> list[_Stream]:
        """Idle streams unused for ``idle_seconds``, taken out of the pool (lock held)."""
        stale: list[_Stream] = []
        for address, idle in list(self._idle.items()):
            keep = [s for s in idle if now - s.used < self.idle_seconds]
            stale += [s for s in idle if now - s.used >= self.idle_seconds]
            if keep:
                self._idle[address] = keep
            else:
                del self._idle[address]
        return stale
