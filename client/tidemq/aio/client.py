"""AsyncClient: produce, cancel, requeue and the consumer calls, as coroutines over grpc.aio."""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import datetime
from typing import Any, Iterable, Optional, Sequence

from .. import tracing
from ..coalesce import Request
from ..config import Settings
from ..coordinator import Coordinator
from ..coordinators import open_coordinator
from ..direct import open_direct, produce_flushes
from ..errors import TidemqError
from ..link import AckItem, AckOutcome, Delivery, LeaseRef
from ..results import MessageState
from ..rpc import tidemq_pb2 as pb
from ..rpc_build import (
    RPC_DATA_BYTES,
    Retry,
    ack_outcomes,
    alone_request,
    dependency_ids,
    ack_request,
    cancel_request,
    cancel_workflow_request,
    check_produce_batch,
    delivery,
    extend_request,
    message_state,
    not_sent,
    produce_messages,
    produce_template,
    pull_request,
    requeue_request,
    results_request,
    produce_call,
    settle_produce,
    workflow_id,
)
from ..tls import channel_credentials
from ..workflow_handles import AsyncWorkflowHandle
from ..workflow_info import Waiting, WorkflowInfo, workflow_info, workflow_request
from ..workflows import Workflow
from ..validation import MAX_BATCH
from .coalesce import AsyncCoalescer
from .handles import AsyncHandle
from .pool import AsyncBrokerPool
from .produce_stream import AsyncProduceStreams

__all__ = ["AsyncClient"]

log = logging.getLogger(__name__)


class AsyncClient:
    """A connection to a tidemq cluster for asyncio code; use it from one event loop.

    It checks input and maps errors exactly as :class:`tidemq.Client` does (it builds the same
    requests, :mod:`tidemq.rpc_build`), finds brokers the same way (a static list, or a
    ZooKeeper watch on kazoo's thread) and fails over the same way, keeping a Produce's request
    id on every broker it tries. Concurrent ``produce`` calls share Produce RPCs.
    """

    def __init__(self, settings: Optional[Settings] = None, coordinator: Optional[Coordinator] = None) -> None:
        self.settings = settings or Settings.from_env()
        static = self.settings.brokers
        self._own_coordinator = coordinator is None and not static
        if coordinator is None and not static:
            # Connecting to ZooKeeper blocks for a moment, once: discovery is kazoo's thread.
            coordinator = open_coordinator(self.settings.zk_hosts, self.settings.zk_root,
                                           self.settings.zk_session_timeout, auth=self.settings.zk_auth)
            coordinator.start()
        self._coordinator = coordinator
        # Produce requests travel on open streams, unless the settings ask for unary calls.
        streams = AsyncProduceStreams() if self.settings.produce_path == "broker" else None
        self.pool = AsyncBrokerPool(static, None if static else coordinator, channel_credentials(self.settings),
                                    self.settings.token, streams)  # type: ignore[arg-type]
        # TIDEMQ_PRODUCE=direct: this process commits what it produces (tidemq.direct), in a
        # thread, so the loop runs on while the database commits.
        self._direct = open_direct(self.settings) if self.settings.produce_path == "direct" else None
        self.producer: AsyncCoalescer[Sequence[pb.NewMessage], list[int]] = AsyncCoalescer(
            self._flush_produce, produce_flushes(self.settings), MAX_BATCH, RPC_DATA_BYTES, not_sent)
        self._closed = threading.Event()
        # Where each (topic, consumer)'s pull is in flight: that consumer's acks go there first.
        self._pulls_at: dict[tuple[str, str], list[str]] = {}

    # -- producing ---------------------------------------------------------------------------
    async def produce(self, topic: str, data: Any = None, *, delay: Optional[float] = None,
                      effect_time: Optional[datetime] = None, retry: Retry = None,
                      unique_key: Optional[str] = None, timeout: Optional[float] = None, key: Optional[str] = None,
                      priority: int = 0, result: bool = False, depends_on: Optional[Iterable[Any]] = None) -> Any:
        """Store one message and return its id once it is committed (with ``result``: an
        :class:`~tidemq.aio.handles.AsyncHandle`; see :meth:`tidemq.Client.produce`)."""
        ids = await self.produce_many(topic, [data], delay=delay, effect_time=effect_time, retry=retry,
                                      unique_keys=[unique_key] if unique_key else None, timeout=timeout,
                                      keys=[key] if key else None, priority=priority, result=result,
                                      depends_on=depends_on)
        return ids[0]

    async def produce_many(self, topic: str, datas: Iterable[Any], *, delay: Optional[float] = None,
                           effect_time: Optional[datetime] = None, retry: Retry = None,
                           unique_keys: Optional[Sequence[Optional[str]]] = None,
                           timeout: Optional[float] = None, keys: Optional[Sequence[Optional[str]]] = None,
                           priority: int = 0, result: bool = False,
                           depends_on: Optional[Iterable[Any]] = None) -> list[Any]:
        """Store many messages of one topic in one transaction (all or none); return their ids
        (with ``result``: their handles; ``depends_on``: see :meth:`tidemq.Client.produce`)."""
        datas = list(datas)
        check_produce_batch(datas, unique_keys, keys)
        template = produce_template(topic, delay, effect_time, retry, priority)
        template.depends_on.extend(dependency_ids(depends_on))
        wait = timeout if timeout is not None else self.settings.rpc_timeout
        with tracing.produce_span(template.topic, len(datas)) as span:
            template.trace_context = tracing.current_traceparent()
            messages = produce_messages(template, datas, unique_keys, self.settings.max_data_bytes, keys)
            if template.depends_on:
                ids = await self._produce_alone(messages, wait)
            else:
                ids = await self.producer.submit(messages, len(messages), sum(len(m.data) for m in messages), wait)
            tracing.set_message_ids(span, ids)
            return [AsyncHandle(i, self) for i in ids] if result else ids

    async def submit(self, workflow: Workflow, timeout: Optional[float] = None, result: bool = False) -> list[Any]:
        """Store every step of ``workflow`` in one transaction (all or none); their ids in the
        order they were added (see :meth:`tidemq.Client.submit`)."""
        messages = workflow.messages(self.settings.max_data_bytes)
        if not messages:
            return []
        with tracing.produce_span(messages[0].topic, len(messages)) as span:
            context = tracing.current_traceparent()
            for msg in messages:
                msg.trace_context = context
            ids = await self._produce_alone(messages, timeout if timeout is not None else self.settings.rpc_timeout)
            tracing.set_message_ids(span, ids)
            return [AsyncHandle(i, self) for i in ids] if result else ids

    async def _produce_alone(self, messages: list[pb.NewMessage], wait: float) -> list[int]:
        """Messages with dependencies: an RPC of their own (see ``rpc_build.alone_request``)."""
        request = alone_request(messages)
        if self._direct is not None:
            return list(await asyncio.to_thread(self._direct.produce, request, wait))
        return list((await self.pool.acall("Produce", request, wait)).ids)

    def handle(self, msg_id: int) -> AsyncHandle:
        """A handle on message ``msg_id`` (produced by anyone, anywhere)."""
        return AsyncHandle(msg_id, self)

    async def _flush_produce(self, batch: list[Request[Sequence[pb.NewMessage], list[int]]]) -> None:
        """One Produce RPC (or direct commit) for ``batch``; on an input error, one each (see
        :func:`settle_produce`)."""
        request, timeout = produce_call(batch, self.settings.rpc_timeout, named=self._direct is None)
        try:
            if self._direct is not None:
                ids = await asyncio.to_thread(self._direct.produce, request, timeout)
            else:
                ids = (await self.pool.acall("Produce", request, timeout)).ids
        except TidemqError as exc:
            if settle_produce(batch, error=exc):
                for one in batch:
                    await self._flush_produce([one])
            return
        settle_produce(batch, ids)

    # -- managing ----------------------------------------------------------------------------
    async def cancel(self, msg_id: int, timeout: Optional[float] = None, *, running: bool = False) -> bool:
        """Delete a message that is still pending (NEW); ``running``: mark a RUNNING one (see
        :meth:`tidemq.Client.cancel`). False if it is done or gone."""
        return (await self.cancel_many([msg_id], timeout, running=running))[0]

    async def cancel_many(self, ids: Sequence[int], timeout: Optional[float] = None, *,
                          running: bool = False) -> list[bool]:
        """Cancel many messages at once; one bool per id."""
        return list((await self._call("Cancel", cancel_request(ids, running), timeout)).cancelled)

    async def cancel_workflow(self, workflow: Any, timeout: Optional[float] = None, *, running: bool = False) -> int:
        """Cancel a workflow whole; how many steps were removed or marked (see
        :meth:`tidemq.Client.cancel_workflow`)."""
        return len((await self._call("Cancel", cancel_workflow_request(workflow, running), timeout)).cancelled)

    async def workflow_state(self, workflow: Any, wait: Optional[float] = 0.0,
                             timeout: Optional[float] = None) -> WorkflowInfo:
        """As :meth:`tidemq.Client.workflow_state`, without blocking the event loop."""
        waiting, request = Waiting(wait), workflow_request(workflow, 0.0)
        while True:
            request.wait_seconds = waiting.next()
            budget = timeout if timeout is not None else request.wait_seconds + self.settings.rpc_timeout
            info = workflow_info(request.id, await self.pool.acall("Workflow", request, budget))
            if waiting.over(info):
                return info

    def workflow_handle(self, workflow: Any) -> AsyncWorkflowHandle:
        """As :meth:`tidemq.Client.workflow_handle`, with coroutines (``await`` it to wait)."""
        return AsyncWorkflowHandle(workflow_id(workflow), self)

    async def results(self, ids: Sequence[int], wait: float = 0.0,
                      timeout: Optional[float] = None) -> list[MessageState]:
        """As :meth:`tidemq.Client.results`."""
        budget = timeout if timeout is not None else wait + self.settings.rpc_timeout
        reply = await self._call("Results", results_request(ids, wait), budget)
        return [message_state(state) for state in reply.states]

    async def requeue(self, ids: Optional[Sequence[int]] = None, *, topic: Optional[str] = None, retry: int = 0,
                      timeout: Optional[float] = None) -> int:
        """Put dead letters (FAIL) back to NEW, by id or every one of ``topic``; return how many."""
        return int((await self._call("Requeue", requeue_request(ids, topic, retry), timeout)).requeued)

    # -- consuming ---------------------------------------------------------------------------
    async def pull(self, topic: str, consumer: str, *, max_messages: int = 100, wait: float = 5.0,
                   ttr: float = 0.0, lease_token: str = "") -> list[Delivery]:
        """Lease up to ``max_messages`` due messages, long-polling up to ``wait`` seconds."""
        request = pull_request(topic, consumer, max_messages=max_messages, wait=wait, ttr=ttr,
                               lease_token=lease_token)
        tries = 0
        key, answered = (topic, consumer), [""]

        async def before_attempt(address: str) -> None:
            # As in the synchronous pull: a pull moving to another broker after a transport
            # failure first gives back its lease token, which the failed broker may have leased
            # messages under before its reply was lost.
            nonlocal tries
            tries += 1
            answered[0] = address
            self._pulls_at[key] = answered
            if tries > 1 and request.lease_token:
                try:
                    await self.release(request.lease_token, request.consumer, timeout=5)
                except TidemqError as exc:
                    log.info("could not give back the lease of a failed pull of %s: %s", request.topic, exc)

        try:
            reply = await self.pool.acall("Pull", request, wait + self.settings.rpc_timeout, on_attempt=before_attempt)
        finally:
            if self._pulls_at.get(key) is answered:
                del self._pulls_at[key]
        return [delivery(d) for d in reply.messages]

    async def ack(self, topic: str, consumer: str, items: Sequence[AckItem],
                  timeout: Optional[float] = None) -> list[AckOutcome]:
        """Report outcomes in one call and one transaction; one AckOutcome per item.

        As :meth:`tidemq.client.Client.ack`: the ack goes first to the broker where this
        consumer's pull of ``topic`` waits, if one does, so that a step it releases is handed
        to that pull in the ack's own transaction."""
        waiting = self._pulls_at.get((topic, consumer))
        reply = await self.pool.acall("Ack", ack_request(topic, consumer, items),
                                      timeout if timeout is not None else self.settings.rpc_timeout,
                                      prefer=waiting[0] if waiting else "")
        return ack_outcomes(reply)

    async def release(self, lease_token: str, consumer: str = "", timeout: Optional[float] = None) -> int:
        """Put back to NEW the messages still leased under ``lease_token``; returns how many."""
        reply = await self._call("Release", pb.ReleaseRequest(lease_token=lease_token, consumer=consumer), timeout)
        return int(reply.released)

    async def extend(self, leases: Sequence[LeaseRef], ttr: float, consumer: str = "",
                     timeout: Optional[float] = None) -> list[bool]:
        """Heartbeat: make each lease end ``ttr`` seconds from now, in one call; False where lost."""
        return list((await self._call("Extend", extend_request(leases, ttr, consumer), timeout)).extended)

    async def touch(self, msg_id: int, lease_token: str, ttr: float, timeout: Optional[float] = None) -> bool:
        """Extend one lease; False when it was already lost."""
        reply = await self._call("Touch", pb.TouchRequest(id=msg_id, lease_token=lease_token, ttr_seconds=ttr),
                                 timeout)
        return bool(reply.extended)

    async def _call(self, method: str, request: Any, timeout: Optional[float]) -> Any:
        return await self.pool.acall(method, request, timeout if timeout is not None else self.settings.rpc_timeout)

    async def close(self) -> None:
        """Close the channels (and the ZooKeeper session this client opened, and a direct
        producer's connections)."""
        if self._direct is not None:
            await asyncio.to_thread(self._direct.close)
        await self.pool.aclose()
        if self._own_coordinator and self._coordinator is not None and not self._closed.is_set():
            self._coordinator.stop()
        self._closed.set()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
