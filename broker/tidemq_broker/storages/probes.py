"""The pull hub's probes of the SQL storage: when a shard or a serial topic next has something
due, the earliest NEW effect_time of many topics, and the inserts committed since a mark.

Each is a read of one index range or a few index dives, cheap enough to run many times a second.
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any, Callable, Optional, Sequence

from sqlalchemy import Connection, Integer, Select, String, bindparam, func, literal, not_, null, or_, select, union_all

from tidemq import clock
from tidemq.lifecycle import MessageStatus
from tidemq.validation import PRIORITIES_DESC

from ..records import RecentInserts, Shard
from ..schema import message as m
from .claims import range_start
from .database import SqlDatabase
from .ids import bound_ids_in, concat_ids
from .reads import any_running

__all__ = ["PullProbes"]

_NEW = MessageStatus.NEW.value
_PENDING = (MessageStatus.NEW.value, MessageStatus.RUNNING.value)
_CHUNK = 1000
#: The result probe's statement (several times a second while Results calls wait), built once.
_PENDING_OF = select(m.c.id).where(bound_ids_in(), m.c.status.in_(_PENDING))


class PullProbes:
    """Next due times, the earliest NEW messages of topics, the highest id, recent inserts."""

    def __init__(self, db: SqlDatabase) -> None:
        self._db = db

    def finished(self, ids: Sequence[int]) -> list[int]:
        wanted = sorted(set(ids))

        def work(conn: Connection) -> set[int]:
            pending: set[int] = set()
            for start in range(0, len(wanted), _CHUNK):
                pending.update(conn.execute(_PENDING_OF, {"ids": wanted[start : start + _CHUNK]}).scalars())
            return pending

        pending = self._db.read(work) if wanted else set()
        return [i for i in wanted if i not in pending]

    def next_due(self, shard: Shard) -> Optional[datetime]:
        topic, rank, total, hint = shard.topic, shard.rank, shard.total, shard.hint
        priorities = tuple(sorted(hint.priorities, reverse=True)) if hint.priorities is not None else PRIORITIES_DESC
        if not priorities:
            return None
        stranded = total > 1 and hint.stranded > 0
        floored = tuple(p for p, _ in hint.floors if p in priorities)
        stmt = _next_due(self._db.dialect, priorities, hint.floor is not None, floored, total > 1, stranded)
        params = {"topic": topic, "floor": hint.floor, "total": total, "rank": rank}
        params.update((f"floor_{p}", when) for p, when in hint.floors if p in priorities)
        rows = self._db.read(lambda conn: conn.execute(stmt, params).all())
        times = [clock.after(row.due, hint.stranded) if row.part else row.due for row in rows]
        return min(times, default=None)

    def earliest_new(self, topics: Sequence[str]) -> dict[str, dict[int, datetime]]:
        names = list(topics)

        def work(conn: Connection) -> dict[str, dict[int, datetime]]:
            found: dict[str, dict[int, datetime]] = {}
            # A bounded statement per chunk of topics (each topic is one index dive per priority).
            for start in range(0, len(names), _PROBE_TOPICS):
                chunk = names[start:start + _PROBE_TOPICS]
                params = {f"topic_{i}": name for i, name in enumerate(chunk)}
                for row in conn.execute(_earliest(len(chunk)), params).all():
                    found.setdefault(row.topic, {})[row.priority] = row.due
            return found

        return self._db.read(work) if names else {}

    def serial_head_due(self, topic: str) -> Optional[datetime]:
        def work(conn: Connection) -> Optional[datetime]:
            if any_running(conn, topic):
                return None
            return conn.execute(select(m.c.effect_time).where(m.c.topic == topic, m.c.status == _NEW)
                                .order_by(m.c.order_time, m.c.id).limit(1)).scalar()

        return self._db.read(work)

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
        # The rows come grouped by topic and priority, each group's ids in one string: under load
        # a look finds every row committed in the last 20 ms, and decoding them one by one (a
        # datetime each) was a fifth of a busy broker's CPU.
        params: dict[str, Any] = {"after": after, "limit": limit}
        if missing:
            params["missing"] = [int(id) for id in missing]
        groups, top = [], 0
        for topic, priority, when, ids in self._db.autocommit_read(_RECENT_INSERTS[bool(missing)], params):
            if topic is None:  # the MAX row: a topic is never NULL
                top = int(ids or 0)
            else:
                groups.append((topic, priority, when, concat_ids(ids)))
        return RecentInserts(groups, top)


def _recent_inserts(missing: bool) -> Any:
    """The insert watch's statement, built once (it runs 50 times a second): ``after``, ``limit``
    and, when ``missing``, the ``missing`` ids are bound at execution."""
    where = m.c.id > bindparam("after", type_=Integer)
    if missing:
        where = or_(where, m.c.id.in_(bindparam("missing", expanding=True, literal_execute=True)))
    fresh = (select(m.c.id, m.c.topic, m.c.effect_time, m.c.priority).where(where).order_by(m.c.id)
             .limit(bindparam("limit", type_=Integer)).subquery())
    ids = func.group_concat(fresh.c.id).cast(String)  # MySQL and SQLite both: comma separated
    return union_all(
        select(fresh.c.topic, fresh.c.priority, func.min(fresh.c.effect_time), ids)
        .group_by(fresh.c.topic, fresh.c.priority),
        select(null(), null(), null(), func.max(m.c.id).cast(String)))


_RECENT_INSERTS = {False: _recent_inserts(False), True: _recent_inserts(True)}


_PROBE_TOPICS = 20  # topics per earliest-due statement: 200 index dives, a statement of bounded size


@functools.lru_cache(maxsize=_PROBE_TOPICS)
def _earliest(topics: int) -> Any:
    """``earliest_new``'s statement for a chunk of ``topics`` topics (bound as ``topic_0``...),
    built once: built at each probe, its ten subqueries a topic were thousands of objects a
    second for the cycle collector, and a fresh cache key for SQLAlchemy to compute."""
    return _firsts([bindparam(f"topic_{i}", type_=m.c.topic.type) for i in range(topics)], PRIORITIES_DESC, label=0)


@functools.lru_cache(maxsize=256)
def _next_due(dialect: Any, priorities: tuple[int, ...], floor: bool, floored: tuple[int, ...], sharded: bool,
              stranded: bool) -> Any:
    """``next_due``'s statement of one shape (``topic``, ``floor``, ``floor_<priority>`` of each of
    ``floored`` (the shard's own ranges), ``total``, ``rank`` bound at execution): built once, it is
    cheap to run after every empty lock attempt."""
    def since(priority: Optional[int]) -> list[Any]:
        return range_start(priority, floored, floor)

    topic = [bindparam("topic", type_=m.c.topic.type)]
    if not sharded:
        return _firsts(topic, priorities, label=0, since=since)
    own = dialect.shard_clause(m.c.id, bindparam("total", type_=Integer), bindparam("rank", type_=Integer))
    parts = [_firsts(topic, priorities, own, label=0, since=since)]
    if stranded:  # other shards' messages, taken once stranded
        parts.append(_firsts(topic, priorities, not_(own), *since(None), label=1))
    return union_all(*parts)


def _firsts(topics: Sequence[Any], priorities: Sequence[int], *where: Any, label: int,
            since: Callable[[int], list[Any]] = lambda priority: []) -> Select[Any]:
    """The earliest NEW message matching ``where`` of each topic and priority: rows
    ``(topic, priority, due, part=label)``, a topic and priority without one absent.

    The lock index orders each (topic, NEW) range by priority first, so each is one index dive:
    a union of ``ORDER BY effect_time LIMIT 1`` per topic and priority (a MIN over the whole
    range would read every NEW row of the topic). ``since(priority)``: where that range starts.
    """
    firsts = [select(m.c.topic.label("topic"), m.c.priority.label("priority"), m.c.effect_time.label("due"))
              .where(m.c.topic == name, m.c.status == _NEW, m.c.priority == priority, *where, *since(priority))
              .order_by(m.c.effect_time).limit(1).subquery()
              for name in topics for priority in priorities]
    each = union_all(*[select(first.c.topic, first.c.priority, first.c.due) for first in firsts]).subquery()
    return select(each.c.topic, each.c.priority, each.c.due, literal(label).label("part"))
