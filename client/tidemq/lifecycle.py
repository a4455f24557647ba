"""The message lifecycle: the states a message can be in and every transition between them.

This module is the one owner of the state machine. Each function below decides one transition
and returns a :class:`Change`: the states the message may leave (the guard), the state it
enters (or that the row is deleted), the columns it sets and the trace line it appends. The
storage applies a Change as it is, guarded by the source states, and adds nothing of its own,
so client, broker, console and pipeline agree on what each transition does::

    NEW --lease--> RUNNING --succeed--> SUCCESS
                   RUNNING --fail_attempt, retries left--> NEW (effect_time = now + backoff)
                   RUNNING --fail_attempt, none left--> FAIL
                   RUNNING --release (pull abandoned, attempt not counted)--> NEW
                   RUNNING --expire, deliveries < max_deliveries--> NEW (trace names who lost it)
                   RUNNING --expire, deliveries >= max_deliveries--> FAIL (a poison message)
                   RUNNING --extend (heartbeat, touch)--> RUNNING, lease_expire moved
                   RUNNING --report_progress--> RUNNING, progress set (no version, no trace)
                   RUNNING --request_cancel--> RUNNING, cancel_requested set
                   RUNNING (cancel requested) --cancelled: the handler stopped, or its lease
                           ran out, or it failed or was released--> CANCELLED
    NEW --cancel--> gone            any but RUNNING --admin_delete--> gone
    SUCCESS --retire (the broker's retention)--> gone
    SUCCESS | FAIL | CANCELLED --forget_result (result retention)--> the same, result cleared
    FAIL --requeue--> NEW           any but RUNNING --admin_edit--> the status the admin chose
    SUCCESS | FAIL | CANCELLED --archive (pipeline)--> gone from MySQL, kept in Parquet --restore--> NEW
    WAITING (dependencies not all succeeded; ``tidemq.dependencies``) --release--> NEW
    WAITING --dependency_failed (policy stop)--> CANCELLED     WAITING --cancel--> gone

Every change moves ``version`` on (the console's optimistic lock) except a lease extension,
which a heartbeat repeats every few seconds and which changes nothing an operator edits, and a
progress report or a result's expiry, for the same reason.

A finished message keeps its lease token: an ack that repeats one already recorded is answered
as applied, and any other ack of a finished row (a late one after CANCELLED included) is stale.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Optional, Sequence

from . import trace
from .clock import after
from .policies import (Attempted, Backoff, HandlerOutcome, _Named, handler_outcome, next_delay,
                       retention_deletes_success, retries_left)
from .tables import MESSAGE as M

__all__ = [
    "MessageStatus", "STATUSES", "EDITABLE_STATUSES", "ARCHIVABLE_STATUSES", "FINAL_STATUSES", "Event", "Change",
    "DEFAULT_MAX_DELIVERIES", "DEFAULT_RETENTION_DAYS", "DEFAULT_RETRY_COUNT", "DEFAULT_RETRY_BASE",
    "DEFAULT_RETRY_MAX", "DEFAULT_TTR",
    "produce", "lease", "succeed", "fail_attempt", "release", "extend", "delivered_out", "expire", "lease_expiries",
    "lease_lost", "requeue", "cancel", "retire", "admin_edit", "admin_delete", "restore",
    "request_cancel", "cancelled", "report_progress", "forget_result", "DEFAULT_RESULT_RETENTION",
    "next_delay", "retries_left", "HandlerOutcome", "handler_outcome", "retention_deletes_success",
]

DEFAULT_MAX_DELIVERIES = 10
#: A topic never configured: retries of a message produced without ``retry``, the backoff between
#: them (seconds, see next_delay) and the lease length of a pull that names none.
DEFAULT_RETRY_COUNT = 3
DEFAULT_RETRY_BASE = 10.0
DEFAULT_RETRY_MAX = 3600.0
DEFAULT_TTR = 60
#: Days a topic without settings keeps its SUCCESS messages (see retention_deletes_success).
DEFAULT_RETENTION_DAYS = 7
#: Seconds a topic without a setting keeps the results (and progress) of its finished messages.
DEFAULT_RESULT_RETENTION = 86_400


class MessageStatus(_Named):
    """The states of a stored message and what moves a message out of each.

    WAITING: produced with dependencies that have not all succeeded; never locked, never
    expired. The SUCCESS of its last dependency releases it to NEW in the same transaction
    (``tidemq.dependencies.released``); a dependency's FAIL or CANCELLED cancels it
    (``dependency_failed``); cancel or an admin delete removes it.
    NEW: waiting for its effect_time; a lease moves it to RUNNING, cancel or an admin delete
    removes it.
    RUNNING: leased to one consumer until lease_expire. Its holder's ack moves it to SUCCESS,
    NEW (a retry) or FAIL; a release gives it back to NEW; an expired lease moves it to NEW, or to
    FAIL once it has been delivered ``max_deliveries`` times.
    SUCCESS: done; retention deletes it or the archive moves it to Parquet.
    FAIL: a dead letter (retries exhausted or a poison message); requeue moves it back to NEW,
    the archive moves it to Parquet.
    CANCELLED: final; its cancel was requested while it ran and its handler stopped (or its
    worker died, or its attempt failed). Nothing revives it but an operator's edit; the archive
    moves it to Parquet.
    """

    NEW = "NEW"
    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAIL = "FAIL"
    CANCELLED = "CANCELLED"
    WAITING = "WAITING"


NEW, RUNNING, SUCCESS, FAIL = MessageStatus.NEW, MessageStatus.RUNNING, MessageStatus.SUCCESS, MessageStatus.FAIL
CANCELLED, WAITING = MessageStatus.CANCELLED, MessageStatus.WAITING
STATUSES: tuple[MessageStatus, ...] = tuple(MessageStatus)
#: What an operator may set and change by hand: RUNNING belongs to a consumer's lease.
EDITABLE_STATUSES: tuple[MessageStatus, ...] = tuple(s for s in STATUSES if s is not RUNNING)
#: Finished messages: what the archive moves to Parquet and a restore may put back.
ARCHIVABLE_STATUSES: tuple[MessageStatus, ...] = (SUCCESS, FAIL, CANCELLED)
#: States nothing but an operator moves a message out of: a result waiter stops at them.
FINAL_STATUSES: tuple[MessageStatus, ...] = ARCHIVABLE_STATUSES


class Event(_Named):
    """The event names that start trace lines."""

    PRODUCED = "PRODUCED"
    LOCKED = "LOCKED"
    SUCCESS = "SUCCESS"
    RETRY = "RETRY"
    FAIL = "FAIL"
    RELEASED = "RELEASED"
    LEASE_EXPIRED = "LEASE_EXPIRED"
    EXTENDED = "EXTENDED"
    REQUEUED = "REQUEUED"
    CANCELLED = "CANCELLED"
    CANCEL_REQUESTED = "CANCEL_REQUESTED"
    ADMIN_RETRY = "ADMIN_RETRY"
    ADMIN_REQUEUE = "ADMIN_REQUEUE"
    ADMIN_EDIT = "ADMIN_EDIT"
    ADMIN_DELETE = "ADMIN_DELETE"
    RESTORED = "RESTORED"
    RETIRED = "RETIRED"
    DEPENDENCY_MET = "DEPENDENCY_MET"
    DEPENDENCY_FAILED = "DEPENDENCY_FAILED"
    DEPENDENCIES_SUCCEEDED = "DEPENDENCIES_SUCCEEDED"


@dataclass(frozen=True)
class Change:
    """One transition, as a storage applies it to each row it selects.

    ``source``: the states the row must be in (the guard; empty for an insert). ``target``: the
    state it enters (None: it keeps its state). ``delete``: the row is removed instead.
    ``values``: columns set (by name, see :mod:`tidemq.tables`). ``attempt_delta`` is added to
    ``attempt``; ``trace`` is appended to the trace column; ``version`` moves on by one when
    ``bump_version``.
    """

    event: Event
    source: tuple[MessageStatus, ...]
    target: Optional[MessageStatus]
    values: dict[str, Any] = field(default_factory=dict)
    attempt_delta: int = 0
    trace: str = ""
    bump_version: bool = True
    delete: bool = False

    def allows(self, row: dict[str, Any]) -> bool:
        """Whether a message held as ``row`` ({column name: value}, names of
        :mod:`tidemq.tables`, ``status`` a string) is in a state this change may leave."""
        return not self.source or row[M.status] in {status.value for status in self.source}

    def then(self, other: "Change") -> "Change":
        """This change and ``other`` after it, as one write: from this one's source states to
        ``other``'s target, with the values of both (``other``'s win), both attempts and both
        trace lines (a step released and leased by the same transaction: one UPDATE)."""
        return Change(other.event, self.source, other.target or self.target, {**self.values, **other.values},
                      self.attempt_delta + other.attempt_delta, self.trace + other.trace,
                      self.bump_version or other.bump_version)

    def apply_to(self, row: dict[str, Any]) -> None:
        """Apply this change to a message held in memory as ``row`` (the doubles: the stub
        broker, the memory storage), as ``tidemq_broker.storages.changes`` does in SQL. The
        caller checks ``allows`` (and any lease guard) first and removes a row to ``delete``."""
        row.update(self.values)
        if self.target is not None:
            row[M.status] = self.target.value
        row[M.attempt] = row.get(M.attempt, 0) + self.attempt_delta
        if self.bump_version:
            row[M.version] = row.get(M.version, 0) + 1
        if self.trace:
            row[M.trace] = row.get(M.trace, "") + self.trace


def _line(now: datetime, event: Event, **fields: object) -> str:
    return trace.line(now, event.value, **fields)


def _lease_cleared() -> dict[str, Any]:
    # lease_expire is NULL outside RUNNING: the (topic, status, lease_expire) index relies on it.
    return {M.lease_token: None, M.lease_expire: None}


# -- produce ---------------------------------------------------------------------------------
def produce(now: datetime, **who: object) -> Change:
    """A new message: NEW, no lease, attempt 0. ``who`` names the broker or console user."""
    values = {M.status: NEW.value, M.attempt: 0, M.ttr: None, M.consumer: None, M.version: 0, M.add_time: now,
              M.update_time: now, M.start_time: None, M.finish_time: None, M.result: None, M.progress: None,
              M.cancel_requested: False, M.deps_left: 0, M.workflow_id: None, M.wait_mode: 0, M.deps_failed: 0,
              **_lease_cleared()}
    return Change(Event.PRODUCED, (), NEW, values, trace=_line(now, Event.PRODUCED, **who))


# -- a consumer's lease ----------------------------------------------------------------------
def lease(now: datetime, ttr: int, consumer: str, lease_token: str, ahead: float = 0.0, hold: float = 0.0,
          **who: object) -> Change:
    """NEW -> RUNNING for ``ttr`` seconds under ``lease_token``; the delivery is counted.

    ``ahead`` > 0: the messages may be up to that many seconds from due, held by the consumer
    until their effect_time; the lease covers that wait on top of ``ttr``. ``hold``, when shorter
    than ``ttr``, is the lease instead: the consumer's heartbeats extend a message by ``hold``
    until its handler starts, by ``ttr`` from then on (``tidemq.lease_keeper``).
    """
    length = hold if 0 < hold < ttr else ttr
    values = {M.lease_token: lease_token, M.lease_expire: after(now, length + ahead), M.ttr: ttr,
              M.consumer: consumer[:255], M.start_time: now, M.update_time: now}
    extra = {"ahead": f"{ahead:g}s"} if ahead > 0 else {}
    if length < ttr:
        extra["hold"] = f"{hold:g}s"
    return Change(Event.LOCKED, (NEW,), RUNNING, values, attempt_delta=1,
                  trace=_line(now, Event.LOCKED, consumer=consumer, **who, ttr=ttr, **extra))


def succeed(now: datetime, consumer: str, broker: str, result: Optional[str] = None) -> Change:
    """RUNNING -> SUCCESS (the storage also checks the lease token), storing ``result``, the
    handler's return value as JSON text (None: it returned nothing), in the same write. (An ack
    of many results applies one such change with each message's result: the storage's
    ``apply_each``.)"""
    values = {M.finish_time: now, M.update_time: now, M.lease_expire: None, M.result: result}
    return Change(Event.SUCCESS, (RUNNING,), SUCCESS, values,
                  trace=_line(now, Event.SUCCESS, consumer=consumer, broker=broker))


def fail_attempt(msg: Attempted, backoff: Backoff, error: str, now: datetime, consumer: str, broker: str,
                 rng: Optional[random.Random] = None, result: Optional[str] = None,
                 cancel_requested: bool = False) -> Change:
    """RUNNING -> NEW at now + the next delay while retries remain, else RUNNING -> FAIL.

    ``result`` is the error as JSON (``{"type", "message", "traceback"}``), kept with a retry
    too (the latest error). A message whose cancel was requested is not retried: CANCELLED."""
    error = error or "failed"
    if cancel_requested:
        return cancelled(now, consumer, broker, error=error)
    if retries_left(msg.retry_remaining):
        delay = next_delay(msg, backoff, rng)
        values = {M.effect_time: after(now, delay), M.retry_remaining: msg.retry_remaining - 1, M.update_time: now,
                  M.result: result, **_lease_cleared()}
        line = _line(now, Event.RETRY, consumer=consumer, broker=broker, attempt=msg.attempt, next_in=f"{delay:.3f}s",
                     retries_left=msg.retry_remaining - 1, error=error)
        return Change(Event.RETRY, (RUNNING,), NEW, values, trace=line)
    values = {M.finish_time: now, M.update_time: now, M.lease_expire: None, M.result: result}
    line = _line(now, Event.FAIL, consumer=consumer, broker=broker, attempt=msg.attempt, error=error)
    return Change(Event.FAIL, (RUNNING,), FAIL, values, trace=line)


def release(now: datetime, consumer: str, broker: str) -> Change:
    """RUNNING -> NEW for a lease nobody will use (the pull was abandoned): not a delivery."""
    return Change(Event.RELEASED, (RUNNING,), NEW, {M.update_time: now, **_lease_cleared()}, attempt_delta=-1,
                  trace=_line(now, Event.RELEASED, consumer=consumer, broker=broker))


def extend(now: datetime, ttr: int) -> Change:
    """RUNNING stays RUNNING until now + ``ttr``: a heartbeat or ``message.touch()``.

    No trace line and no new version: heartbeats repeat every ttr/3 while a handler runs."""
    return Change(Event.EXTENDED, (RUNNING,), RUNNING, {M.lease_expire: after(now, ttr), M.ttr: ttr},
                  bump_version=False)


def delivered_out(deliveries: int, max_deliveries: int) -> bool:
    """True when an expiring lease ends the message in FAIL: it has been delivered
    ``max_deliveries`` times (0: no limit)."""
    return 0 < max_deliveries <= deliveries


def expire(now: datetime, deliveries: int, max_deliveries: int, lost_by: Optional[str], broker: str,
           expiries: int = 1, cancel_requested: bool = False) -> Change:
    """RUNNING whose lease ran out: back to NEW, due now, or FAIL once :func:`delivered_out` (a
    poison message that kills or hangs its consumer every time), or CANCELLED when its cancel
    was requested (its worker died after the request: it does not run again).

    ``expiries`` counts this expiry and the earlier ones, for the trace of a FAIL."""
    lost_by = lost_by or "-"
    if cancel_requested:
        values = {M.finish_time: now, M.update_time: now, M.lease_expire: None}
        return Change(Event.CANCELLED, (RUNNING,), CANCELLED, values,
                      trace=_line(now, Event.CANCELLED, broker=broker, lost_by=lost_by, error="lease_expired"))
    if delivered_out(deliveries, max_deliveries):
        values = {M.finish_time: now, M.update_time: now, M.lease_expire: None}
        line = _line(now, Event.FAIL, broker=broker, lost_by=lost_by, attempt=deliveries,
                     error=f"lease_expired_{expiries}_times:_max_deliveries_{max_deliveries}_reached")
        return Change(Event.FAIL, (RUNNING,), FAIL, values, trace=line)
    return lease_lost(now, lost_by, broker)


def lease_expiries(trace_text: str) -> int:
    """How many times a message's lease expired, counted from its trace (for :func:`expire`'s
    ``expiries``: read only for a message about to fail as poison, which is rare)."""
    marker = f" {Event.LEASE_EXPIRED.value} "
    return sum(1 for line in trace_text.splitlines() if marker in f"{line} ")


def lease_lost(now: datetime, lost_by: Optional[str], broker: str) -> Change:
    """RUNNING whose lease ran out and which is not :func:`delivered_out`: back to NEW, due now,
    naming the consumer that lost it."""
    return Change(Event.LEASE_EXPIRED, (RUNNING,), NEW, {M.update_time: now, **_lease_cleared()},
                  trace=_line(now, Event.LEASE_EXPIRED, broker=broker, lost_by=lost_by or "-"))


# -- results, progress and cancelling running work -------------------------------------------
def report_progress(now: datetime, progress: str) -> Change:
    """RUNNING stays RUNNING with ``progress`` (JSON ``{"done", "total", "note", "at"}``) set; the
    storage checks the lease token. No trace line and no new version: a handler may report
    about once a second, and only the latest report is kept."""
    return Change(Event.EXTENDED, (RUNNING,), RUNNING, {M.progress: progress}, bump_version=False)


def request_cancel(now: datetime, **who: object) -> Change:
    """RUNNING stays RUNNING, marked ``cancel_requested``: its worker learns of it with a
    heartbeat (brought forward by the topic's cancel signal) and stops the handler
    (:func:`cancelled`)."""
    return Change(Event.CANCEL_REQUESTED, (RUNNING,), RUNNING, {M.cancel_requested: True, M.update_time: now},
                  trace=_line(now, Event.CANCEL_REQUESTED, **who))


def cancelled(now: datetime, consumer: str, broker: str, error: str = "") -> Change:
    """RUNNING (its cancel requested) -> CANCELLED, final. The lease token stays, so the ack that
    recorded it is recognised when repeated and any other ack is stale: nothing revives it."""
    values = {M.finish_time: now, M.update_time: now, M.lease_expire: None}
    extra = {"error": error} if error else {}
    return Change(Event.CANCELLED, (RUNNING,), CANCELLED, values,
                  trace=_line(now, Event.CANCELLED, consumer=consumer or "-", broker=broker, **extra))


def forget_result(now: datetime) -> Change:
    """A finished message's result and progress cleared (the topic's result retention ran out);
    no trace line and no version: the row is otherwise as it was."""
    return Change(Event.RETIRED, FINAL_STATUSES, None, {M.result: None, M.progress: None}, bump_version=False)


# -- operators and producers -----------------------------------------------------------------
def requeue(now: datetime, retry: int, event: Event = Event.REQUEUED, **who: object) -> Change:
    """FAIL -> NEW, due now, with ``retry`` retries left after the new attempt."""
    values = {M.effect_time: now, M.retry_remaining: max(retry, 0), M.finish_time: None, M.update_time: now,
              M.cancel_requested: False, **_lease_cleared()}
    return Change(event, (FAIL,), NEW, values, trace=_line(now, event, **who, retries=max(retry, 0)))


def cancel() -> Change:
    """NEW or WAITING -> gone: a producer takes back a message nobody has started."""
    return Change(Event.CANCELLED, (NEW, WAITING), None, delete=True)


def admin_edit(now: datetime, user: str, status: Optional[MessageStatus], changed: Sequence[str],
               values: Optional[dict[str, Any]] = None) -> Change:
    """An operator's edit of any message not RUNNING; ``status`` None keeps the current one.

    A status set by hand ends any lease fields and sets finish_time as that status implies. A
    WAITING message may be set to any other status (NEW runs it without its dependencies); no
    message may be set WAITING."""
    if status is not None and status not in EDITABLE_STATUSES:
        raise ValueError(f"status must be one of {', '.join(s.value for s in EDITABLE_STATUSES)}, got {status}")
    if status is WAITING:
        # Only dependencies release a WAITING message: set by hand, nothing would ever release it.
        raise ValueError(f"{WAITING} is set by dependencies only; choose {NEW} to run the message now")
    sets = dict(values or {})
    sets[M.update_time] = now
    if status is not None:
        sets.update(_lease_cleared())
        sets[M.cancel_requested] = False
        sets[M.finish_time] = None if status is NEW else now
    line = _line(now, Event.ADMIN_EDIT, user=user, changed=",".join(changed) or "-",
                 status=status.value if status is not None else None)
    return Change(Event.ADMIN_EDIT, EDITABLE_STATUSES, status, sets, trace=line)


def retire() -> Change:
    """SUCCESS -> gone: the broker's retention removes a topic's old successes (see
    :func:`retention_deletes_success` for the topics it may)."""
    return Change(Event.RETIRED, (SUCCESS,), None, delete=True)


def admin_delete() -> Change:
    """Any message not RUNNING -> gone (a consumer holds RUNNING ones)."""
    return Change(Event.ADMIN_DELETE, EDITABLE_STATUSES, None, delete=True)


def restore(now: datetime, retry: int, **who: object) -> Change:
    """An archived SUCCESS or FAIL message put back into MySQL as NEW, due now, with a fresh
    lease state and ``retry`` retries (the pipeline's restore)."""
    values = {M.status: NEW.value, M.effect_time: now, M.retry_remaining: max(retry, 0), M.finish_time: None,
              M.start_time: None, M.consumer: None, M.update_time: now, M.result: None, M.progress: None,
              M.cancel_requested: False, **_lease_cleared()}
    return Change(Event.RESTORED, ARCHIVABLE_STATUSES, NEW, values, trace=_line(now, Event.RESTORED, **who))
