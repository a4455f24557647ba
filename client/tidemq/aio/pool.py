"""The broker pool for asyncio: the same discovery and failover, RPCs over grpc.aio channels."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Optional

import grpc
import grpc.aio

from ..errors import BrokerUnavailableError, RetriableError
from ..pool import CHANNEL_OPTIONS, BrokerPool, rpc_failure
from ..rpc import tidemq_pb2_grpc as pb_grpc

__all__ = ["AsyncBrokerPool"]

log = logging.getLogger(__name__)
#: How often a call that finds no broker registered looks again (discovery is a ZooKeeper watch
#: on another thread, which cannot wake a coroutine directly).
_NO_BROKER_POLL = 0.05


class AsyncBrokerPool(BrokerPool):
    """:class:`tidemq.pool.BrokerPool`'s broker list, quarantine and round robin, with
    ``grpc.aio`` channels. Use it from one event loop: its channels belong to that loop."""

    _loop: Optional[asyncio.AbstractEventLoop] = None

    def _stub(self, address: str) -> pb_grpc.BrokerStub:
        with self._lock:
            if address not in self._stubs:
                if self._credentials is None:
                    channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
                else:
                    channel = grpc.aio.secure_channel(address, self._credentials, options=CHANNEL_OPTIONS)
                self._stubs[address] = (channel, pb_grpc.BrokerStub(channel))  # type: ignore[assignment]
            return self._stubs[address][1]

    def _close_channel(self, channel: Any) -> None:
        # Called from the discovery thread: an aio channel is closed by a coroutine on its loop.
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(lambda: loop.create_task(channel.close()))

    async def _apick(self, deadline: float, avoid: set[str]) -> Optional[str]:
        while True:
            with self._lock:
                if self._closed:
                    return None
                address = self._pick_now(avoid)
            if address is not None or time.monotonic() >= deadline:
                return address
            await asyncio.sleep(_NO_BROKER_POLL)
            avoid.clear()  # the list may have changed: every broker deserves another try

    async def acall(self, method: str, request: Any, timeout: float,
                    on_attempt: Optional[Callable[[str], Awaitable[None]]] = None, prefer: str = "") -> Any:
        """Call ``method`` on some live broker within ``timeout`` seconds (see :meth:`BrokerPool.call`).

        The same ``request`` object goes to each broker tried, so a Produce keeps its request id.
        ``on_attempt(address)`` is awaited before each attempt (a pull releases its lease there).
        ``prefer``: the broker to try first while it is live, as in :meth:`BrokerPool.call`.
        """
        try:
            reply = await self._acall(method, request, timeout, on_attempt, prefer)
        except RetriableError as exc:
            self.outage.failed(exc)
            raise
        self.outage.succeeded()
        return reply

    async def _acall(self, method: str, request: Any, timeout: float,
                     on_attempt: Optional[Callable[[str], Awaitable[None]]], prefer: str = "") -> Any:
        self._loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout
        tried: set[str] = set()
        last_error = "no broker is registered"
        while True:
            address = prefer if prefer and not tried and self._live(prefer) else await self._apick(deadline, tried)
            remaining = deadline - time.monotonic()
            if address is None or remaining <= 0:
                raise BrokerUnavailableError(f"no broker answered {method} within {timeout:.1f} s ({last_error})")
            if on_attempt is not None:
                await on_attempt(address)
                remaining = deadline - time.monotonic()
            try:
                if method == "Produce" and self.streams is not None:
                    reply = await self.streams.call(address, self._stub(address), request, remaining, self._metadata)
                else:
                    reply = await getattr(self._stub(address), method)(request, timeout=remaining,
                                                                       metadata=self._metadata)
            except grpc.RpcError as exc:  # a call's AioRpcError, or a stream's StreamFailure
                error = rpc_failure(exc, method, address, timeout)
                if error is not None:
                    self._answered(address)
                    raise error from None
                last_error = self._failed(exc, method, address)
                tried.add(address)
                continue
            self._answered(address)
            return reply

    async def aclose(self) -> None:
        """Close every channel (on this loop) and stop taking calls."""
        if self.streams is not None:
            self.streams.close()
        with self._lock:
            self._closed = True
            channels = [channel for channel, _ in self._stubs.values()]
            self._stubs.clear()
            self._lock.notify_all()
        for channel in channels:
            await channel.close()
