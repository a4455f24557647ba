"""Leases in memory: the batch lock (with the lock hints, stranded shards and flow limits), the
serial lock, release, extend, expire, and acks.

Every rule a lock follows in SQL holds here, read from the same places: which messages are due
(the shard rule with the id step, the hint's floor and priorities, other shards' messages once
stranded), in which order (``rows.lock_order``), how many the topic's stored limits allow
(``tidemq_broker.flow``), and what the lease writes (``rows.lease_change``). Nothing is ever
held by another transaction here, so nothing is skipped as locked.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Callable, Optional, Sequence

from tidemq import clock, lifecycle
from tidemq.lifecycle import MessageStatus
from tidemq.link import AckItem, AckOutcome
from tidemq.tables import MESSAGE as M
from tidemq.validation import PRIORITIES_DESC

from ...flow import KEY_WINDOW, refill, within_key_limit
from ...records import (FlowLimits, HandOff, LeasedBatch, LeasedMessage, LockRequest, OutageGrace, Shard, TopicSettings,
                        add_released)
from ..rows import expiries, lease_change, leased, lock_order, sort_acks, to_message
from ..workflow_tally import Tally
from .dependencies import release_after, stop_after
from .state import MemoryState, apply
from .topics import topic_row
from .workflows import settle

__all__ = ["MemoryLeases", "MemoryAcks", "due_candidates", "hand_off"]

_NEW, _RUNNING = MessageStatus.NEW.value, MessageStatus.RUNNING.value
_ENDED = (MessageStatus.FAIL.value, MessageStatus.CANCELLED.value)  # what stops the steps waiting on it
Row = dict[str, Any]


def due_candidates(state: MemoryState, shard: Shard, limit: int, due_by: datetime, now: datetime) -> list[Row]:
    """Up to ``limit`` NEW messages of the shard due by ``due_by``, in the lock's order, read where
    the hint says they can be: the shard's own first, then (``hint.stranded``, several shards)
    other shards' messages due for longer than that."""
    hint = shard.hint
    if hint.priorities is not None and not hint.priorities:
        return []
    stranded_by = clock.after(now, -hint.stranded)
    own: list[Row] = []
    others: list[Row] = []
    for row in state.rows(shard.topic, _NEW):
        when = row[M.effect_time]
        if when > due_by or (hint.priorities is not None and row[M.priority] not in hint.priorities):
            continue
        mine = shard.total <= 1 or state.shard_of(row[M.id], shard.total) == shard.rank
        floor = hint.floor_of(row[M.priority]) if mine else hint.floor
        if floor is not None and when < floor:
            continue
        if mine:
            own.append(row)
        elif hint.stranded > 0 and when <= stranded_by:
            others.append(row)
    return (sorted(own, key=lock_order) + sorted(others, key=lock_order))[:limit]


def reached(state: MemoryState, shard: Shard, due_by: datetime) -> dict[int, datetime]:
    """``LeasedBatch.reached`` after a lock of ``shard``: for each priority it read, the earliest
    of the shard's own NEW messages due by ``due_by`` that is left (``due_by`` when none is)."""
    hint = shard.hint
    read = set(hint.priorities) if hint.priorities is not None else set(PRIORITIES_DESC)
    found = {priority: due_by for priority in read}
    for row in state.rows(shard.topic, _NEW):
        when, priority = row[M.effect_time], row[M.priority]
        if priority in read and when <= due_by and when < found[priority] and \
                (shard.total <= 1 or state.shard_of(row[M.id], shard.total) == shard.rank):
            floor = hint.floor_of(priority)
            if floor is None or when >= floor:
                found[priority] = when
    return found


class MemoryLeases:
    """Lease, release, extend and expire."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state

    def lock_batch(self, request: LockRequest) -> list[LeasedMessage]:
        change = lease_change(request)
        due_by = clock.after(request.now, request.ahead)
        with self._state.lock:
            if request.limits is not None and request.limits.any:
                rows = self._limited(request, due_by)
            else:
                rows = due_candidates(self._state, request.shard, request.limit + 1, due_by, request.now)
                leased = self._lease(rows[:request.limit], change, request.topic)
                return LeasedBatch(leased, reached(self._state, request.shard, due_by),
                                   drained=len(leased) == len(rows))
            return self._lease(rows, change, request.topic)

    def _limited(self, request: LockRequest, due_by: datetime) -> list[Row]:
        """The candidates a lock takes as the topic's stored limits allow (the caller's copy may
        be old), with the rate's bucket taken from."""
        state, now = self._state, request.now
        row = state.topics.get(request.topic)
        stored = FlowLimits(row["max_running"], row["rate_per_second"], row["max_running_per_key"]) if row \
            else FlowLimits()
        allowed = request.limit
        if stored.max_running is not None:
            allowed = min(allowed, stored.max_running - sum(1 for _ in state.rows(request.topic, _RUNNING)))
        tokens = 0.0
        if row is not None and stored.rate_per_second is not None:
            tokens = refill(row["rate_tokens"], row["rate_at"], stored.rate_per_second, now)
            allowed = min(allowed, int(tokens))
        if allowed <= 0:
            return []
        if stored.max_running_per_key is not None:
            candidates = due_candidates(state, request.shard, allowed * KEY_WINDOW, due_by, now)
            keys = {c[M.flow_key] for c in candidates if c[M.flow_key] is not None}
            held: dict[str, int] = {}
            for running in state.rows(request.topic, _RUNNING):
                if running[M.flow_key] in keys:
                    held[running[M.flow_key]] = held.get(running[M.flow_key], 0) + 1
            chosen = set(within_key_limit([(c[M.id], c[M.flow_key]) for c in candidates], held,
                                          stored.max_running_per_key, allowed))
            taken = [c for c in candidates if c[M.id] in chosen]
        else:
            taken = due_candidates(state, request.shard, allowed, due_by, now)
        if row is not None and stored.rate_per_second is not None and taken:
            # rate_at is the last start: a gap since longer than CATCH_UP_SECONDS is idleness.
            row.update(rate_tokens=tokens - len(taken), rate_at=now)
        return taken

    def _lease(self, rows: list[Row], change: lifecycle.Change, topic: str) -> list[LeasedMessage]:
        return _lease(self._state, rows, change, topic)

    def lock_serial(self, request: LockRequest) -> list[LeasedMessage]:
        topic, state = request.topic, self._state
        change = lease_change(request, serial=True)
        due_by = clock.after(request.now, request.ahead)
        with state.lock:
            if topic not in state.topics:
                # As in SQL: a topic only ``tidemq.enqueue`` wrote to gets its default row here.
                state.topics[topic] = topic_row(TopicSettings(topic), request.now)
            if any(True for _ in state.rows(topic, _RUNNING)):
                return []
            head = min(state.rows(topic, _NEW), key=lambda row: (row[M.order_time], row[M.id]), default=None)
            if head is None or head[M.effect_time] > due_by:
                return []
            return self._lease([head], change, topic)

    def release(self, lease_token: str, now: datetime, consumer: str = "", broker: str = "") -> int:
        change = lifecycle.release(now, consumer or "-", broker)
        with self._state.lock:
            rows = [row for row in self._state.rows(status=_RUNNING) if row[M.lease_token] == lease_token]
            # A message whose cancel was requested meanwhile does not go back: it ends CANCELLED.
            stopped = apply(self._state, lifecycle.cancelled(now, consumer or "-", broker, error="released"),
                            [row for row in rows if row[M.cancel_requested]])
            return stopped + apply(self._state, change, [row for row in rows if not row[M.cancel_requested]])

    def extend_leases(self, leases: Sequence[tuple[int, str]], ttr: int, now: datetime) -> list[bool]:
        change = lifecycle.extend(now, ttr)
        state = self._state
        with state.lock:
            held = {(id, token) for id, token in set(leases) if id in state.messages
                    and state.messages[id][M.status] == _RUNNING and state.messages[id][M.lease_token] == token}
            apply(state, change, [state.messages[id] for id, _ in held])
            return [(id, token) in held for id, token in leases]

    def report_progress(self, reports: Sequence[tuple[int, str, str]], now: datetime) -> list[bool]:
        state = self._state
        done: list[bool] = []
        with state.lock:
            for id, token, progress in reports:
                row = state.messages.get(id)
                held = row is not None and row[M.status] == _RUNNING and row[M.lease_token] == token
                done.append(held and apply(state, lifecycle.report_progress(now, progress), [row]) == 1)
        return done

    def cancels_requested(self, leases: Sequence[tuple[int, str]]) -> list[bool]:
        state = self._state
        with state.lock:
            return [(row := state.messages.get(id)) is not None and row[M.status] == _RUNNING
                    and row[M.lease_token] == token and bool(row[M.cancel_requested]) for id, token in leases]

    def expire_leases(self, now: datetime, limit: int, broker: str, max_deliveries: Callable[[str], int],
                      by_topic: Optional[dict[str, int]] = None, grace: Optional[OutageGrace] = None) -> int:
        elapsed = (now - grace.back).total_seconds() if grace is not None else 0.0

        def ran_out(row: Row) -> bool:
            expire = row[M.lease_expire]
            if expire is None or not expire < now:
                return False
            # A lease that ran out during an outage is held until its end plus the lease's ttr.
            return grace is None or expire < grace.since or (row[M.ttr] or 0) <= elapsed

        counts: dict[str, int] = {}
        tally = Tally()
        with self._state.lock:
            expired = sorted((row for row in self._state.rows(status=_RUNNING) if ran_out(row)),
                             key=lambda row: (row[M.lease_expire], row[M.id]))[:limit]
            # Rows of one topic lost by one consumer go back together; a poison message fails on its own.
            back: dict[tuple[Optional[str], str], list[Row]] = {}
            ended: dict[int, str] = {}
            for row in expired:
                most = max_deliveries(row[M.topic])
                if row[M.cancel_requested]:
                    # Its worker died after the cancel request: it does not run again.
                    change = lifecycle.expire(now, row[M.attempt], most, row[M.consumer], broker, cancel_requested=True)
                    _tally(counts, row[M.topic], apply(self._state, change, [row]))
                    ended[row[M.id]] = row[M.status]
                elif lifecycle.delivered_out(row[M.attempt], most):
                    change = lifecycle.expire(now, row[M.attempt], most, row[M.consumer], broker,
                                              expiries(row[M.trace]) + 1)
                    _tally(counts, row[M.topic], apply(self._state, change, [row]))
                    ended[row[M.id]] = row[M.status]
                else:
                    back.setdefault((row[M.consumer], row[M.topic]), []).append(row)
                    continue
                if row[M.workflow_id] is not None:
                    tally.end(row[M.workflow_id], row[M.status])
            for (consumer, topic), rows in back.items():
                _tally(counts, topic, apply(self._state, lifecycle.lease_lost(now, consumer, broker), rows))
            stop_after(self._state, ended, now, broker, tally)
            finished = settle(self._state, tally, now)
        self._state.outcomes.ended(finished)
        if by_topic is not None:
            for topic, n in counts.items():
                _tally(by_topic, topic, n)
        return sum(counts.values())


class MemoryAcks:
    """Outcomes: SUCCESS, a retry, or FAIL, as the lifecycle decides, each guarded by the lease."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state

    def ack(self, items: Sequence[AckItem], now: datetime, consumer: str, broker: str,
            topics: Callable[[str], TopicSettings], released: Optional[dict[str, dict[int, int]]] = None,
            handoff: Optional[HandOff] = None, committed: Optional[Callable[[], None]] = None) -> list[AckOutcome]:
        state = self._state
        with state.lock:
            # Judged on the rows as they were before this batch, as the SQL storage reads them.
            held = {i: state.messages[i][M.lease_token] for i in {item.id for item in items}
                    if i in state.messages and state.messages[i][M.status] == _RUNNING}
            done = {i: (row[M.status], row[M.lease_token]) for i in {item.id for item in items}
                    if (row := state.messages.get(i)) is not None and row[M.status] != _RUNNING}
            outcomes, succeeded, failed, cancelled = sort_acks(items, held, done)
            stopped = [state.messages[item.id] for item in cancelled]
            for item in failed:
                msg = to_message(state.messages[item.id])
                apply(state, lifecycle.fail_attempt(msg, topics(msg.topic), item.error, now, consumer, broker,
                                                    result=item.result, cancel_requested=msg.cancel_requested),
                      [state.messages[item.id]])
            apply(state, lifecycle.cancelled(now, consumer, broker), stopped)
            tally = Tally()
            for item in succeeded:
                apply(state, lifecycle.succeed(now, consumer, broker, item.result), [state.messages[item.id]])
            ended = {item.id: state.messages[item.id][M.status] for item in failed + cancelled
                     if state.messages[item.id][M.status] in _ENDED}
            tally.end_many((state.messages[id][M.workflow_id], state.messages[id][M.status])
                           for id in [item.id for item in succeeded] + list(ended)
                           if state.messages[id][M.workflow_id] is not None)
            # In the same atomic step, as the SQL storage does in the ack's transaction.
            due: dict[str, list[tuple[int, int, datetime]]] = {}
            freed = release_after(state, [item.id for item in succeeded], now, broker, tally, due)
            freed.update(stop_after(state, ended, now, broker, tally))
            if handoff is not None:
                handoff.begin()
                hand_off(state, handoff, due)
                handoff.committed()
            add_released(released, freed)
            finished = settle(state, tally, now)
        if committed is not None:
            committed()
        state.outcomes.ended(finished)
        return outcomes


def _lease(state: MemoryState, rows: list[Row], change: lifecycle.Change, topic: str) -> list[LeasedMessage]:
    apply(state, change, rows)
    parents = state.parents
    # As in SQL, only a workflow's row looks for the messages it waited on.
    return [leased(row, topic, tuple(sorted(parents.get(row[M.id], ()))) if row[M.workflow_id] is not None else ())
            for row in sorted(rows, key=lock_order)]


def hand_off(state: MemoryState, handoff: Optional[HandOff], due: dict[str, list[tuple[int, int, datetime]]]) -> None:
    """``claims.hand_off`` in memory, the state's lock held: lease what the waiting pulls take
    of ``due`` ({topic: [(id, priority, effect_time)]}), the rows still NEW."""
    if handoff is None:
        return
    for topic, messages in due.items():
        for request, ids in handoff.takers(topic, messages):
            rows = [row for id in ids if (row := state.messages.get(id)) is not None and row[M.status] == _NEW]
            handoff.leased(request, _lease(state, rows, lease_change(request), topic))


def _tally(counts: dict[str, int], topic: str, n: int) -> None:
    if n:
        counts[topic] = counts.get(topic, 0) + n
