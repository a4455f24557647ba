"""Produce streams for asyncio: ``tidemq.produce_stream``'s rules on grpc.aio stream calls.

A grpc.aio stream is written and read by coroutines on the loop, without the thread a sync
stream's requests pass through, so a request on an open stream costs even less against a unary
call here than in the sync client. The rules are the sync client's: one request at a time per
stream, failures raised as a unary call's would be (the pool fails over alike), a request past
its timeout cancels its stream, a broker that refuses streams gets unary calls for a while, and
a stream unused for ``idle_seconds`` is closed. Use it from one event loop, as its pool.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Optional

import grpc
import grpc.aio

from ..produce_stream import IDLE_SECONDS, UNARY_SECONDS, StreamFailure, refused
from ..rpc import tidemq_pb2 as pb
from ..rpc import tidemq_pb2_grpc as pb_grpc

__all__ = ["AsyncProduceStreams"]


class AsyncProduceStreams:
    """Open Produce streams on grpc.aio channels, per broker address, reused one request at a time."""

    def __init__(self, idle_seconds: float = IDLE_SECONDS) -> None:
        self.idle_seconds = idle_seconds
        self._idle: dict[str, list[tuple[float, Any]]] = {}  # address -> (last used, stream call)
        self._unary_until: dict[str, float] = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._reaper: Optional[asyncio.TimerHandle] = None
        self._gone: set[str] = set()  # brokers that left the pool, from the discovery thread
        self._gone_lock = threading.Lock()
        self._closed = False
        #: Streams opened and requests sent on them (tests and benchmarks read them).
        self.opened = 0
        self.sent = 0

    async def call(self, address: str, stub: pb_grpc.BrokerStub, request: pb.ProduceRequest, timeout: float,
                   metadata: Any) -> pb.ProduceReply:
        """Send ``request`` to ``address`` on an open stream (or a unary call where the broker
        serves no stream) and return its reply; raises ``grpc.RpcError`` as a unary call would."""
        self._loop = asyncio.get_running_loop()
        self._forget_gone()
        if self._closed or time.monotonic() < self._unary_until.get(address, 0.0):
            return await stub.Produce(request, timeout=timeout, metadata=metadata)
        idle = self._idle.get(address)
        stream = idle.pop()[1] if idle else None
        if stream is None:
            stream = stub.ProduceStream(metadata=metadata)
            self.opened += 1
        request.timeout_seconds = timeout
        try:
            await _write(stream, request)
            reply = await asyncio.wait_for(stream.read(), timeout)
        except asyncio.TimeoutError:
            stream.cancel()
            raise StreamFailure(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        except grpc.RpcError as exc:
            stream.cancel()
            if refused(exc):
                self._unary_until[address] = time.monotonic() + UNARY_SECONDS
                return await stub.Produce(request, timeout=timeout, metadata=metadata)
            raise
        except BaseException:  # the caller was cancelled: the stream's next reply would be this one's
            stream.cancel()
            raise
        if reply is grpc.aio.EOF:  # the broker ended the stream (it is stopping) before this request
            stream.cancel()
            raise StreamFailure(grpc.StatusCode.UNAVAILABLE, "the broker ended the produce stream")
        self.sent += 1
        if self._closed:
            stream.cancel()
        else:
            self._idle.setdefault(address, []).append((time.monotonic(), stream))
            if self._reaper is None:
                self._reaper = self._loop.call_later(self.idle_seconds, self._reap)
        return reply

    def _reap(self) -> None:
        """Close streams unused for ``idle_seconds``; look again while any stay open."""
        self._reaper = None
        now = time.monotonic()
        for address, idle in list(self._idle.items()):
            keep = [(used, s) for used, s in idle if now - used < self.idle_seconds]
            for used, stream in idle:
                if now - used >= self.idle_seconds:
                    stream.cancel()
            if keep:
                self._idle[address] = keep
            else:
                del self._idle[address]
        if self._idle and self._loop is not None and not self._closed:
            self._reaper = self._loop.call_later(self.idle_seconds, self._reap)

    def forget(self, address: str) -> None:
        """A broker left the pool (called from the discovery thread): its idle streams are
        closed on the loop, at the next call."""
        with self._gone_lock:
            self._gone.add(address)

    def _forget_gone(self) -> None:
        if not self._gone:
            return
        with self._gone_lock:
            gone, self._gone = self._gone, set()
        for address in gone:
            for _, stream in self._idle.pop(address, []):
                stream.cancel()

    def close(self) -> None:
        """Close every idle stream (on the loop); streams in use close when their request ends."""
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        streams = [s for idle in self._idle.values() for _, s in idle]
        self._idle.clear()
        for stream in streams:
            stream.cancel()


async def _write(stream: Any, request: pb.ProduceRequest) -> None:
    """Write ``request``; a stream the broker already ended (it stopped, and cancelled it while
    idle) raises as a call that failed with that stream's status would."""
    try:
        await stream.write(request)
    except asyncio.InvalidStateError:
        code = await stream.code()
        if code == grpc.StatusCode.OK:
            code = grpc.StatusCode.UNAVAILABLE
        raise StreamFailure(code, await stream.details() or "the broker ended the produce stream") from None
