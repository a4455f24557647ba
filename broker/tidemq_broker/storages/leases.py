"""Leases: taking due messages (batch and serial), giving them back, extending and expiring them,
and the cheap probes the pull hub uses to know when to look again.

A lease is the lifecycle's NEW -> RUNNING under a token; every later change of the row is
guarded by status RUNNING and that token.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Callable, Optional, Sequence

from sqlalchemy import Connection, Select, func, null, or_, select, union_all

from tidemq import clock, lifecycle
from tidemq.lifecycle import Change, Event, MessageStatus
from tidemq.validation import PRIORITIES_DESC

from ..schema import message as m
from ..storage import FlowLimits, LeasedMessage, OutageGrace, RecentInserts
from .changes import apply
from .database import SqlDatabase
from .flow import lock_limited
from .ids import ids_in
from .reads import topics_present

__all__ = ["Leases", "new_lease_token"]

_NEW, _RUNNING = MessageStatus.NEW.value, MessageStatus.RUNNING.value
# What a pull reads back of each leased row: the rest of a delivery is what the lease set.
_LEASED_COLUMNS = [m.c.id, m.c.data, m.c.effect_time, m.c.retry_remaining, m.c.attempt, m.c.trace_context,
                   m.c.priority]


def new_lease_token() -> str:
    """A fresh, unguessable lease token (32 hex characters)."""
    return uuid.uuid4().hex


class Leases:
    """Lease, release, extend and expire; the due-time probes."""

    def __init__(self, db: SqlDatabase) -> None:
        self._db = db

    def lock_batch(self, topic: str, rank: int, total: int, limit: int, ttr: int, consumer: str, now: datetime,
                   lease_token: Optional[str] = None, broker: str = "", ahead: float = 0.0,
                   limits: Optional[FlowLimits] = None) -> list[LeasedMessage]:
        change = lifecycle.lease(now, ttr, consumer, lease_token or new_lease_token(), ahead, rank=f"{rank}/{total}",
                                 broker=broker or None)
        due_by = clock.after(now, ahead)

        def work(conn: Connection) -> list[LeasedMessage]:
            if limits is not None and limits.any:
                # The stored limits decide (the caller's may be seconds old); see storages/flow.py.
                if not lock_limited(conn, self._db.dialect, topic, rank, total, limit, change, due_by, now):
                    return []
            elif not self._db.dialect.lock_update(conn, topic, rank, total, limit, change, due_by):
                return []
            return _leased(conn, topic, change)

        return self._db.tx(work)

    def lock_serial(self, topic: str, ttr: int, consumer: str, now: datetime, lease_token: Optional[str] = None,
                    broker: str = "", ahead: float = 0.0) -> list[LeasedMessage]:
        change = lifecycle.lease(now, ttr, consumer, lease_token or new_lease_token(), ahead, broker=broker or None)
        due_by = clock.after(now, ahead)

        def work(conn: Connection) -> list[LeasedMessage]:
            self._db.dialect.lock_topic_row(conn, topic)
            if _any_running(conn, topic):
                return []
            head = conn.execute(select(m.c.id, m.c.effect_time).where(m.c.topic == topic, m.c.status == _NEW)
                                .order_by(m.c.order_time, m.c.id).limit(1)).first()
            if head is None or head.effect_time > due_by:
                return []
            apply(conn, change, m.c.id == head.id)
            return _leased(conn, topic, change)

        return self._db.tx(work)

    def release(self, lease_token: str, now: datetime, consumer: str = "", broker: str = "") -> int:
        change = lifecycle.release(now, consumer or "-", broker)

        def work(conn: Connection) -> int:
            # No index leads with lease_token: the RUNNING rows of each topic (those in flight)
            # are one range each of (topic, status, lease_expire), and the token picks among them.
            topics = topics_present(conn)
            if not topics:
                return 0
            return apply(conn, change, m.c.topic.in_(topics), m.c.lease_token == lease_token)

        return self._db.tx(work)

    def extend_leases(self, leases: Sequence[tuple[int, str]], ttr: int, now: datetime) -> list[bool]:
        change = lifecycle.extend(now, ttr)

        def work(conn: Connection) -> list[bool]:
            # Tokens are per pulled batch: one UPDATE per token covers a heartbeat's messages.
            by_token: dict[str, list[int]] = {}
            for id, token in leases:
                by_token.setdefault(token, []).append(id)
            held: set[tuple[int, str]] = set()
            for token, ids in by_token.items():
                if apply(conn, change, ids_in(ids), m.c.lease_token == token) == len(set(ids)):
                    held.update((id, token) for id in ids)
                    continue
                # Some lease was lost: find out which (rare, and only for this token).
                still = conn.execute(select(m.c.id).where(ids_in(ids), m.c.status == _RUNNING,
                                                          m.c.lease_token == token)).scalars()
                held.update((id, token) for id in still)
            return [(id, token) in held for id, token in leases]

        return self._db.tx(work)

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

        def work(conn: Connection) -> int:
            counts.clear()  # a transaction run again counts afresh
            topics = topics_present(conn)
            if not topics:
                return 0
            # One range of (topic, status, lease_expire) per topic.
            expired = conn.execute(
                select(m.c.id, m.c.topic, m.c.attempt, m.c.consumer)
                .where(m.c.topic.in_(topics), m.c.status == _RUNNING, *ran_out)
                .order_by(m.c.lease_expire).limit(limit)).all()
            # Rows of one topic lost by one consumer go back together; a poison message fails on its own.
            back: dict[tuple[Optional[str], str], list[int]] = {}
            for row in expired:
                most = max_deliveries(row.topic)
                if lifecycle.delivered_out(row.attempt, most):
                    change = lifecycle.expire(now, row.attempt, most, row.consumer, broker, _expiries(conn, row.id) + 1)
                    _tally(counts, row.topic, apply(conn, change, m.c.id == row.id, m.c.lease_expire < now))
                else:
                    back.setdefault((row.consumer, row.topic), []).append(row.id)
            for (consumer, topic), ids in back.items():
                _tally(counts, topic, apply(conn, lifecycle.lease_lost(now, consumer, broker), ids_in(ids),
                                            m.c.lease_expire < now))
            return sum(counts.values())

        moved = self._db.tx(work)
        if by_topic is not None:
            for topic, n in counts.items():
                _tally(by_topic, topic, n)
        return moved

    # -- probes ------------------------------------------------------------------------------
    def next_due(self, topic: str, rank: int, total: int) -> Optional[datetime]:
        shard = [self._db.dialect.shard_clause(m.c.id, total, rank)] if total > 1 else []
        earliest = _earliest_new([topic], *shard)
        return self._db.tx(lambda conn: conn.execute(earliest).scalar())

    def earliest_new(self, topics: Sequence[str]) -> dict[str, datetime]:
        names = list(topics)

        def work(conn: Connection) -> dict[str, datetime]:
            found: dict[str, datetime] = {}
            # A bounded statement per chunk of topics (each topic is one index dive per priority).
            for start in range(0, len(names), _PROBE_TOPICS):
                chunk = names[start:start + _PROBE_TOPICS]
                if len(chunk) == 1:  # the one-topic statement selects the time alone
                    when = conn.execute(_earliest_new(chunk)).scalar()
                    if when is not None:
                        found[chunk[0]] = when
                else:
                    found.update((name, when) for name, when in conn.execute(_earliest_new(chunk)).all())
            return found

        return self._db.tx(work) if names else {}

    def serial_head_due(self, topic: str) -> Optional[datetime]:
        def work(conn: Connection) -> Optional[datetime]:
            if _any_running(conn, topic):
                return None
            return conn.execute(select(m.c.effect_time).where(m.c.topic == topic, m.c.status == _NEW)
                                .order_by(m.c.order_time, m.c.id).limit(1)).scalar()

        return self._db.tx(work)

    def max_id(self) -> int:
        return self._db.tx(lambda conn: conn.execute(select(func.max(m.c.id))).scalar() or 0)

    def id_step(self) -> int:
        return self._db.tx(self._db.dialect.id_step)

    def recent_inserts(self, after: int, missing: Sequence[int], limit: int) -> RecentInserts:
        # One walk of the primary key from ``after`` plus a lookup by key of each missing id: an
        # idle probe reads nothing, whatever the size of the table. The highest id comes in the
        # same statement (one more index dive, no round trip): when it is below ``after`` the ids
        # went backwards (a TRUNCATE, a restore) and the watch must start again from it. It runs
        # every 20 ms while pulls wait, so it skips the transaction around it (``autocommit_read``).
        where = m.c.id > after
        if missing:
            where = or_(where, m.c.id.in_(list(missing)))
        fresh = select(m.c.id, m.c.topic, m.c.effect_time).where(where).order_by(m.c.id).limit(limit).subquery()
        stmt = union_all(select(fresh.c.id, fresh.c.topic, fresh.c.effect_time),
                         select(func.max(m.c.id), null(), null()))
        rows, top = [], 0
        for row in self._db.autocommit_read(stmt):
            if row[1] is None:  # the MAX row: a topic is never NULL
                top = row[0] or 0
            else:
                rows.append((row[0], row[1], row[2]))
        rows.sort()
        return RecentInserts(rows, top)


_PROBE_TOPICS = 20  # topics per earliest-due statement: 200 index dives, a statement of bounded size


def _earliest_new(topics: Sequence[str], *where: Any) -> Select[Any]:
    """{topic: earliest effect_time of its NEW messages matching ``where``} as one statement.

    The lock index orders each (topic, NEW) range by priority first, so the earliest effect_time
    is the least of one index dive per priority: a union of ``ORDER BY effect_time LIMIT 1``
    per topic and priority (a MIN over the whole range would read every NEW row of the topic).
    With one topic it selects that topic's earliest time alone.
    """
    firsts = [select(m.c.topic.label("topic"), m.c.effect_time.label("due"))
              .where(m.c.topic == name, m.c.status == _NEW, m.c.priority == priority, *where)
              .order_by(m.c.effect_time).limit(1).subquery()
              for name in topics for priority in PRIORITIES_DESC]
    each = union_all(*[select(first.c.topic, first.c.due) for first in firsts]).subquery()
    if len(topics) == 1:
        return select(func.min(each.c.due))
    return select(each.c.topic, func.min(each.c.due)).group_by(each.c.topic)


def _tally(counts: dict[str, int], topic: str, n: int) -> None:
    if n:
        counts[topic] = counts.get(topic, 0) + n


def _any_running(conn: Connection, topic: str) -> bool:
    return conn.execute(select(m.c.id).where(m.c.topic == topic, m.c.status == _RUNNING).limit(1)).first() is not None


def _leased(conn: Connection, topic: str, change: Change) -> list[LeasedMessage]:
    """The rows of ``topic`` this transaction just leased with ``change``, in the lock's order
    (higher priority first, then oldest due).

    They are one range of (topic, status, lease_expire): RUNNING with this lease's own expiry
    time, and the token picks ours among any other lease of the same millisecond. No index on
    lease_token is kept for this.
    """
    sets = change.values
    rows = conn.execute(
        select(*_LEASED_COLUMNS)
        .where(m.c.topic == topic, m.c.status == _RUNNING, m.c.lease_expire == sets["lease_expire"],
               m.c.lease_token == sets["lease_token"])).all()
    # Sorted here, not by the database: the range comes in id order, and a filesort of the rows
    # with their data cost MariaDB more than this costs Python.
    rows.sort(key=lambda row: (-row.priority, row.effect_time, row.id))
    return [LeasedMessage(row.id, topic, row.data, _RUNNING, row.effect_time, row.retry_remaining, row.attempt,
                          sets["ttr"], sets["lease_token"], sets["consumer"], row.trace_context) for row in rows]


def _expiries(conn: Connection, id: int) -> int:
    """How many times the lease of message ``id`` expired before (counted from its trace: only
    read for a message about to fail as poison, which is rare)."""
    text = conn.execute(select(m.c.trace).where(m.c.id == id)).scalar() or ""
    marker = f" {Event.LEASE_EXPIRED.value} "
    return sum(1 for line in text.splitlines() if marker in f"{line} ")
