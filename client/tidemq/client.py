"""The Client: produce, broadcast, cancel, requeue, and the pull/ack calls consumers use."""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import datetime
from typing import Any, Iterable, Optional, Sequence

from .coalesce import Coalescer, Request
from .produce_stream import ProduceStreams
from .direct import open_direct, produce_flushes
from .config import Settings
from .coordinator import Coordinator
from .coordinators import open_coordinator
from .errors import DataTooLargeError, PullCancelledError, TidemqError
from .handles import Handle
from .link import AckItem, AckOutcome, Delivery, Heartbeat, LeaseRef, ProgressRef, PullHandle
from .pool import BrokerPool
from .results import MessageState
from .rpc import tidemq_pb2 as pb
from . import tracing
from .rpc_build import (
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
    heartbeat,
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
from .tls import channel_credentials
from .workflow_handles import WorkflowHandle
from .workflow_info import Waiting, WorkflowInfo, workflow_info, workflow_request
from .workflows import Workflow
from .validation import MAX_BATCH, check_topic, encode_data

__all__ = ["Client", "BROADCAST_MAX_BYTES", "Retry"]

log = logging.getLogger(__name__)

#: ZooKeeper refuses nodes over about 1 MiB (jute.maxbuffer); leave room for the envelope.
BROADCAST_MAX_BYTES = 1_000_000
class Client:
    """A connection to a tidemq cluster. Thread-safe; share one per process.

    It is also the consumers' :class:`tidemq.link.BrokerLink` over gRPC.
    """

    def __init__(self, settings: Optional[Settings] = None, coordinator: Optional[Coordinator] = None) -> None:
        self.settings = settings or Settings.from_env()
        self._coordinator = coordinator
        self._own_coordinator = coordinator is None
        self._coordinator_lock = threading.Lock()
        self._coordinator_started = coordinator is not None
        static = self.settings.brokers
        # Produce requests travel on open streams, unless the settings ask for unary calls.
        streams = ProduceStreams() if self.settings.produce_path == "broker" else None
        self.pool = BrokerPool(static, None if static else self.coordinator, channel_credentials(self.settings),
                               self.settings.token, streams)
        # TIDEMQ_PRODUCE=direct: this process commits what it produces (tidemq.direct).
        self._direct = open_direct(self.settings) if self.settings.produce_path == "direct" else None
        # (topic, consumer) -> the brokers tried by the pull in flight, the last one where it waits
        self._pulls_at: dict[tuple[str, str], list[str]] = {}
        # Concurrent produce() calls share Produce RPCs, or direct commits (see tidemq.coalesce).
        self.producer: Coalescer[Sequence[pb.NewMessage], list[int]] = Coalescer(
            self._flush_produce, produce_flushes(self.settings), MAX_BATCH, RPC_DATA_BYTES, not_sent)

    @property
    def coordinator(self) -> Coordinator:
        """The coordinator, connected on first use (broker discovery, consumers, broadcasts)."""
        with self._coordinator_lock:
            if self._coordinator is None:
                self._coordinator = open_coordinator(self.settings.zk_hosts, self.settings.zk_root,
                                                     self.settings.zk_session_timeout, auth=self.settings.zk_auth)
            if not self._coordinator_started:
                self._coordinator.start()
                self._coordinator_started = True
            return self._coordinator

    # -- producing ---------------------------------------------------------------------------
    def produce(self, topic: str, data: Any = None, *, delay: Optional[float] = None,
                effect_time: Optional[datetime] = None, retry: Retry = None,
                unique_key: Optional[str] = None, timeout: Optional[float] = None, key: Optional[str] = None,
                priority: int = 0, result: bool = False, depends_on: Optional[Iterable[Any]] = None) -> Any:
        """Store one message and return its id once it is committed (with ``result``: a
        :class:`~tidemq.handles.Handle` on it, to wait for its result, watch or cancel it).

        ``delay`` (seconds) or ``effect_time`` (a datetime) sets when it may run; ``retry`` is a
        count or a schedule like ``[0, "2m", "1h"]``; ``unique_key`` makes a repeated produce of
        the same (topic, key) return the first message's id instead of storing another.
        ``key`` names what the topic's per-key running limit counts by (e.g. a customer);
        ``priority`` (0 to 9) runs it before due messages of lower priority. ``depends_on``
        (ids or handles): it waits (WAITING) until each of them succeeded, and is cancelled when
        one ends FAIL or CANCELLED; an unknown id is an ``UnknownDependencyError``.
        """
        return self.produce_many(topic, [data], delay=delay, effect_time=effect_time, retry=retry,
                                 unique_keys=[unique_key] if unique_key else None, timeout=timeout,
                                 keys=[key] if key else None, priority=priority, result=result,
                                 depends_on=depends_on)[0]

    def produce_many(self, topic: str, datas: Iterable[Any], *, delay: Optional[float] = None,
                     effect_time: Optional[datetime] = None, retry: Retry = None,
                     unique_keys: Optional[Sequence[Optional[str]]] = None,
                     timeout: Optional[float] = None, keys: Optional[Sequence[Optional[str]]] = None,
                     priority: int = 0, result: bool = False, depends_on: Optional[Iterable[Any]] = None) -> list[Any]:
        """Store many messages of one topic in one transaction (all or none); return their ids
        (with ``result``: their handles).

        Calls made at the same time from other threads may share the RPC and the transaction
        (``tidemq.coalesce``); each call still stores all of its messages or none. ``keys``: one
        flow key (or None) per message; ``priority`` and ``depends_on`` apply to every message
        of the call (a call with dependencies is an RPC of its own).
        """
        datas = list(datas)
        check_produce_batch(datas, unique_keys, keys)
        template = produce_template(topic, delay, effect_time, retry, priority)
        template.depends_on.extend(dependency_ids(depends_on))
        with tracing.produce_span(template.topic, len(datas)) as span:
            # The messages carry this span's context: their handlers' spans become its children.
            template.trace_context = tracing.current_traceparent()
            ids = self._produce(template, datas, unique_keys, timeout, keys)
            tracing.set_message_ids(span, ids)
            return [Handle(i, self) for i in ids] if result else ids

    def handle(self, msg_id: int) -> Handle:
        """A handle on message ``msg_id`` (produced by anyone, anywhere)."""
        return Handle(msg_id, self)

    def _produce(self, template: pb.NewMessage, datas: list[Any], unique_keys: Optional[Sequence[Optional[str]]],
                 timeout: Optional[float], keys: Optional[Sequence[Optional[str]]] = None) -> list[int]:
        messages = produce_messages(template, datas, unique_keys, self.settings.max_data_bytes, keys)
        if template.depends_on:
            return self._produce_alone(messages, timeout)
        return self.producer.submit(messages, len(messages), sum(len(m.data) for m in messages),
                                    timeout if timeout is not None else self.settings.rpc_timeout)

    def submit(self, workflow: Workflow, timeout: Optional[float] = None, result: bool = False) -> list[Any]:
        """Store every step of ``workflow`` in one transaction (all or none); return their ids in
        the order they were added (with ``result``: their handles)."""
        messages = workflow.messages(self.settings.max_data_bytes)
        if not messages:
            return []
        with tracing.produce_span(messages[0].topic, len(messages)) as span:
            context = tracing.current_traceparent()
            for msg in messages:
                msg.trace_context = context
            ids = self._produce_alone(messages, timeout)
            tracing.set_message_ids(span, ids)
            return [Handle(i, self) for i in ids] if result else ids

    def _produce_alone(self, messages: list[pb.NewMessage], timeout: Optional[float]) -> list[int]:
        """Messages with dependencies: an RPC of their own (see ``rpc_build.alone_request``)."""
        request, wait = alone_request(messages), timeout if timeout is not None else self.settings.rpc_timeout
        if self._direct is not None:
            return list(self._direct.produce(request, wait))
        return list(self.pool.call("Produce", request, wait).ids)

    def _flush_produce(self, batch: list[Request[Sequence[pb.NewMessage], list[int]]]) -> None:
        """One Produce RPC (or direct commit) for the requests of ``batch``; on an input error,
        one each (:func:`tidemq.rpc_build.settle_produce` says when and why)."""
        request, timeout = produce_call(batch, self.settings.rpc_timeout, named=self._direct is None)
        try:
            if self._direct is not None:
                ids = self._direct.produce(request, timeout)
            else:
                ids = self.pool.call("Produce", request, timeout).ids
        except TidemqError as exc:
            if settle_produce(batch, error=exc):
                for one in batch:
                    self._flush_produce([one])
            return
        settle_produce(batch, ids)

    def broadcast(self, topic: str, data: Any = None) -> int:
        """Send ``data`` to every TOPIC consumer of ``topic`` online now; return its sequence."""
        check_topic(topic)
        with tracing.produce_span(topic, 1):
            envelope = {"data": json.loads(encode_data(data, BROADCAST_MAX_BYTES)), "sent_at": int(time.time() * 1000)}
            context = tracing.current_traceparent()
            if context:  # each consumer's handler span joins this trace
                envelope["trace_context"] = context
            payload = json.dumps(envelope, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
            if len(payload) > BROADCAST_MAX_BYTES:
                raise DataTooLargeError(
                    f"broadcast is {len(payload)} bytes; ZooKeeper's limit leaves {BROADCAST_MAX_BYTES}")
            return self.coordinator.broadcast(topic, payload)

    # -- managing ----------------------------------------------------------------------------
    def cancel(self, msg_id: int, timeout: Optional[float] = None, *, running: bool = False) -> bool:
        """Delete a message that is still pending (NEW). False if it is running, done or gone.

        ``running``: a RUNNING message is marked instead; its worker learns of it at once (the
        topic's cancel signal brings its heartbeat forward) and its handler stops, and the
        message ends CANCELLED (True then)."""
        return self.cancel_many([msg_id], timeout, running=running)[0]

    def cancel_many(self, ids: Sequence[int], timeout: Optional[float] = None, *,
                    running: bool = False) -> list[bool]:
        """Cancel many messages at once; one bool per id."""
        return list(self._call("Cancel", cancel_request(ids, running), timeout).cancelled)

    def cancel_workflow(self, workflow: Any, timeout: Optional[float] = None, *, running: bool = False) -> int:
        """Cancel a workflow whole, in one transaction: its NEW and WAITING steps are removed (what
        waits on them in other workflows learns they ended CANCELLED), and with ``running`` its
        RUNNING ones are marked as :meth:`cancel` marks them; its state becomes CANCELLED.
        ``workflow``: its id (the id of its first step), a handle of that step, or what
        :meth:`submit` returned. Returns how many steps were removed or marked."""
        return len(self._call("Cancel", cancel_workflow_request(workflow, running), timeout).cancelled)

    def workflow_state(self, workflow: Any, wait: Optional[float] = 0.0,
                       timeout: Optional[float] = None) -> WorkflowInfo:
        """A workflow's row (``workflow`` named as :meth:`cancel_workflow` takes it); ``wait`` > 0:
        once it ended (no step of it left: ``finished_at`` is set; one cancelled whole is
        CANCELLED at once but ends when its marked RUNNING steps stopped), or after ``wait``
        seconds (None: as long as it takes), whichever comes first. MessageNotFoundError names an
        unknown workflow. ``timeout``: each call's limit (default: its wait plus the RPC timeout)."""
        waiting, request = Waiting(wait), workflow_request(workflow, 0.0)
        while True:
            request.wait_seconds = waiting.next()
            budget = timeout if timeout is not None else request.wait_seconds + self.settings.rpc_timeout
            info = workflow_info(request.id, self.pool.call("Workflow", request, budget))
            if waiting.over(info):
                return info

    def workflow_handle(self, workflow: Any) -> WorkflowHandle:
        """A handle on a workflow (its id, a handle of its first step, or what :meth:`submit`
        returned): its state, waiting for its end, cancelling it."""
        return WorkflowHandle(workflow_id(workflow), self)

    def results(self, ids: Sequence[int], wait: float = 0.0, timeout: Optional[float] = None, *,
                broker: str = "") -> list[MessageState]:
        """The state and result of each message, in order; ``wait`` > 0: the broker answers once
        one of them is final (SUCCESS, FAIL, CANCELLED, or gone), or after ``wait`` seconds.
        ``broker``: ask that broker first while it is live (a delivery's, for its inputs)."""
        budget = timeout if timeout is not None else wait + self.settings.rpc_timeout
        reply = self.pool.call("Results", results_request(ids, wait), budget, prefer=broker)
        return [message_state(state) for state in reply.states]

    def requeue(self, ids: Optional[Sequence[int]] = None, *, topic: Optional[str] = None, retry: int = 0,
                timeout: Optional[float] = None) -> int:
        """Put dead letters (FAIL) back to NEW, by id or every one of ``topic``; return how many."""
        return int(self._call("Requeue", requeue_request(ids, topic, retry), timeout).requeued)

    def schedule(self, name: str, topic: str, cron: str, data: Any = None, *, timezone: str = "UTC",
                 missed: str = "once", retry: Optional[int] = None, timeout: Optional[float] = None) -> bool:
        """Declare a periodic message: one message to ``topic`` per tick of ``cron`` in ``timezone``.

        ``cron`` has 5 fields, or 6 with seconds first (``*/5 * * * * *``: every 5 s). ``missed``:
        ticks missed in an outage produce one message for the latest (``once``) or none
        (``skip``). ``retry``: each message's retries (None: the topic's default). Declaring the
        same name again updates it; returns True when the schedule is new. The broker checks the
        expression and the zone (``InvalidScheduleError`` names the expected form)."""
        request = pb.PutScheduleRequest(name=name, topic=check_topic(topic), cron=cron, timezone=timezone,
                                        data=encode_data(data), missed=missed, retry=-1 if retry is None else retry)
        return bool(self._call("PutSchedule", request, timeout).created)

    # -- consuming: the BrokerLink calls (tidemq types in and out; protobuf stays here) -------
    def pull(self, topic: str, consumer: str, *, rank: int = 0, total: int = 1, serial: bool = False,
             max_messages: int = 100, wait: float = 5.0, ttr: float = 0.0, lease_token: str = "",
             track: Optional[PullHandle] = None, ahead: float = 0.0, hold: float = 0.0) -> list[Delivery]:
        """Lease up to ``max_messages`` due messages, long-polling up to ``wait`` seconds.

        ``lease_token`` (32 hex characters) names the lease in advance, so a caller whose call
        failed or was abandoned can :meth:`release` whatever it may have locked. ``track`` lets
        another thread cancel the long-poll (then PullCancelledError is raised). ``ahead``,
        ``hold``: see :meth:`tidemq.link.BrokerLink.pull`.
        """
        request = pull_request(topic, consumer, rank=rank, total=total, serial=serial, max_messages=max_messages,
                               wait=wait, ttr=ttr, lease_token=lease_token, ahead=ahead, hold=hold)
        answered: list[str] = []
        key = (topic, consumer)
        try:
            reply = self.pull_request(request, wait + self.settings.rpc_timeout, track=track, answered=answered)
        finally:
            if answered and self._pulls_at.get(key) is answered:
                del self._pulls_at[key]
        return [delivery(d, answered[-1] if answered else "") for d in reply.messages]

    def pull_request(self, request: pb.PullRequest, timeout: float,
                     track: Optional[PullHandle] = None, answered: Optional[list[str]] = None) -> pb.PullReply:
        """Send ``request`` to some live broker (``track`` as in :meth:`BrokerPool.call`).

        A pull that names its lease token and moves to another broker after a transport failure
        first releases that token: the failed broker may have leased messages under it before its
        reply was lost, and a broker's reply carries only the lease it made itself. If the
        release fails too, those messages come back when their lease expires. ``answered`` gets
        the address of each broker tried: the last one answered.
        """
        tries = 0

        def before_attempt(address: str) -> None:
            nonlocal tries
            tries += 1
            if answered is not None:
                answered.append(address)
                self._pulls_at[(request.topic, request.consumer)] = answered
            if tries > 1 and request.lease_token:
                try:
                    # Cancelled with the pull: the caller then gives the token back itself, within
                    # its own time (a stopping worker's drain), which these 5 s could outlast.
                    self.pool.call("Release", pb.ReleaseRequest(lease_token=request.lease_token,
                                                                consumer=request.consumer), 5, track=track)
                except PullCancelledError:
                    pass
                except TidemqError as exc:
                    log.info("could not give back the lease of a failed pull of %s: %s", request.topic, exc)

        return self.pool.call("Pull", request, timeout, on_attempt=before_attempt, track=track)

    def release(self, lease_token: str, consumer: str = "", timeout: Optional[float] = None) -> int:
        """Put back to NEW the messages still leased under ``lease_token``; returns how many."""
        reply = self._call("Release", pb.ReleaseRequest(lease_token=lease_token, consumer=consumer), timeout)
        return int(reply.released)

    def ack(self, topic: str, consumer: str, items: Sequence[AckItem],
            timeout: Optional[float] = None) -> list[AckOutcome]:
        """Report outcomes in one call and one transaction; returns the AckOutcome per item.

        The ack goes first to the broker where this consumer's pull of ``topic`` waits, if one
        does: what the ack makes due (a workflow's next step) is then handed to that pull in the
        ack's own transaction, instead of reaching it through the brokers' signal."""
        waiting = self._pulls_at.get((topic, consumer))
        prefer = waiting[-1] if waiting else ""
        reply = self.pool.call("Ack", ack_request(topic, consumer, items),
                               timeout if timeout is not None else self.settings.rpc_timeout, prefer=prefer)
        return ack_outcomes(reply)

    def extend(self, leases: Sequence[LeaseRef], ttr: float, consumer: str = "",
               timeout: Optional[float] = None) -> list[bool]:
        """Heartbeat: make each lease end ``ttr`` seconds from now, in one call; False where lost."""
        return list(self._call("Extend", extend_request(leases, ttr, consumer), timeout).extended)

    def heartbeat(self, leases: Sequence[LeaseRef], ttr: float, consumer: str = "",
                  progress: Sequence[ProgressRef] = (), timeout: Optional[float] = None) -> Heartbeat:
        """:meth:`extend` that also sends progress reports and answers which messages' cancel
        was requested."""
        reply = self._call("Extend", extend_request(leases, ttr, consumer, progress), timeout)
        return heartbeat(reply, len(leases))

    def touch(self, msg_id: int, lease_token: str, ttr: float, timeout: Optional[float] = None) -> bool:
        """Extend a lease; False when it was already lost."""
        reply = self._call("Touch", pb.TouchRequest(id=msg_id, lease_token=lease_token, ttr_seconds=ttr), timeout)
        return bool(reply.extended)

    def _call(self, method: str, request: Any, timeout: Optional[float]) -> Any:
        return self.pool.call(method, request, timeout if timeout is not None else self.settings.rpc_timeout)

    def close(self) -> None:
        """Close channels, the coordinator session and a direct producer's connections."""
        if self._direct is not None:
            self._direct.close()
        self.pool.close()
        if self._own_coordinator and self._coordinator is not None and self._coordinator_started:
            self._coordinator.stop()

