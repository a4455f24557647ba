"""Leases: taking due messages (batch and serial), giving them back, extending and expiring them.

A lease is the lifecycle's NEW -> RUNNING under a token; every later change of the row is
guarded by status RUNNING and that token.
"""

from __future__ import annotations

from datetime import datetime
from typing import Callable, Optional, Sequence

from sqlalchemy import Connection, func, or_, select, tuple_

from tidemq import clock, lifecycle
from tidemq.lifecycle import MessageStatus

from ..records import LeasedBatch, LeasedMessage, LockRequest, OutageGrace, TopicSettings
from ..schema import message as m
from .changes import apply
from .claims import LeaseOutcomeUnknown, lease_no_wait, lease_rows, reached, read_candidates, settle_lost_lease
from .database import SqlDatabase
from .dependencies import stop_after
from .workflow_tally import Tally
from .workflows import settle
from .flow import lock_limited
from .ids import ids_in
from .reads import any_running, topics_present
from .rows import expiries, lease_change
from .topics import topic_values

__all__ = ["Leases"]

_NEW, _RUNNING = MessageStatus.NEW.value, MessageStatus.RUNNING.value
_EXTEND_CHUNK = 1000  # leases one heartbeat UPDATE carries at most


class Leases:
    """Lease, release, extend and expire."""

    def __init__(self, db: SqlDatabase) -> None:
        self._db = db
        self._no_wait = not db.dialect.single_writer  # until a connection says its server cannot

    def lock_batch(self, request: LockRequest) -> list[LeasedMessage]:
        change = lease_change(request)
        due_by = clock.after(request.now, request.ahead)
        limited = request.limits is not None and request.limits.any
        if not limited and self._no_wait:
            # Two statements, no transaction to open and end: see claims.lease_no_wait.
            try:
                batch = self._db.autocommit(lambda conn: self._leased_no_wait(conn, request, change, due_by))
            except LeaseOutcomeUnknown as exc:
                # Its connection was lost (a KILL, a restart): what it leased is read on another
                # one, so that the pull still answers with it rather than fail and give it back.
                lost = exc
                batch = self._db.read(lambda conn: settle_lost_lease(conn, lost, request, change, due_by))
            if batch is not None:
                return batch

        def work(conn: Connection) -> list[LeasedMessage]:
            if limited:
                # The stored limits decide (the caller's may be seconds old); see storages/flow.py.
                return lock_limited(conn, self._db.dialect, request, change, due_by)
            # One row more than the batch takes: a lock that fills its batch can then still tell
            # whether it took everything due (a consumer pulling one message at a time would
            # otherwise follow every message with a lock that finds nothing).
            read = request.limit + 1
            rows = read_candidates(conn, self._db.dialect, request.shard, read, due_by, request.now)
            leased = lease_rows(conn, request.topic, [row.id for row in rows[:request.limit]], change)
            return LeasedBatch(leased, reached(request.shard, rows, read, {lm.id for lm in leased}, due_by),
                               drained=len(leased) == len(rows))

        return self._db.tx(work)

    def _leased_no_wait(self, conn: Connection, request: LockRequest, change: lifecycle.Change,
                        due_by: datetime) -> Optional[LeasedBatch]:
        if not self._db.dialect.no_wait(conn):
            self._no_wait = False  # the server cannot: every lease takes the transaction
            return None
        return lease_no_wait(conn, self._db.dialect, request, change, due_by)

    def lock_serial(self, request: LockRequest) -> list[LeasedMessage]:
        topic = request.topic
        change = lease_change(request, serial=True)
        due_by = clock.after(request.now, request.ahead)

        def work(conn: Connection) -> list[LeasedMessage]:
            if not self._db.dialect.lock_topic_row(conn, topic):
                # A topic only ``tidemq.enqueue`` wrote to has no settings row yet: make the
                # default one, in this transaction, and lock it.
                self._db.dialect.insert_topics_ignoring_duplicates(
                    conn, [topic_values(TopicSettings(topic), request.now)])
                self._db.dialect.lock_topic_row(conn, topic)
            if any_running(conn, topic):
                return []
            head = conn.execute(select(m.c.id, m.c.effect_time).where(m.c.topic == topic, m.c.status == _NEW)
                                .order_by(m.c.order_time, m.c.id).limit(1)).first()
            if head is None or head.effect_time > due_by:
                return []
            # Skip-locked like any lease: the head held by another transaction (an enqueue whose
            # unique key matched it) waits for the next pull instead of holding this one.
            return lease_rows(conn, topic, [head.id], change)

        return self._db.tx(work)

    def release(self, lease_token: str, now: datetime, consumer: str = "", broker: str = "") -> int:
        change = lifecycle.release(now, consumer or "-", broker)

        def work(conn: Connection) -> int:
            # No index leads with lease_token: the RUNNING rows of each topic (those in flight)
            # are one range each of (topic, status, lease_expire), and the token picks among
            # them. A non-locking read finds them and the change locks them by key: a locking
            # walk of those ranges would pay for every entry a long read view keeps there.
            topics = topics_present(conn)
            if not topics:
                return 0
            ids = conn.execute(select(m.c.id).where(m.c.topic.in_(topics), m.c.status == _RUNNING,
                                                    m.c.lease_token == lease_token)).scalars().all()
            if not ids:
                return 0
            # A message whose cancel was requested meanwhile does not go back: it ends CANCELLED.
            stopped = apply(conn, lifecycle.cancelled(now, consumer or "-", broker, error="released"), ids_in(ids),
                            m.c.lease_token == lease_token, m.c.cancel_requested)
            return stopped + apply(conn, change, ids_in(ids), m.c.lease_token == lease_token)

        return self._db.tx(work)

    def extend_leases(self, leases: Sequence[tuple[int, str]], ttr: int, now: datetime) -> list[bool]:
        change = lifecycle.extend(now, ttr)

        def work(conn: Connection) -> list[bool]:
            # One UPDATE per chunk of (id, token) pairs, whatever the tokens (one per pulled
            # batch): a statement per token made a heartbeat of a worker holding many small
            # batches a dozen statements, each waiting for the cores under load, and a held
            # message falling due while the beat was in flight waited for it (LeaseKeeper).
            # The ids' own IN beside the pairs' makes it a walk of the primary key.
            pairs = sorted(set(leases))
            held: set[tuple[int, str]] = set()
            for start in range(0, len(pairs), _EXTEND_CHUNK):
                part = pairs[start : start + _EXTEND_CHUNK]
                ids = sorted({id for id, _ in part})
                pair_in = tuple_(m.c.id, m.c.lease_token).in_(part)
                if apply(conn, change, ids_in(ids), pair_in) == len(part):
                    held.update(part)
                    continue
                # Some lease was lost: find out which (rare, and only for this chunk).
                held.update((id, token) for id, token in conn.execute(
                    select(m.c.id, m.c.lease_token).where(ids_in(ids), m.c.status == _RUNNING, pair_in)))
            return [(id, token) in held for id, token in leases]

        return self._db.tx(work)

    def report_progress(self, reports: Sequence[tuple[int, str, str]], now: datetime) -> list[bool]:
        def work(conn: Connection) -> list[bool]:
            # Latest wins: a report is written as it comes, one UPDATE by key each (a handler
            # reports about once a second at most).
            return [apply(conn, lifecycle.report_progress(now, progress), m.c.id == id,
                          m.c.lease_token == token) == 1 for id, token, progress in reports]

        return self._db.tx(work) if reports else []

    def cancels_requested(self, leases: Sequence[tuple[int, str]]) -> list[bool]:
        ids = sorted({id for id, _ in leases})
        if not ids:
            return []
        marked = set(self._db.tx(lambda conn: conn.execute(
            select(m.c.id, m.c.lease_token).where(ids_in(ids), m.c.status == _RUNNING, m.c.cancel_requested)).all()))
        return [(id, token) in marked for id, token in leases]

    def expire_leases(self, now: datetime, limit: int, broker: str,
                      max_deliveries: Callable[[str], int], by_topic: Optional[dict[str, int]] = None,
                      grace: Optional[OutageGrace] = None) -> int:
        counts: dict[str, int] = {}
        ran_out = [m.c.lease_expire < now]
        if grace is not None:
            # A lease that ran out during the outage is held until the outage's end plus its ttr:
            # back + ttr <= now, i.e. ttr <= the seconds since the database came back.
            elapsed = (now - grace.back).total_seconds()
            ran_out.append(or_(m.c.lease_expire < grace.since, func.coalesce(m.c.ttr, 0) <= elapsed))

        finished: dict[int, str] = {}

        def work(conn: Connection) -> int:
            counts.clear()  # a transaction run again counts afresh
            finished.clear()
            topics = topics_present(conn)
            if not topics:
                return 0
            # One range of (topic, status, lease_expire) per topic.
            expired = conn.execute(
                select(m.c.id, m.c.topic, m.c.attempt, m.c.consumer, m.c.cancel_requested, m.c.workflow_id)
                .where(m.c.topic.in_(topics), m.c.status == _RUNNING, *ran_out)
                .order_by(m.c.lease_expire).limit(limit)).all()
            # Rows of one topic lost by one consumer go back together; a poison message fails on its own.
            back: dict[tuple[Optional[str], str], list[int]] = {}
            ended: dict[int, str] = {}  # workflow messages that ended here: what waits on them stops
            tally = Tally()
            for row in expired:
                most = max_deliveries(row.topic)
                if row.cancel_requested:
                    # Its worker died after the cancel request: it does not run again.
                    change = lifecycle.expire(now, row.attempt, most, row.consumer, broker, cancel_requested=True)
                elif lifecycle.delivered_out(row.attempt, most):
                    change = lifecycle.expire(now, row.attempt, most, row.consumer, broker,
                                              _expiries(conn, row.id) + 1)
                else:
                    back.setdefault((row.consumer, row.topic), []).append(row.id)
                    continue
                moved = apply(conn, change, m.c.id == row.id, m.c.lease_expire < now)
                _tally(counts, row.topic, moved)
                if moved and row.workflow_id is not None and change.target is not None:
                    ended[row.id] = change.target.value
                    tally.end(row.workflow_id, change.target.value)
            for (consumer, topic), ids in back.items():
                _tally(counts, topic, apply(conn, lifecycle.lease_lost(now, consumer, broker), ids_in(ids),
                                            m.c.lease_expire < now))
            if ended:
                stop_after(conn, ended, now, broker, tally)
            if tally:
                finished.update(settle(conn, tally, now))
            return sum(counts.values())

        moved = self._db.tx(work)
        self._db.workflow_outcomes.ended(finished)
        if by_topic is not None:
            for topic, n in counts.items():
                _tally(by_topic, topic, n)
        return moved


def _tally(counts: dict[str, int], topic: str, n: int) -> None:
    if n:
        counts[topic] = counts.get(topic, 0) + n


def _expiries(conn: Connection, id: int) -> int:
    """How many times the lease of message ``id`` expired before (from its trace)."""
    return expiries(conn.execute(select(m.c.trace).where(m.c.id == id)).scalar() or "")
