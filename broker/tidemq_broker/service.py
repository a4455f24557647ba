"""The gRPC Broker service: produce, pull, ack, touch, cancel, requeue, declare schedules, and
wait for results."""

from __future__ import annotations

from collections import Counter
import logging
import time
from datetime import datetime
from typing import Any, Iterator, Optional, Sequence

import grpc

from tidemq import clock, tracing
from tidemq.metrics import child
from tidemq.rpc import tidemq_pb2 as pb
from tidemq.rpc import tidemq_pb2_grpc as pb_grpc
from tidemq.validation import check_topic

from . import metrics
from .auth import authorize, checks_topics
from .cancels import Cancels
from .errors import MalformedRequestError
from .intake import (MAX_TTR, ack_items, check_ids, check_lease_token, check_lease_ttr, check_progress, check_pull,
                     check_request_id, check_result_ids, check_wait, rows_from_request, steps_from_request)
from .hints import arrivals
from .handoff import Handed, HandOff, handed_out
from .lease_grants import LeaseGrants
from .pulls import PullHub, Quiet, long_poll
from .produce_streams import ProduceStreams
from .release_signals import ReleaseSignals
from .results import ResultHub
from .rpc_errors import ERROR_KEY, rpc
from .schedules import check_schedule, next_tick
from .storage import (AckOutcome, LeasedMessage, LockRequest, MessageResult, Shard, Storage,
                      TopicSettings, WorkflowStep)
from .topic_signals import SignalSender
from .topics import TopicCache
from .workflow_wait import wait_workflow
from .writer import GroupCommitWriter

__all__ = ["BrokerService", "ERROR_KEY"]

log = logging.getLogger(__name__)


class BrokerService(pb_grpc.BrokerServicer):
    """Stateless request handling; all state is in the storage and the coordinator."""

    def __init__(self, storage: Storage, topics: TopicCache, writer: GroupCommitWriter, hub: PullHub,
                 name: str, max_data_bytes: int, results: Optional[ResultHub] = None,
                 signals: Optional[ReleaseSignals] = None, streams: Optional[ProduceStreams] = None,
                 cancel_signals: Optional[SignalSender] = None) -> None:
        self.storage = storage
        self.results = results if results is not None else ResultHub(storage.probes)
        self.signals = signals
        self.cancels = Cancels(storage, self.results, self._wake_released, name, cancel_signals)
        self.topics = topics
        self.writer = writer
        self.hub = hub
        self.name = name
        self.max_data_bytes = max_data_bytes
        self.streams = streams if streams is not None else ProduceStreams()
        self.grants = LeaseGrants()  # acks and heartbeats of leases granted here need no topic read

    @rpc
    def Produce(self, request: pb.ProduceRequest, context: grpc.ServicerContext) -> pb.ProduceReply:
        return self._produce(request, context.time_remaining())

    def ProduceStream(self, requests: Iterator[pb.ProduceRequest],
                      context: grpc.ServicerContext) -> Iterator[pb.ProduceReply]:
        """Produce requests on one open stream, each answered before the next is read."""
        return self.streams.serve(requests, context, self._produce)

    def _produce(self, request: pb.ProduceRequest, remaining: Optional[float]) -> pb.ProduceReply:
        """Store a Produce request's messages; ``remaining``: seconds its caller waits (None: no bound)."""
        started = time.perf_counter()
        rows = rows_from_request(request, self.topics, self.max_data_bytes)
        request_id = check_request_id(request.request_id)
        authorize("Produce", {row.topic for row in rows})
        steps = steps_from_request(request, rows)
        with tracing.rpc_span("Produce", (row.topic for row in rows), (row.trace_context or "" for row in rows)):
            if steps is None:
                ids = self.writer.write(rows, None if remaining is None else max(remaining, 0.001), request_id)
            else:
                ids = self._produce_steps(steps, request_id)
        metrics.PRODUCE_SECONDS.observe(time.perf_counter() - started)
        return pb.ProduceReply(ids=ids)

    @rpc
    def Pull(self, request: pb.PullRequest, context: grpc.ServicerContext) -> pb.PullReply:
        check_pull(request)
        topic = request.topic
        authorize("Pull", [topic])
        self.topics.ensure([topic])  # a topic only ``tidemq.enqueue`` wrote to has no row yet
        if self.signals is not None:
            self.signals.watch(topic)  # steps of it released through another broker wake this pull
        settings = self.topics.get(topic)
        ttr = int(round(request.ttr_seconds)) or settings.ttr
        ttr = max(1, min(ttr, MAX_TTR))
        consumer = request.consumer or context.peer()
        remaining = context.time_remaining()
        wait = request.wait_seconds if remaining is None else min(request.wait_seconds, max(remaining - 0.2, 0))
        deadline = time.monotonic() + wait
        rank, total = (0, 1) if request.serial else (request.rank, request.total)
        ahead, hold = request.ahead_seconds, request.hold_seconds

        def shard() -> Shard:
            return Shard(topic, rank, total, self.hub.hints.get(topic, (rank, total)))

        def attempt() -> list[LeasedMessage]:
            if self.topics.get(topic).paused or not context.is_active():
                return []
            now, lock_started = clock.now(), tracing.now_ns()
            with metrics.LOCK_SECONDS.time():
                if request.serial:
                    found = self.storage.leases.lock_serial(LockRequest(
                        Shard(topic), consumer, ttr, now, ahead=ahead, lease_token=request.lease_token or None,
                        broker=self.name))
                else:
                    where = shard()
                    found = self.storage.leases.lock_batch(LockRequest(
                        where, consumer, ttr, now, limit=request.max_messages, ahead=ahead,
                        lease_token=request.lease_token or None, broker=self.name,
                        limits=self.topics.get(topic).limits, hold=hold))
                    reached = getattr(found, "reached", None)  # LeasedBatch.reached
                    if reached:
                        self.hub.hints.reached(topic, (rank, total), where.hint, reached)
            tracing.record_lock(topic, lock_started, (m.id for m in found), (m.trace_context or "" for m in found))
            return found

        def taker(now: datetime) -> Optional[LockRequest]:
            # What a commit that makes messages of this shard due leases for this pull while it
            # waits (``handoff.py``): the lease its own lock would take. Limits set since the
            # pull began are the lock's to apply (``Leasing.lock_batch``).
            now_settings = self.topics.get(topic)
            if now_settings.paused or (now_settings.limits is not None and now_settings.limits.any) \
                    or not context.is_active():
                return None
            return LockRequest(shard(), consumer, ttr, now, limit=request.max_messages, ahead=ahead,
                               lease_token=request.lease_token or None, broker=self.name, hold=hold)

        def next_due() -> Any:
            if request.serial:
                return self.storage.probes.serial_head_due(topic)
            return self.storage.probes.next_due(shard())

        limits = settings.limits
        quiet = None if request.serial or (limits is not None and limits.any) \
            else Quiet(topic, rank, total, ahead, request.max_messages)
        found = long_poll(self.hub, deadline, attempt, next_due, topic, ahead, self._blocked_recheck(settings),
                          serial=request.serial, alive=context.is_active, quiet=quiet, taker=taker)
        if isinstance(found, Handed):
            tracing.record_lock(topic, tracing.now_ns(), (m.id for m in found), (m.trace_context or "" for m in found))
            child(metrics.HANDED_OFF, topic).inc(len(found))
        if found and not context.is_active():
            # The caller cancelled (its rank changed, it was suspended or is stopping) while we
            # locked: hand the messages back now instead of letting their lease run out.
            now = clock.now()
            self.storage.leases.release(found[0].lease_token or "", now, consumer, self.name)
            self.hub.notify(topic, min(m.effect_time for m in found), {m.priority for m in found})
            return pb.PullReply()
        child(metrics.DELIVERED, topic).inc(len(found))
        self.grants.remember(found)
        return pb.PullReply(messages=[_delivery(m) for m in found])

    def _blocked_recheck(self, settings: TopicSettings) -> float:
        """How long a pull waits before trying again when messages were due but the lock took none.

        A rate-limited topic's bucket gains a token every 1/rate s, so its pulls look again that
        often (at most 50 times a second): the bucket keeps up to a second's worth while leases
        keep coming, but a pull that waited longer would start its topic's burst late. Otherwise an
        ack on this broker wakes them sooner. Each look is a locked transaction on the topic's
        row: the cost grows with the number of waiting pulls, not with the rate."""
        rate = settings.rate_per_second
        if rate:
            return min(self.hub.blocked_recheck, max(0.02, 1.0 / rate))
        return self.hub.blocked_recheck

    def _wake_released(self, released: dict[str, dict[int, int]], since: datetime) -> None:
        """Steps released by a commit of this broker ({topic: {id: priority}}) are due from
        ``since`` on (a time taken before the storage call that released them: the locks' shard
        cursors must not stay above their effect time): wake the pulls waiting for them here,
        and signal the other brokers'."""
        for topic, steps in released.items():
            self.hub.notify(topic, since, set(steps.values()), list(steps))
        if released and self.signals is not None:
            self.signals.released(released)

    @rpc
    def Ack(self, request: pb.AckRequest, context: grpc.ServicerContext) -> pb.AckReply:
        check_ids([item.id for item in request.items], "acks")
        leases = [(item.id, item.lease_token) for item in request.items]
        self.grants.authorize("Ack", leases, self.storage.reads.message_topics)
        items = ack_items(request)
        released: dict[str, dict[int, int]] = {}
        now = clock.now()
        # A step's SUCCESS may release steps that pulls wait for here: leased to them in the ack
        # (a consumer's next pull often arrives with its ack: the ack's lease looks for it last).
        handoff = HandOff(self.hub, now) if any(item.workflow for item in items) else None
        committed = False
        try:
            # The result waiters wake right after the COMMIT, before the connection's check-in: a
            # waiter's read then overlaps it. An item refused as stale wakes its waiters for
            # nothing but a read.
            outcomes = self.storage.acks.ack(items, now, request.consumer[:255] or context.peer(), self.name,
                                             self.topics.get, released, handoff,
                                             committed=lambda: self.results.notify(item.id for item in items))
            committed = True
            self.grants.forget(leases)
            self._wake_released(handed_out(released, handoff), now)
        finally:
            if handoff is not None:
                handoff.finish(committed)
        metrics.count_results(items, outcomes)
        stale = sum(1 for o in outcomes if o is AckOutcome.STALE)
        if stale:
            log.info("refused %d stale ack(s) from %s", stale, request.consumer)
        if request.topic:
            # A failure may make a retry due soon (of a priority not known here); a success only
            # frees what a running message held back (a serial topic's head, a flow limit).
            if any(not item.success for item in request.items):
                self.hub.notify(request.topic, now, None)
            else:
                self.hub.notify_freed(request.topic)
        return pb.AckReply(outcomes=[pb.APPLIED if o is AckOutcome.APPLIED else pb.STALE for o in outcomes])

    @rpc
    def Release(self, request: pb.ReleaseRequest, context: grpc.ServicerContext) -> pb.ReleaseReply:
        token = check_lease_token(request.lease_token)
        topics = self.storage.reads.lease_topics(token)
        authorize("Release", topics if checks_topics() else ())
        released = self.storage.leases.release(token, clock.now(), request.consumer[:255], self.name)
        if released:
            self.reopened(topics)
        return pb.ReleaseReply(released=released)

    def reopened(self, topics: Sequence[str]) -> None:
        """Messages of ``topics`` are NEW again at their old effect times (leases released here,
        or expired by the maintenance leader): wake the pulls here, forgetting the topics' hints,
        and tell the other brokers (``ReleaseSignals.reopened``)."""
        self.hub.wake_all(topics)
        if self.signals is not None:
            self.signals.reopened(topics)

    @rpc
    def Touch(self, request: pb.TouchRequest, context: grpc.ServicerContext) -> pb.TouchReply:
        check_ids([request.id])
        ttr = check_lease_ttr(request.ttr_seconds)
        self.grants.authorize("Touch", [(request.id, request.lease_token)], self.storage.reads.message_topics)
        [extended] = self.storage.leases.extend_leases([(request.id, request.lease_token)], ttr, clock.now())
        return pb.TouchReply(extended=extended)

    @rpc
    def Extend(self, request: pb.ExtendRequest, context: grpc.ServicerContext) -> pb.ExtendReply:
        """A consumer's heartbeat: extend every lease it names in one transaction."""
        check_ids([lease.id for lease in request.leases], "leases")
        for lease in request.leases:
            check_lease_token(lease.lease_token)
        ttr = check_lease_ttr(request.ttr_seconds)
        leases = [(lease.id, lease.lease_token) for lease in request.leases]
        now = clock.now()
        reports = [(p.id, check_lease_token(p.lease_token), check_progress(p, now)) for p in request.progress]
        self.grants.authorize("Extend", leases + [(id, token) for id, token, _ in reports],
                              self.storage.reads.message_topics)
        extended = self.storage.leases.extend_leases(leases, ttr, now)
        if reports:
            self.storage.leases.report_progress(reports, now)
            metrics.PROGRESS_REPORTS.inc(len(reports))
        return pb.ExtendReply(extended=extended, cancel_requested=self.storage.leases.cancels_requested(leases))

    @rpc
    def Cancel(self, request: pb.CancelRequest, context: grpc.ServicerContext) -> pb.CancelReply:
        """Delete NEW messages; with ``running``, also mark RUNNING ones: their handlers stop. With
        ``workflow``, the ids name workflows: each is cancelled whole (one true per message)."""
        ids = check_ids(request.ids)
        if request.workflow:
            authorize("Cancel", self.storage.dependencies.workflow_topics(ids) if checks_topics() else ())
            return pb.CancelReply(cancelled=[True] * self.cancels.workflows(ids, request.running))
        self._authorize_messages("Cancel", ids)
        return pb.CancelReply(cancelled=self.cancels.messages(ids, request.running))

    @rpc
    def Results(self, request: pb.ResultsRequest, context: grpc.ServicerContext) -> pb.ResultsReply:
        """The state and result of each message; with ``wait_seconds``, a long-poll until one of
        them is final (SUCCESS, FAIL, CANCELLED) or gone."""
        ids = check_result_ids(request.ids)
        wait = check_wait(request.wait_seconds)
        self._authorize_messages("Results", ids)
        remaining = context.time_remaining()
        deadline = time.monotonic() + (wait if remaining is None else max(0.0, min(wait, remaining - 0.05)))
        found = {state.id: state for state in self.results.wait(ids, deadline, self.storage.reads.get_results)}
        return pb.ResultsReply(states=[_result_state(id, found.get(id)) for id in ids])

    @rpc
    def Workflow(self, request: pb.WorkflowRequest, context: grpc.ServicerContext) -> pb.WorkflowReply:
        """A workflow's row; with ``wait_seconds``, a long-poll until it ended: no step of it is
        left (``workflow_wait``). Reading it needs the right on every topic of its steps, as
        cancelling it does; an unknown workflow has none, so it answers not found to anyone."""
        workflow_id = request.id
        if workflow_id <= 0:
            raise MalformedRequestError(f"a workflow id is positive (the id of its first step), got {workflow_id}")
        wait = check_wait(request.wait_seconds)
        authorize("Workflow", self.storage.dependencies.workflow_topics([workflow_id]) if checks_topics() else ())
        remaining = context.time_remaining()
        deadline = time.monotonic() + (wait if remaining is None else max(0.0, min(wait, remaining - 0.05)))
        record = wait_workflow(self.storage, self.results, workflow_id, deadline)
        if record is None:
            return pb.WorkflowReply(found=False)
        return pb.WorkflowReply(
            found=True, policy=record.policy, state=record.state, steps_total=record.steps_total,
            steps_left=record.steps_left, steps_failed=record.steps_failed,
            created_ms=clock.to_epoch_ms(record.created_at),
            finished_ms=clock.to_epoch_ms(record.finished_at) if record.finished_at is not None else 0)

    @rpc
    def Requeue(self, request: pb.RequeueRequest, context: grpc.ServicerContext) -> pb.RequeueReply:
        if bool(request.ids) == bool(request.topic):
            raise MalformedRequestError("requeue takes either ids or a topic, not both and not neither")
        ids = check_ids(request.ids) if request.ids else []
        topic = check_topic(request.topic) if request.topic else None
        if request.retry < 0:
            raise MalformedRequestError(f"retry must be 0 or more, got {request.retry}")
        if topic:
            authorize("Requeue", [topic])
        else:
            self._authorize_messages("Requeue", ids)
        now = clock.now()
        topics: set[str] = set()
        moved = self.storage.messages.requeue(ids, topic, request.retry, now, topics=topics, broker=self.name)
        # Due now, without a new id the insert watches would see: wake the pulls here and elsewhere.
        for name in topics:
            self.hub.notify(name, now)
        if topics and self.signals is not None:
            self.signals.released(topics)
        return pb.RequeueReply(requeued=moved)

    @rpc
    def PutSchedule(self, request: pb.PutScheduleRequest, context: grpc.ServicerContext) -> pb.PutScheduleReply:
        """Declare a periodic message; declaring the same one again changes nothing."""
        schedule = check_schedule(request.name, request.topic, request.cron, request.data or "null",
                                  request.timezone or "UTC", request.missed or "once",
                                  None if request.retry == -1 else request.retry, data_is_json=True)
        existing = self.storage.schedules.get_schedule(schedule.name)
        # Moving a schedule to another topic needs the right on the topic it leaves as well.
        authorize("PutSchedule", {schedule.topic} | ({existing.topic} if existing else set()))
        now = clock.now()
        created = self.storage.schedules.put_schedule(schedule, now)
        following = next_tick(schedule, now)  # from the cron and zone just stored
        return pb.PutScheduleReply(created=created,
                                   next_tick_ms=clock.to_epoch_ms(following) if following else 0)

    def _produce_steps(self, steps: list[WorkflowStep], request_id: str) -> list[int]:
        """A Produce with dependencies: its own transaction beside the group commit (its rows
        read and lock the messages they wait on, which a shared multi-row INSERT must not wait
        for). Waiting on a message reveals whether it is stored, so it needs the right to
        produce to that message's topic too."""
        self._authorize_messages("Produce", sorted({id for step in steps for id in step.depends_on}))
        self.topics.ensure(sorted({step.row.topic for step in steps}))
        ids = self.storage.dependencies.insert_steps(steps, clock.now(), request_id, broker=self.name)
        for topic, n in Counter(step.row.topic for step in steps).items():  # not a group commit's rows
            child(metrics.PRODUCED, topic).inc(n)
        # As after a group commit, for the steps that may be NEW now: a step waiting on another
        # of the same submission is WAITING, and waking pulls for it cost each waiting consumer
        # a lock that finds nothing (twice: the insert watch would report the ids again).
        self.hub.notify_commit(arrivals((step.row.topic, step.row.priority, step.row.effect_time)
                                        for step in steps if not step.after), ids)
        return ids

    def _authorize_messages(self, method: str, ids: list[int]) -> None:
        """``authorize`` on the topics of the stored messages ``ids`` (one read, skipped for a
        caller whose patterns cover every topic)."""
        authorize(method, self.storage.reads.message_topics(ids) if checks_topics() else ())


def _result_state(id: int, state: Optional[MessageResult]) -> pb.ResultState:
    if state is None:
        return pb.ResultState(id=id, found=False)
    return pb.ResultState(
        id=id, found=True, status=state.status, result=state.result or "", progress=state.progress or "",
        effect_time_ms=clock.to_epoch_ms(state.effect_time),
        finish_time_ms=clock.to_epoch_ms(state.finish_time) if state.finish_time is not None else 0,
        cancel_requested=bool(state.cancel_requested))


def _delivery(msg: LeasedMessage) -> pb.Delivery:
    return pb.Delivery(
        id=msg.id, topic=msg.topic, data=msg.data, effect_time_ms=clock.to_epoch_ms(msg.effect_time),
        retry_remaining=msg.retry_remaining, attempt=msg.attempt, lease_token=msg.lease_token or "",
        ttr_seconds=float(msg.ttr or 0), trace_context=msg.trace_context or "", depends_on=msg.depends_on,
        workflow_id=msg.workflow_id or 0,
    )
