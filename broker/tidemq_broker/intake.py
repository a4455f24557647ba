"""Turns wire requests into validated rows; trusts nothing a client sent."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Optional, Sequence

from tidemq import validation
from tidemq.rpc import tidemq_pb2 as pb
from tidemq.validation import (
    MAX_BATCH,
    MAX_RETRIES,
    check_batch_size,
    check_data_text,
    check_delay,
    check_topic,
    check_flow_key,
    check_lease_ttr,
    check_priority,
    check_unique_key,
    check_workflow_steps,
    parse_duration,
)

from tidemq import clock
from tidemq.dependencies import check_wait_mode
from tidemq.limits import MAX_AHEAD, MAX_DEPENDENCIES, MAX_PULL, MAX_RESULT_IDS, MAX_TTR, MAX_WAIT, check_lease_token
from tidemq.link import AckItem
from tidemq.results import check_result_text, max_result_bytes, progress_text
from tidemq.tracing import check_traceparent
from .errors import InvalidRetryError, MalformedRequestError, ValidationError, quote
from .new_row import due_at, new_row
from .storage import NewRow, WorkflowStep
from .topics import TopicCache

__all__ = ["rows_from_request", "steps_from_request", "check_pull", "check_ids", "check_lease_token", "check_lease_ttr",
           "MAX_PULL", "MAX_WAIT", "MAX_TTR", "MAX_AHEAD", "check_request_id", "check_ack_result", "ack_items",
           "check_progress", "check_result_ids", "check_wait"]

_REQUEST_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def rows_from_request(request: pb.ProduceRequest, topics: TopicCache, max_data_bytes: int) -> list[NewRow]:
    """Validate every message of a produce request; the first bad one rejects them all. A
    workflow's (any message waits on another) may hold up to MAX_WORKFLOW_STEPS messages."""
    if len(request.messages) > MAX_BATCH and any(msg.depends_on or msg.after for msg in request.messages):
        check_workflow_steps(len(request.messages))
    else:
        check_batch_size(request.messages)
    now = clock.now()
    rows = []
    for index, msg in enumerate(request.messages):
        try:
            rows.append(_row(msg, topics, max_data_bytes, now))
        except ValidationError as exc:
            prefix = f"message #{index}: " if len(request.messages) > 1 else ""
            raise type(exc)(prefix + str(exc)) from None
    return rows


def steps_from_request(request: pb.ProduceRequest, rows: Sequence[NewRow]) -> Optional[list[WorkflowStep]]:
    """The request's rows as steps with their dependencies (stored ids, and positions of other
    messages of the request), or None when no message has any (a plain produce, for the group
    commit). Ids must be positive; whether they are stored, and whether the positions make a
    cycle, is the storage's to say before it writes anything."""
    for index, msg in enumerate(request.messages):
        if msg.wait_mode and not (msg.depends_on or msg.after):
            prefix = f"message #{index}: " if len(request.messages) > 1 else ""
            raise MalformedRequestError(f"{prefix}wait_mode {msg.wait_mode} needs dependencies "
                                        "(depends_on or after): a message waiting on nothing has no mode")
    if not any(msg.depends_on or msg.after for msg in request.messages):
        return None
    steps = []
    for index, (msg, row) in enumerate(zip(request.messages, rows)):
        if not (msg.depends_on or msg.after):  # a group's member: waits on nothing (its mode is 0, checked above)
            steps.append(WorkflowStep(row))
            continue
        prefix = f"message #{index}: " if len(request.messages) > 1 else ""
        if len(msg.depends_on) > MAX_DEPENDENCIES:
            raise MalformedRequestError(f"{prefix}depends_on names {len(msg.depends_on):,} messages; "
                                        f"the limit is {MAX_DEPENDENCIES:,} (MAX_DEPENDENCIES)")
        if any(id <= 0 for id in msg.depends_on):
            raise MalformedRequestError(f"{prefix}depends_on must name message ids (positive integers)")
        try:
            mode = check_wait_mode(msg.wait_mode)
        except ValueError as exc:
            raise MalformedRequestError(f"{prefix}{exc}") from None
        # Positions: checked by the storage.
        steps.append(WorkflowStep(row, tuple(msg.depends_on), tuple(msg.after), int(mode)))
    return steps


def _row(msg: pb.NewMessage, topics: TopicCache, max_data_bytes: int, now: datetime) -> NewRow:
    topic = check_topic(msg.topic)
    settings = topics.get(topic)
    check_data_text(msg.data, settings.max_data_bytes or max_data_bytes)
    which = msg.WhichOneof("when")
    due = due_at(now, check_delay(msg.delay_seconds) if which == "delay_seconds" else None,
                 msg.effect_time_ms if which == "effect_time_ms" else None)
    schedule = None
    if msg.retry_schedule:
        if len(msg.retry_schedule) > MAX_RETRIES:
            raise InvalidRetryError(f"retry schedule has {len(msg.retry_schedule)} entries; the limit is {MAX_RETRIES}")
        schedule = [parse_duration(v) for v in msg.retry_schedule]
    elif msg.retry != -1 and not 0 <= msg.retry <= MAX_RETRIES:
        raise InvalidRetryError(f"retry count must be between 0 and {MAX_RETRIES} (or -1 for the topic's default), "
                                f"got {msg.retry}")
    try:
        trace_context = check_traceparent(msg.trace_context) or None
    except ValueError as exc:
        raise MalformedRequestError(str(exc)) from None
    return new_row(topic, msg.data, settings, due, retry=msg.retry,
                   retry_schedule=schedule, unique_key=check_unique_key(msg.unique_key) or None,
                   trace_context=trace_context, priority=check_priority(msg.priority),
                   flow_key=check_flow_key(msg.key) or None)


def check_pull(request: pb.PullRequest) -> None:
    """Reject pull requests whose numbers make no sense."""
    validation.check_pull(request.topic, rank=request.rank, total=request.total, max_messages=request.max_messages,
                          wait=request.wait_seconds, ttr=request.ttr_seconds, ahead=request.ahead_seconds,
                          hold=request.hold_seconds,
                          consumer=request.consumer, lease_token=request.lease_token)


def check_request_id(request_id: str) -> str:
    """A Produce call's request id: empty (no deduplication) or 1-64 of [A-Za-z0-9_-]."""
    if request_id and not _REQUEST_ID.fullmatch(request_id):
        raise MalformedRequestError(f"request_id must be 1-64 characters of A-Z a-z 0-9 _ -, got {quote(request_id)}")
    return request_id


def check_ids(ids: Sequence[int], what: str = "ids") -> list[int]:
    """Reject empty, oversized or non-positive id lists."""
    check_batch_size(ids, what)
    bad = [i for i in ids if i <= 0]
    if bad:
        raise MalformedRequestError(f"{what} must be positive message ids, got {bad[0]}")
    return list(ids)


def check_ack_result(text: str, limit: Optional[int] = None) -> "str | None":
    """An ack's result: strict JSON within the result limit (``limit`` bytes; None: the
    configured one, read from the environment); empty: none."""
    return check_result_text(text, limit)


def ack_items(request: pb.AckRequest) -> list[AckItem]:
    """The outcomes of an Ack call, each result checked (``check_ack_result``)."""
    limit = max_result_bytes()  # once per call, not per item: it reads the environment
    return [AckItem(i.id, i.lease_token, i.success, i.error, check_ack_result(i.result, limit), i.cancelled, i.workflow,
                    i.workflow_id or None) for i in request.items]


def check_progress(report: pb.ProgressReport, now: datetime) -> str:
    """A progress report as stored, stamped with the broker's time."""
    return progress_text(report.done, report.total if report.has_total else None, report.note,
                         clock.to_epoch_ms(now))


def check_result_ids(ids: Sequence[int]) -> list[int]:
    """The ids of a Results call: 1 to MAX_RESULT_IDS positive ids."""
    if len(ids) > MAX_RESULT_IDS:
        raise MalformedRequestError(f"a Results call reads {len(ids)} ids; the limit is {MAX_RESULT_IDS} per call")
    return check_ids(ids)


def check_wait(wait: float) -> float:
    """A long-poll's wait: 0 to MAX_WAIT seconds."""
    if not (wait == wait and 0 <= wait <= MAX_WAIT):
        raise MalformedRequestError(f"wait_seconds must be between 0 and {MAX_WAIT}, got {wait}")
    return float(wait)
