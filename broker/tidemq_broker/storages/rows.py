"""A message row as plain values, shared by the SQL and the memory storage.

What an insert writes (:func:`row_values`, for the group commit and ``tidemq.enqueue`` alike),
what a lease writes (:func:`lease_change`) and hands out (:func:`leased`), and what a stored
row reads as (:func:`to_message`). Rows are ``{column name: value}`` with the names of
``tidemq.tables.MESSAGE``, the form ``tidemq.lifecycle.Change.apply_to`` works on.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Mapping, NamedTuple, Sequence

from tidemq import lifecycle
from tidemq.lifecycle import Change, MessageStatus
from tidemq.link import AckItem, AckOutcome
from tidemq.limits import new_lease_token
from tidemq.tables import MESSAGE as M

from ..records import LeasedMessage, LockRequest, MessageEdit, NewRow, StoredMessage

__all__ = ["AckSort", "sort_acks", "INSERT_COLUMNS", "insert_columns", "row_values", "lease_change", "leased",
           "to_message", "expiries", "lock_order", "recorded_as", "edit_change"]

#: Every column an INSERT writes (all but the id), in the table's order.
INSERT_COLUMNS = [name for name in M.columns() if name != M.id]


def insert_columns(change: Change) -> dict[str, Any]:
    """The columns a new row takes from ``change`` (the lifecycle's ``produce``, or a workflow
    step's start), its trace included: made once per call and given to :func:`row_values` for
    each row (merging them row by row was a tenth of a large submission's CPU time). With the
    row's own they must be exactly the INSERT's columns: a value left out would be lost."""
    columns = {M.trace: change.trace, **change.values}
    if _ROW_OWN | set(columns) != set(INSERT_COLUMNS):
        raise ValueError(f"an INSERT of {M.name} writes {sorted(INSERT_COLUMNS)}, "
                         f"not {sorted(_ROW_OWN | set(columns))}")
    return columns


def row_values(row: NewRow, columns: Mapping[str, Any]) -> dict[str, Any]:
    """The full INSERT values of ``row``, started by a change's ``columns`` (:func:`insert_columns`;
    what the change sets wins over the row's own)."""
    return {
        M.topic: row.topic,
        M.data: row.data,
        M.effect_time: row.effect_time,
        M.order_time: row.effect_time,
        M.retry_remaining: row.retry_remaining,
        M.retry_schedule: json.dumps(row.retry_schedule) if row.retry_schedule is not None else None,
        M.unique_key: row.unique_key or None,
        M.trace_context: row.trace_context or None,
        M.priority: row.priority,
        M.flow_key: row.flow_key or None,
        **columns,
    }


#: The columns a row gives its INSERT itself (``row_values``); the change gives the rest.
_ROW_OWN = {M.topic, M.data, M.effect_time, M.order_time, M.retry_remaining, M.retry_schedule, M.unique_key,
            M.trace_context, M.priority, M.flow_key}


def lease_change(request: LockRequest, serial: bool = False) -> Change:
    """The lifecycle's lease for the rows ``request`` locks, under its token or a fresh one; a
    batch lease names the shard in the trace."""
    where = {} if serial else {"rank": f"{request.shard.rank}/{request.shard.total}"}
    return lifecycle.lease(request.now, request.ttr, request.consumer, request.lease_token or new_lease_token(),
                           request.ahead, request.hold, **where, broker=request.broker or None)


def lock_order(row: Mapping[str, Any]) -> tuple[int, Any, int]:
    """The order a lock takes and hands out due messages in: higher priority first, then oldest
    due, then lowest id."""
    return -row[M.priority], row[M.effect_time], row[M.id]


def leased(row: Mapping[str, Any], topic: str, depends_on: tuple[int, ...] = ()) -> LeasedMessage:
    """The delivery of ``row`` (at least the columns a delivery holds) once a lease's change was
    applied to it (``Change.apply_to``), naming the messages it waited on (``depends_on``)."""
    return LeasedMessage(row[M.id], topic, row[M.data], row[M.status], row[M.effect_time], row[M.retry_remaining],
                         row[M.attempt], row[M.ttr], row[M.lease_token], row[M.consumer], row[M.trace_context],
                         row[M.priority], depends_on, row.get(M.workflow_id))


def to_message(row: Mapping[str, Any]) -> StoredMessage:
    """A full message row as a StoredMessage."""
    values = {name: value for name, value in row.items() if name not in M.generated()}
    schedule = values.get(M.retry_schedule)
    values[M.retry_schedule] = json.loads(schedule) if schedule else None
    return StoredMessage(**values)


def expiries(trace: str) -> int:
    """How many times a message's lease expired before (``lifecycle.lease_expiries``; the trace
    may be NULL)."""
    return lifecycle.lease_expiries(trace or "")


def recorded_as(item: AckItem) -> tuple[str, ...]:
    """The statuses a row ends in once ``item`` was applied: a repeat of it finds one of them
    (a failure after a cancel request ends CANCELLED)."""
    if item.cancelled:
        return (MessageStatus.CANCELLED.value,)
    if item.success:
        return (MessageStatus.SUCCESS.value,)
    return MessageStatus.FAIL.value, MessageStatus.CANCELLED.value


class AckSort(NamedTuple):
    """An ack batch judged against the rows' leases: each item's outcome, in order, and the
    items to apply, by what they record."""

    outcomes: list[AckOutcome]
    succeeded: list[AckItem]
    failed: list[AckItem]
    cancelled: list[AckItem]


def sort_acks(items: Sequence[AckItem], held: Mapping[int, str], done: Mapping[int, tuple[str, str]]) -> AckSort:
    """Judge ``items`` as every storage does: ``held`` maps each RUNNING row of theirs to its
    lease token, ``done`` each finished one to (status, the token it finished under), both read
    before the batch. An item applies when its row runs under its token (once per row: a second
    item of the same row is judged as a repeat); a repeat of an ack this lease already recorded
    (its reply was lost with a connection or a broker) is answered as applied and changes
    nothing; anything else is stale."""
    running = dict(held)
    sort = AckSort([], [], [], [])
    for item in items:
        if running.pop(item.id, None) != item.lease_token:
            status, token = done.get(item.id, ("", ""))
            repeat = token == item.lease_token and status in recorded_as(item)
            sort.outcomes.append(AckOutcome.APPLIED if repeat else AckOutcome.STALE)
            continue
        sort.outcomes.append(AckOutcome.APPLIED)
        (sort.cancelled if item.cancelled else sort.succeeded if item.success else sort.failed).append(item)
    return sort


def edit_change(edit: MessageEdit, now: datetime, user: str, changed: Sequence[str]) -> Change:
    """The lifecycle's console edit of the fields ``edit`` sets, as every storage applies it."""
    values: dict[str, Any] = {}
    if edit.data is not None:
        values[M.data] = edit.data
    if edit.retry_remaining is not None:
        values[M.retry_remaining] = edit.retry_remaining
    if edit.effect_time is not None:
        values[M.effect_time] = edit.effect_time
    status = MessageStatus(edit.status) if edit.status is not None else None
    return lifecycle.admin_edit(now, user, status, changed, values)
