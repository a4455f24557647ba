"""Leases: taking due messages (batch and serial), giving them back, extending and expiring them,
and the cheap probes the pull hub uses to know when to look again.

A lease is the lifecycle's NEW -> RUNNING under a token; every later change of the row is
guarded by status RUNNING and that token.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Callable, Optional, Sequence

from sqlalchemy import Connection, Select, func, literal, not_, null, or_, select, union_all

from tidemq import clock, lifecycle
from tidemq.lifecycle import Event, MessageStatus
from tidemq.limits import new_lease_token
from tidemq.validation import PRIORITIES_DESC

from ..schema import message as m
from ..storage import FlowLimits, LeasedMessage, LockHint, OutageGrace, RecentInserts, TopicSettings
from .changes import apply
from .database import SqlDatabase
from .claims import due_candidates, lease_rows
from .flow import lock_limited
from .ids import ids_in
from .reads import topic_values, topics_present

__all__ = ["Leases"]

_NEW, _RUNNING = MessageStatus.NEW.value, MessageStatus.RUNNING.value


class Leases:
    """Lease, release, extend and expire; the due-time probes."""

    def __init__(self, db: SqlDatabase) -> None:
        self._db = db

    def lock_batch(self, topic: str, rank: int, total: int, limit: int, ttr: int, consumer: str, now: datetime,
                   lease_token: Optional[str] = None, broker: str = "", ahead: float = 0.0,
                   limits: Optional[FlowLimits] = None, hint: LockHint = LockHint()) -> list[LeasedMessage]:
        change = lifecycle.lease(now, ttr, consumer, lease_token or new_lease_token(), ahead, rank=f"{rank}/{total}",
                                 broker=broker or None)
        due_by = clock.after(now, ahead)

        def work(conn: Connection) -> list[LeasedMessage]:
            if limits is not None and limits.any:
                # The stored limits decide (the caller's may be seconds old); see storages/flow.py.
                return lock_limited(conn, self._db.dialect, topic, rank, total, limit, change, due_by, now, hint)
            ids = [row.id for row in due_candidates(conn, self._db.dialect, topic, rank, total, limit, due_by, now,
                                                    hint)]
            return lease_rows(conn, topic, ids, change)

        return self._db.tx(work)

    def lock_serial(self, topic: str, ttr: int, consumer: str, now: datetime, lease_token: Optional[str] = None,
                    broker: str = "", ahead: float = 0.0) -> list[LeasedMessage]:
        change = lifecycle.lease(now, ttr, consumer, lease_token or new_lease_token(), ahead, broker=broker or None)
        due_by = clock.after(now, ahead)

        def work(conn: Connection) -> list[LeasedMessage]:
            if not self._db.dialect.lock_topic_row(conn, topic):
                # A topic only ``tidemq.enqueue`` wrote to has no settings row yet: make the
                # default one, in this transaction, and lock it.
                self._db.dialect.insert_topics_ignoring_duplicates(conn, [topic_values(TopicSettings(topic), now)])
                self._db.dialect.lock_topic_row(conn, topic)
            if _any_running(conn, topic):
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
            return apply(conn, change, ids_in(ids), m.c.lease_token == lease_token) if ids else 0

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
    def next_due(self, topic: str, rank: int, total: int, hint: LockHint = LockHint()) -> Optional[datetime]:
        priorities = sorted(hint.priorities, reverse=True) if hint.priorities is not None else PRIORITIES_DESC
        if not priorities:
            return None
        after = [m.c.effect_time >= hint.floor] if hint.floor is not None else []
        parts = [_firsts([topic], priorities, *after, label=0)]
        if total > 1:
            own = self._db.dialect.shard_clause(m.c.id, total, rank)
            parts = [_firsts([topic], priorities, own, *after, label=0)]
            if hint.stranded > 0:  # other shards' messages, taken once stranded
                parts.append(_firsts([topic], priorities, not_(own), *after, label=1))
        rows = self._db.tx(lambda conn: conn.execute(union_all(*parts)).all())
        times = [clock.after(row.due, hint.stranded) if row.part else row.due for row in rows]
        return min(times, default=None)

    def earliest_new(self, topics: Sequence[str]) -> dict[str, dict[int, datetime]]:
        names = list(topics)

        def work(conn: Connection) -> dict[str, dict[int, datetime]]:
            found: dict[str, dict[int, datetime]] = {}
            # A bounded statement per chunk of topics (each topic is one index dive per priority).
            for start in range(0, len(names), _PROBE_TOPICS):
                chunk = names[start:start + _PROBE_TOPICS]
                for row in conn.execute(_firsts(chunk, PRIORITIES_DESC, label=0)).all():
                    found.setdefault(row.topic, {})[row.priority] = row.due
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
        fresh = (select(m.c.id, m.c.topic, m.c.effect_time, m.c.priority).where(where).order_by(m.c.id)
                 .limit(limit).subquery())
        stmt = union_all(select(fresh.c.id, fresh.c.topic, fresh.c.effect_time, fresh.c.priority),
                         select(func.max(m.c.id), null(), null(), null()))
        rows, top = [], 0
        for row in self._db.autocommit_read(stmt):
            if row[1] is None:  # the MAX row: a topic is never NULL
                top = row[0] or 0
            else:
                rows.append((row[0], row[1], row[2], row[3]))
        rows.sort()
        return RecentInserts(rows, top)


_PROBE_TOPICS = 20  # topics per earliest-due statement: 200 index dives, a statement of bounded size


def _firsts(topics: Sequence[str], priorities: Sequence[int], *where: Any, label: int) -> Select[Any]:
    """The earliest NEW message matching ``where`` of each topic and priority: rows
    ``(topic, priority, due, part=label)``, a topic and priority without one absent.

    The lock index orders each (topic, NEW) range by priority first, so each is one index dive:
    a union of ``ORDER BY effect_time LIMIT 1`` per topic and priority (a MIN over the whole
    range would read every NEW row of the topic).
    """
    firsts = [select(m.c.topic.label("topic"), m.c.priority.label("priority"), m.c.effect_time.label("due"))
              .where(m.c.topic == name, m.c.status == _NEW, m.c.priority == priority, *where)
              .order_by(m.c.effect_time).limit(1).subquery()
              for name in topics for priority in priorities]
    each = union_all(*[select(first.c.topic, first.c.priority, first.c.due) for first in firsts]).subquery()
    return select(each.c.topic, each.c.priority, each.c.due, literal(label).label("part"))


def _tally(counts: dict[str, int], topic: str, n: int) -> None:
    if n:
        counts[topic] = counts.get(topic, 0) + n


def _any_running(conn: Connection, topic: str) -> bool:
    return conn.execute(select(m.c.id).where(m.c.topic == topic, m.c.status == _RUNNING).limit(1)).first() is not None


def _expiries(conn: Connection, id: int) -> int:
    """How many times the lease of message ``id`` expired before (counted from its trace: only
    read for a message about to fail as poison, which is rare)."""
    text = conn.execute(select(m.c.trace).where(m.c.id == id)).scalar() or ""
    marker = f" {Event.LEASE_EXPIRED.value} "
    return sum(1 for line in text.splitlines() if marker in f"{line} ")
