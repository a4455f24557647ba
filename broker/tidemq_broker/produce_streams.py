"""Produce streams: a client's produce requests on one long-lived gRPC stream.

A request on an open stream costs the broker and the client less than a call of its own (no
call set-up, no new HTTP/2 stream, no per-call metadata): on these machines an empty unary call
took 0.39–0.43 ms p50 and a lockstep message on an open stream 0.27 ms. A stream is answered in
order, one request at a time, so a reply needs no id; a client that wants several requests in
flight opens several streams (``tidemq.produce_stream``).

An open stream holds one of the server's threads while it waits for its next request, so the
broker serves at most ``limit`` at once and refuses more (the client then makes unary calls to
this broker for a while). When the broker stops, idle streams are cancelled at once and busy
ones end after their reply, so a stop does not wait out its grace for streams that are merely
open; the client sends their next request to another broker.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterator, Optional

import grpc

from tidemq.produce_stream import FULL_KEY  # the trailer the client recognises a refusal by
from tidemq.rpc import tidemq_pb2 as pb

from .errors import TidemqError
from .rpc_errors import abort_with

__all__ = ["ProduceStreams"]

Produce = Callable[[pb.ProduceRequest, Optional[float]], pb.ProduceReply]


class _Stream:
    __slots__ = ("context", "busy", "closing", "cancelled")

    def __init__(self, context: grpc.ServicerContext) -> None:
        self.context = context
        self.busy = False  # a request read and not yet answered
        self.closing = False  # end after the current reply
        self.cancelled = False


class ProduceStreams:
    """The broker's open Produce streams: at most ``limit`` at once, ended when it stops."""

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._open: set[_Stream] = set()
        self._stopping = False

    def serve(self, requests: Iterator[pb.ProduceRequest], context: grpc.ServicerContext,
              produce: Produce) -> Iterator[pb.ProduceReply]:
        """Answer each request of ``requests`` with ``produce(request, timeout)`` in turn.

        A tidemq error ends the stream with the status a unary Produce would have returned;
        the client opens another stream for its next request."""
        stream = self._admit(context)
        try:
            for request in requests:
                with self._lock:
                    if stream.cancelled:  # the broker stopped while the request was on its way
                        return
                    stream.busy = True
                try:
                    reply = produce(request, request.timeout_seconds or None)
                except TidemqError as exc:
                    abort_with(context, exc)
                yield reply
                with self._lock:
                    stream.busy = False
                    if stream.closing:
                        return
        finally:
            with self._lock:
                self._open.discard(stream)

    def _admit(self, context: grpc.ServicerContext) -> _Stream:
        with self._lock:
            full = len(self._open) >= self.limit
            if not full and not self._stopping:
                stream = _Stream(context)
                self._open.add(stream)
                return stream
        if full:
            context.set_trailing_metadata(((FULL_KEY, "full"),))
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"this broker serves at most {self.limit} produce streams at once; use Produce calls")
        context.abort(grpc.StatusCode.UNAVAILABLE, "this broker is stopping")
        raise AssertionError("grpc's abort returned")

    def stop(self) -> None:
        """Refuse new streams; cancel idle ones now and end busy ones after their reply."""
        with self._lock:
            self._stopping = True
            idle = [s for s in self._open if not s.busy]
            for stream in self._open:
                stream.closing = True
            for stream in idle:
                stream.cancelled = True
        for stream in idle:
            stream.context.cancel()
