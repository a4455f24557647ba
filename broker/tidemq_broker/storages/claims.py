"""How a lease takes rows: find due candidates without locking, then lock them by key.

A batch lease used to be one conditional ``UPDATE ... ORDER BY ... LIMIT`` along the lock index.
That is a locking read of a secondary index, and InnoDB makes each one check every index record
it meets for an implicit lock. While a transaction keeps an old read view open (a
``mysqldump --single-transaction``, a report, a forgotten console tab), purge stops, every
status change leaves its old index entry behind delete-marked, and that check walks their undo:
measured here, one lock cost 20k buffer-pool reads per 10k messages consumed since the read
view opened (a second per lock after a minute at 500 messages/s), whatever the range.

So a lease is three statements in one transaction:

1. **Candidates**, a non-locking read of the lock index (``due_candidates``): the index alone,
   in lock order (priority DESC, effect_time, id). A non-locking read passes delete-marked
   entries at the cost of reading their pages (about 240 entries a page), and it never waits: a
   row an open application transaction inserted (``tidemq.enqueue``) is not visible yet, so it
   holds nobody up.
2. **Lock by key**, ``SELECT ... FOR UPDATE SKIP LOCKED`` of the candidates that are still NEW
   (``lease_rows``), reading what the delivery needs. A candidate another consumer took meanwhile
   is no longer NEW; one some other transaction holds locked (an enqueue whose unique key matched
   it) is passed over, never waited for.
3. **The change**, one UPDATE of exactly those rows by key.

A shard's candidates are its own (``MOD(id DIV step, total) = rank``) and, when the caller
allows it, messages of other shards that have been due longer than the caller's grace: a
consumer that died leaves its shard's messages waiting only until its ZooKeeper session ends,
and live consumers take them meanwhile. Own messages come first, so a consumer whose shard
keeps it busy takes nothing of others (no contention under load).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Optional, Sequence

from sqlalchemy import Connection, literal, not_, select, union_all

from tidemq.lifecycle import Change, MessageStatus
from tidemq.validation import PRIORITIES_DESC

from ..schema import message as m
from ..storage import LeasedMessage
from .changes import apply
from .dialect import SqlDialect
from .ids import ids_in

__all__ = ["due_candidates", "lease_rows"]

_NEW = MessageStatus.NEW.value
# What a pull hands out of each leased row: the rest of a delivery is what the lease set.
_LEASED_COLUMNS = [m.c.id, m.c.data, m.c.effect_time, m.c.retry_remaining, m.c.attempt, m.c.trace_context,
                   m.c.priority]


def due_candidates(conn: Connection, dialect: SqlDialect, topic: str, rank: int, total: int, limit: int,
                   due_by: datetime, stranded_before: Optional[datetime] = None, floor: Optional[datetime] = None,
                   columns: Sequence[Any] = ()) -> list[Any]:
    """Up to ``limit`` NEW messages of ``topic`` due by ``due_by`` in the lock's order (``id``,
    ``priority``, ``effect_time`` and ``columns`` of each), by a non-locking read of the lock
    index: first the shard's own, then (``stranded_before`` given, several shards) other
    shards' messages due by then. ``floor``: where each priority's range starts (no NEW message
    of the topic is due before it, ``tidemq_broker.floors``), past the entries of consumed ones."""
    since = [m.c.effect_time >= floor] if floor is not None else []
    def due(label: Sequence[Any], *where: Any) -> Any:
        return (dialect.lock_index_hint(select(m.c.id, m.c.priority, m.c.effect_time, *columns, *label))
                .where(m.c.topic == topic, m.c.status == _NEW, m.c.priority.in_(PRIORITIES_DESC),
                       m.c.effect_time <= due_by, *since, *where)
                .order_by(m.c.priority.desc(), m.c.effect_time, m.c.id).limit(limit))

    if total <= 1:
        return list(conn.execute(due(())).all())
    own = dialect.shard_clause(m.c.id, total, rank)
    if stranded_before is None:
        return list(conn.execute(due((), own)).all())
    # One round trip: the shard's own candidates, then other shards' stranded ones, each in lock
    # order; the own come first whatever their times.
    mine = due([literal(0).label("stranded")], own).subquery()
    theirs = due([literal(1).label("stranded")], not_(own), m.c.effect_time <= stranded_before).subquery()
    rows = conn.execute(union_all(select(mine), select(theirs))).all()
    rows.sort(key=lambda row: (row.stranded, -row.priority, row.effect_time, row.id))
    return rows[:limit]


def lease_rows(conn: Connection, topic: str, ids: Sequence[int], change: Change) -> list[LeasedMessage]:
    """Lock the rows ``ids`` that are still NEW and nobody holds (skipping, never waiting),
    apply ``change`` (a lifecycle lease) to them and return them as deliveries, higher priority
    first, then oldest due first."""
    if not ids:
        return []
    rows = conn.execute(select(*_LEASED_COLUMNS).where(ids_in(ids), m.c.status == _NEW)
                        .with_for_update(skip_locked=True)).all()
    if not rows:
        return []
    apply(conn, change, ids_in([row.id for row in rows]))
    rows.sort(key=lambda row: (-row.priority, row.effect_time, row.id))
    sets = change.values
    return [LeasedMessage(row.id, topic, row.data, change.target.value if change.target else _NEW, row.effect_time,
                          row.retry_remaining, row.attempt + change.attempt_delta, sets["ttr"], sets["lease_token"],
                          sets["consumer"], row.trace_context) for row in rows]
