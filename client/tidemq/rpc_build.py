"""Protobuf requests from the client's arguments, and tidemq types from the replies.

Shared by :class:`tidemq.client.Client` and :class:`tidemq.aio.AsyncClient`, so both check their
input the same way and send the same requests; only how the RPC is made differs.
"""

from __future__ import annotations

import copy
import time
import uuid
from datetime import datetime, timezone
from typing import Any, Iterable, Optional, Sequence, Union

from .coalesce import Request
from .errors import (BrokerUnavailableError, ConfigurationError, MalformedRequestError, PermissionDeniedError,
                     TidemqError, ValidationError, quote)
from .clock import from_epoch_ms
from .lifecycle import MessageStatus
from .limits import MAX_DEPENDENCIES, MAX_RESULT_IDS
from .link import AckItem, AckOutcome, Delivery, Heartbeat, LeaseRef, ProgressRef
from .results import MessageState, parse_progress
from .rpc import tidemq_pb2 as pb
from .validation import (
    MAX_BATCH,
    check_batch_size,
    check_flow_key,
    check_priority,
    check_topic,
    check_unique_key,
    check_when,
    encode_data,
    parse_retry,
)

__all__ = ["Retry", "RPC_DATA_BYTES", "not_sent", "check_produce_batch", "produce_template", "produce_messages",
           "cancel_request", "requeue_request", "pull_request", "ack_request", "ack_outcomes", "extend_request",
           "delivery", "spread_ids", "produce_call", "settle_produce", "dependency_ids", "alone_request", "workflow_id",
           "cancel_workflow_request"]

Retry = Union[None, int, Sequence[Union[int, float, str]]]
#: Data bytes one shared Produce RPC carries; a single larger request is still sent, alone.
RPC_DATA_BYTES = 8 * 1024 * 1024


def not_sent(timeout: float) -> BrokerUnavailableError:
    """The error of a produce still queued behind busy Produce RPCs at its deadline."""
    return BrokerUnavailableError(
        f"Produce was not sent within {timeout:.1f} s: this client's produce calls stayed busy")


def check_produce_batch(datas: list[Any], unique_keys: Optional[Sequence[Optional[str]]],
                        keys: Optional[Sequence[Optional[str]]] = None) -> None:
    """The batch limits of one produce call, checked before anything else."""
    check_batch_size(datas)
    for name, per_message in (("unique_keys", unique_keys), ("keys", keys)):
        if per_message is not None and len(per_message) != len(datas):
            raise ConfigurationError(f"{name} has {len(per_message)} entries for {len(datas)} messages")


def produce_template(topic: str, delay: Optional[float], effect_time: Optional[datetime],
                     retry: Retry, priority: int = 0) -> pb.NewMessage:
    """What every message of one produce call shares: topic, due time, retries and priority (all
    checked)."""
    msg = pb.NewMessage(topic=check_topic(topic), priority=check_priority(priority))
    delay, effect_time = check_when(delay, effect_time)
    if delay is not None:
        msg.delay_seconds = delay
    elif effect_time is not None:
        msg.effect_time_ms = int(effect_time.timestamp() * 1000)
    count, schedule = parse_retry(retry)
    msg.retry = count
    if schedule is not None:
        msg.retry_schedule.extend(schedule)
    return msg


def dependency_ids(depends_on: Optional[Iterable[Any]]) -> list[int]:
    """The message ids ``depends_on`` names: ids, or handles (anything with an ``id``), checked
    before anything is sent."""
    ids: list[int] = []
    for item in depends_on or ():
        id = getattr(item, "id", item)
        if isinstance(id, bool) or not isinstance(id, int) or id <= 0:
            raise MalformedRequestError(f"depends_on must hold message ids (positive integers) or handles, "
                                        f"got {quote(item)}")
        ids.append(id)
    if len(ids) > MAX_DEPENDENCIES:
        raise MalformedRequestError(f"depends_on names {len(ids):,} messages; the limit is {MAX_DEPENDENCIES:,} "
                                    "(MAX_DEPENDENCIES)")
    return ids


def alone_request(messages: Sequence[pb.NewMessage]) -> pb.ProduceRequest:
    """A Produce request of one call's messages with dependencies, never shared with other
    callers: the broker stores such a request in a transaction of its own, which locks the
    messages waited on, and would make any message sharing it part of the workflow."""
    return pb.ProduceRequest(messages=list(messages), request_id=uuid.uuid4().hex)


def produce_messages(template: pb.NewMessage, datas: list[Any], unique_keys: Optional[Sequence[Optional[str]]],
                     max_data_bytes: int, keys: Optional[Sequence[Optional[str]]] = None) -> list[pb.NewMessage]:
    """One NewMessage per item of ``datas``, each encoded and checked (errors name the item)."""
    messages = []
    for index, data in enumerate(datas):
        msg = pb.NewMessage()
        msg.CopyFrom(template)
        try:
            msg.data = encode_data(data, max_data_bytes)
        except ValueError as exc:
            raise type(exc)(f"message #{index}: {exc}" if len(datas) > 1 else str(exc)) from None
        if unique_keys is not None:
            msg.unique_key = check_unique_key(unique_keys[index])
        if keys is not None:
            msg.key = check_flow_key(keys[index])
        messages.append(msg)
    return messages


def produce_call(batch: Sequence[Request[Sequence[pb.NewMessage], list[int]]],
                 default_timeout: float, named: bool = True) -> tuple[pb.ProduceRequest, float]:
    """The one Produce request that carries every request of a coalesced ``batch``, and its
    timeout (the latest caller's deadline). Its request id is kept by the pool's retries on other
    brokers: a retry of a call committed before its answer was lost stores nothing twice.
    ``named=False`` (a direct commit, which nothing retries and which stores no request id):
    without one."""
    deadlines = [r.deadline for r in batch if r.deadline is not None]
    timeout = max(max(deadlines) - time.monotonic(), 0.001) if deadlines else default_timeout
    messages = [m for r in batch for m in r.payload]
    return pb.ProduceRequest(messages=messages, request_id=uuid.uuid4().hex if named else ""), timeout


def settle_produce(batch: Sequence[Request[Sequence[pb.NewMessage], list[int]]],
                   ids: Optional[Sequence[int]] = None, error: Optional[TidemqError] = None) -> bool:
    """Give each request of ``batch`` its share of the reply's ``ids``, or the call's ``error``.

    Returns True when the requests must be sent again one by one instead: the broker validates
    and authorizes a whole request before it writes any of it, so a ValidationError or
    PermissionDeniedError of a shared call means nothing was stored, and sent alone each request
    shows whether the bad input (or forbidden topic) was its own. Any other error (the outcome
    may be unknown) reaches every caller as it is, each its own copy (tracebacks are per raise).
    """
    if error is None:
        try:
            shares = spread_ids(ids or [], [r.items for r in batch])
        except TidemqError as exc:
            error = exc
        else:
            for request, share in zip(batch, shares):
                request.result = share
            return False
    if isinstance(error, (ValidationError, PermissionDeniedError)) and len(batch) > 1:
        return True
    for request in batch:
        request.error = copy.copy(error) if len(batch) > 1 else error
    return False


def spread_ids(ids: Sequence[int], sizes: Sequence[int]) -> list[list[int]]:
    """Cut one shared Produce reply's ids into each request's share, in request order."""
    if len(ids) != sum(sizes):
        raise TidemqError(f"the broker answered {len(ids)} ids for {sum(sizes)} messages")
    shares, start = [], 0
    for size in sizes:
        shares.append(list(ids[start:start + size]))
        start += size
    return shares


def cancel_request(ids: Sequence[int], running: bool = False) -> pb.CancelRequest:
    check_batch_size(ids, "ids")
    return pb.CancelRequest(ids=list(ids), running=running)


def workflow_id(workflow: Any) -> int:
    """The id of a workflow given as its id, or as a handle (or id) of its first step, which
    is what ``submit`` and a shape's ``produce`` return first."""
    if isinstance(workflow, (list, tuple)) and workflow:
        workflow = workflow[0]
    id = getattr(workflow, "id", workflow)
    if isinstance(id, bool) or not isinstance(id, int) or id <= 0:
        raise MalformedRequestError(f"a workflow is named by its id (a positive integer: the id of its first "
                                    f"step), a handle of that step, or what submit returned; got {quote(workflow)}")
    return id


def cancel_workflow_request(workflow: Any, running: bool = False) -> pb.CancelRequest:
    return pb.CancelRequest(ids=[workflow_id(workflow)], running=running, workflow=True)


def results_request(ids: Sequence[int], wait: float) -> pb.ResultsRequest:
    check_batch_size(ids, "ids")
    if len(ids) > MAX_RESULT_IDS:
        raise ConfigurationError(f"at most {MAX_RESULT_IDS} ids per Results call, got {len(ids)}")
    return pb.ResultsRequest(ids=list(ids), wait_seconds=wait)


def message_state(state: pb.ResultState) -> MessageState:
    """A broker's answer about one message as a :class:`MessageState`."""
    if not state.found:
        return MessageState(state.id, False)
    return MessageState(state.id, True, MessageStatus(state.status), state.result or None,
                        parse_progress(state.progress), from_epoch_ms(state.effect_time_ms),
                        from_epoch_ms(state.finish_time_ms) if state.finish_time_ms else None, state.cancel_requested)


def requeue_request(ids: Optional[Sequence[int]], topic: Optional[str], retry: int) -> pb.RequeueRequest:
    return pb.RequeueRequest(ids=list(ids or ()), topic=topic or "", retry=retry)


def pull_request(topic: str, consumer: str, *, rank: int = 0, total: int = 1, serial: bool = False,
                 max_messages: int = 100, wait: float = 5.0, ttr: float = 0.0, lease_token: str = "",
                 ahead: float = 0.0, hold: float = 0.0) -> pb.PullRequest:
    return pb.PullRequest(topic=topic, consumer=consumer, rank=rank, total=total, serial=serial,
                          max_messages=max_messages, wait_seconds=wait, ttr_seconds=ttr, lease_token=lease_token,
                          ahead_seconds=ahead, hold_seconds=hold)


def ack_request(topic: str, consumer: str, items: Sequence[AckItem]) -> pb.AckRequest:
    if len(items) > MAX_BATCH:
        raise ConfigurationError(f"at most {MAX_BATCH} acks per call")
    return pb.AckRequest(consumer=consumer, topic=topic, items=[
        pb.AckItem(id=i.id, lease_token=i.lease_token, success=i.success, error=i.error, result=i.result or "",
                   cancelled=i.cancelled, workflow=i.workflow, workflow_id=i.workflow_id or 0) for i in items])


def ack_outcomes(reply: pb.AckReply) -> list[AckOutcome]:
    return [AckOutcome.APPLIED if o == pb.APPLIED else AckOutcome.STALE for o in reply.outcomes]


def extend_request(leases: Sequence[LeaseRef], ttr: float, consumer: str,
                   progress: Sequence[ProgressRef] = ()) -> pb.ExtendRequest:
    if len(leases) > MAX_BATCH:
        raise ConfigurationError(f"at most {MAX_BATCH} leases per extend call")
    reports = [pb.ProgressReport(id=p.id, lease_token=p.lease_token, done=p.done, total=p.total or 0.0,
                                 has_total=p.total is not None, note=p.note) for p in progress]
    return pb.ExtendRequest(leases=[pb.LeaseRef(id=l.id, lease_token=l.lease_token) for l in leases],
                            ttr_seconds=ttr, consumer=consumer, progress=reports)


def heartbeat(reply: pb.ExtendReply, leases: int) -> Heartbeat:
    """An Extend reply as a :class:`Heartbeat` (a broker without cancel flags: none requested)."""
    flags = list(reply.cancel_requested)
    return Heartbeat(list(reply.extended), flags if len(flags) == leases else [False] * leases)


def delivery(d: pb.Delivery, broker: str = "") -> Delivery:
    """A pulled message as the consumer side's :class:`Delivery` (leased by ``broker``)."""
    return Delivery(id=d.id, topic=d.topic, data=d.data,
                    effect_time=datetime.fromtimestamp(d.effect_time_ms / 1000, tz=timezone.utc),
                    retry_remaining=d.retry_remaining, attempt=d.attempt, lease_token=d.lease_token,
                    ttr=d.ttr_seconds, trace_context=d.trace_context, depends_on=tuple(d.depends_on),
                    broker=broker, workflow_id=d.workflow_id or None)
