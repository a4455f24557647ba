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

On MariaDB the first try is two statements on an autocommit connection (``lease_no_wait``): the
candidates with their version and what a delivery needs, then that UPDATE by key, guarded by the
version read and set to fail at once on a row another transaction holds (``no_wait``); only then
does the lock take the transaction above.

A leased row of a workflow (``workflow_id`` set) may have waited on others: one more read, of
``tidemq_dependency`` by its child index, names the parents of all such rows of the lease, so a
delivery carries their ids (never their results, which may be large and many). A lease without
workflow rows pays nothing for it.

A shard's candidates are its own (``MOD(id DIV step, total) = rank``) and, when the caller
allows it, messages of other shards that have been due longer than the caller's grace: a
consumer that died leaves its shard's messages waiting only until its ZooKeeper session ends,
and live consumers take them meanwhile. Own messages come first, so a consumer whose shard
keeps it busy takes nothing of others, and does not even read them (no contention under load).
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any, Collection, Mapping, NamedTuple, Optional, Sequence

from sqlalchemy import Connection, Integer, bindparam, literal, not_, select, union_all
from sqlalchemy.exc import DBAPIError, OperationalError

from tidemq import clock
from tidemq.lifecycle import Change, MessageStatus
from tidemq.validation import PRIORITIES_DESC

from ..errors import StorageUnavailableError
from ..records import HandOff, LeasedBatch, LeasedMessage, LockHint, LockRequest, NewRow, Shard
from ..schema import message as m
from .changes import apply_to_ids, apply_to_versions
from .parents import carried_parents, parents_of
from .dialect import SqlDialect
from .ids import bound_ids_in
from .no_wait import NO_WAIT
from .lost_writes import session_of, statement_ended
from .rows import lease_change

__all__ = ["due_candidates", "read_candidates", "reached", "range_start", "lease_rows", "lease_no_wait",
           "settle_lost_lease", "LeaseOutcomeUnknown", "hand_off"]

_NEW = MessageStatus.NEW.value
# What a pull hands out of each leased row: the rest of a delivery is what the lease set.
_LEASED_COLUMNS = [m.c.id, m.c.data, m.c.effect_time, m.c.retry_remaining, m.c.attempt, m.c.trace_context,
                   m.c.priority, m.c.workflow_id]
#: Step 2, built once (the ids are bound at execution).
_LOCK_BY_KEY = select(*_LEASED_COLUMNS).where(bound_ids_in(), m.c.status == _NEW).with_for_update(skip_locked=True)
#: What a no-wait lease reads with its candidates (they have id, priority and effect_time).
_NO_WAIT_COLUMNS = (m.c.data, m.c.retry_remaining, m.c.attempt, m.c.trace_context, m.c.workflow_id, m.c.version)
#: How long a lease whose connection was lost waits for that session's statement to end: a
#: killed one ends within milliseconds; one the network cut off may run on unseen.
_SETTLE_WAIT = 1.0
_HELD_BY = select(m.c.id).where(bound_ids_in(), m.c.lease_token == bindparam("token", type_=m.c.lease_token.type))


def due_candidates(conn: Connection, dialect: SqlDialect, shard: Shard, limit: int, due_by: datetime, now: datetime,
                   columns: Sequence[Any] = ()) -> list[Any]:
    """Up to ``limit`` NEW messages of ``shard.topic`` due by ``due_by`` in the lock's order
    (``id``, ``priority``, ``effect_time``, ``part`` and ``columns`` of each), by a non-locking
    read of the lock index where ``shard.hint`` says they can be: first the shard's own, then
    (``hint.stranded``, several shards) other shards' messages due for longer than that.

    The server cuts the ranges' union to the first ``limit`` (and reads ``columns`` of those
    only): a topic with ten priorities has ten ranges of up to ``limit`` rows each, and a lock
    with flow limits, which asks for ten candidates a message under a per-key limit, received
    up to a hundred times what it could take."""
    return _read(conn, dialect, shard, limit, due_by, now, tuple(columns), cut=True)


def read_candidates(conn: Connection, dialect: SqlDialect, shard: Shard, limit: int, due_by: datetime,
                    now: datetime, columns: Sequence[Any] = ()) -> list[Any]:
    """Every row the candidates statement read (up to ``limit`` per range), in the lock's order:
    ``due_candidates`` before the cut, which ``reached`` needs.

    One range per priority, each read in index order from where the hint says it starts (the
    shard's cursor for its own, ``hint.floor`` otherwise; a union of ``ORDER BY effect_time, id
    LIMIT`` per priority, one statement, and a second for other shards' stranded messages when
    the own ones leave room), merged here.
    """
    return _read(conn, dialect, shard, limit, due_by, now, tuple(columns), cut=False)


def _read(conn: Connection, dialect: SqlDialect, shard: Shard, limit: int, due_by: datetime, now: datetime,
          columns: tuple[Any, ...], cut: bool) -> list[Any]:
    topic, rank, total, hint = shard.topic, shard.rank, shard.total, shard.hint
    priorities = _read_priorities(hint)
    if not priorities:
        return []
    floored = tuple(p for p, _ in hint.floors if p in priorities)
    params = {"topic": topic, "due_by": due_by, "floor": hint.floor, "limit": limit, "total": total, "rank": rank}
    params.update((f"floor_{p}", when) for p, when in hint.floors if p in priorities)
    shape = (dialect, priorities, hint.floor is not None, floored)
    statement = _first_candidates if cut else _candidates
    rows = conn.execute(statement(*shape, _ALL if total <= 1 else _OWN, columns), params).all()
    if total > 1 and hint.stranded > 0 and len(rows) < limit:
        # Other shards' stranded messages only fill what the shard's own leave: under a backlog
        # (everything due for longer than the grace) the own ranges are full, and reading the
        # others' too doubled the cost of every lock.
        params.update(limit=limit - len(rows), stranded_by=clock.after(now, -hint.stranded))
        rows += conn.execute(statement(*shape, _OTHERS, columns), params).all()
    rows.sort(key=lambda row: (row.part, -row.priority, row.effect_time, row.id))
    return rows


def reached(shard: Shard, rows: Sequence[Any], limit: int, leased: Collection[int],
            due_by: datetime) -> dict[int, datetime]:
    """Where a lock that read ``rows`` (``read_candidates``) and leased ``leased`` left each
    priority of the shard's own (``LeasedBatch.reached``).

    A range read to its end (fewer than ``limit`` rows) held nothing else due by ``due_by``; a
    full one may hold more from its last row's time on. A row read but not leased (cut by the
    limit, taken or held by another transaction meanwhile) may still be NEW: its time bounds
    its range.
    """
    own: dict[int, list[Any]] = {}
    for row in rows:
        if row.part == 0:
            own.setdefault(row.priority, []).append(row)
    found: dict[int, datetime] = {}
    for priority in _read_priorities(shard.hint):
        got = own.get(priority, [])
        bound = due_by if len(got) < limit else got[-1].effect_time
        for row in got:  # in effect_time order: the first one left behind bounds the range
            if row.id not in leased:
                bound = min(bound, row.effect_time)
                break
        found[priority] = bound
    return found


def _read_priorities(hint: LockHint) -> tuple[int, ...]:
    return tuple(sorted(hint.priorities, reverse=True)) if hint.priorities is not None else PRIORITIES_DESC


_ALL, _OWN, _OTHERS = "all", "own", "others"  # which shards a candidates statement reads


@functools.lru_cache(maxsize=256)
def _candidates(dialect: SqlDialect, priorities: tuple[int, ...], floor: bool, floored: tuple[int, ...],
                shards: str, columns: tuple[Any, ...]) -> Any:
    """The candidates statement of one shape, its values bound at execution (``topic``,
    ``due_by``, ``floor``, ``floor_<priority>`` of each of ``floored``, ``limit``, and ``total``,
    ``rank`` unless ``shards`` is ``_ALL``, ``stranded_by`` for ``_OTHERS``).

    Built once per shape: building the union (a subquery per priority) and its cache key took
    more of a broker's CPU than the database's answer, at every lock attempt.
    """
    limit = bindparam("limit", type_=Integer)
    part = 1 if shards == _OTHERS else 0

    def since(priority: int) -> list[Any]:
        return range_start(priority if part == 0 else None, floored, floor)  # cursors: own ranges only

    where: list[Any] = []
    if shards != _ALL:
        own = dialect.shard_clause(m.c.id, bindparam("total", type_=Integer), bindparam("rank", type_=Integer))
        where = [own] if shards == _OWN else \
            [not_(own), m.c.effect_time <= bindparam("stranded_by", type_=m.c.effect_time.type)]
    ranges = [dialect.lock_index_hint(select(m.c.id, m.c.priority, m.c.effect_time, *columns,
                                             literal(part).label("part")))
              .where(m.c.topic == bindparam("topic", type_=m.c.topic.type), m.c.status == _NEW,
                     m.c.priority == priority, m.c.effect_time <= bindparam("due_by", type_=m.c.effect_time.type),
                     *since(priority), *where)
              .order_by(m.c.effect_time, m.c.id).limit(limit).subquery() for priority in priorities]
    return union_all(*[select(each) for each in ranges])


@functools.lru_cache(maxsize=256)
def _first_candidates(dialect: SqlDialect, priorities: tuple[int, ...], floor: bool, floored: tuple[int, ...],
                      shards: str, columns: tuple[Any, ...]) -> Any:
    """``_candidates`` of the same shape cut to its first ``limit`` rows in the lock's order by
    the server, ``columns`` read by key for those only (the ranges read the index alone)."""
    ranges = _candidates(dialect, priorities, floor, floored, shards, ()).subquery("ranges")
    first = select(ranges).order_by(ranges.c.priority.desc(), ranges.c.effect_time, ranges.c.id) \
        .limit(bindparam("limit", type_=Integer)).subquery("first")
    if not columns:
        return select(first)
    return select(first, *columns).join_from(first, m, m.c.id == first.c.id)


def range_start(priority: Optional[int], floored: Collection[int], floor: bool) -> list[Any]:
    """Where a range of the lock index starts, as conditions of a statement built once (the
    times bound at execution): at the shard's cursor of ``priority`` when it has one (bound as
    ``floor_<priority>``; ``floored``: the priorities that have), else at the topic's floor
    (``floor``) when there is one, else at the range's beginning."""
    if priority is not None and priority in floored:
        return [m.c.effect_time >= bindparam(f"floor_{priority}", type_=m.c.effect_time.type)]
    return [m.c.effect_time >= bindparam("floor", type_=m.c.effect_time.type)] if floor else []


def lease_rows(conn: Connection, topic: str, ids: Sequence[int], change: Change) -> list[LeasedMessage]:
    """Lock the rows ``ids`` that are still NEW and nobody holds (skipping, never waiting),
    apply ``change`` (a lifecycle lease) to them and return them as deliveries, higher priority
    first, then oldest due first."""
    if not ids:
        return []
    rows = conn.execute(_LOCK_BY_KEY, {"ids": [int(i) for i in ids]}).all()
    if not rows:
        return []
    apply_to_ids(conn, change, [row.id for row in rows])
    rows.sort(key=lambda row: (-row.priority, row.effect_time, row.id))
    return _deliveries(conn, topic, [(row, row.effect_time) for row in rows], change)


class LeaseOutcomeUnknown(StorageUnavailableError):
    """A no-wait lease lost its connection from its UPDATE on (``lease_no_wait``): ``take`` are
    the rows it tried to lease, ``rows`` the candidates read, ``session`` the server's id of the
    lost connection (None if unknown). ``settle_lost_lease`` reads what it leased."""

    def __init__(self, message: str, session: Optional[int], rows: Sequence[Any], take: Sequence[Any]) -> None:
        super().__init__(message)
        self.session, self.rows, self.take = session, rows, take


def lease_no_wait(conn: Connection, dialect: SqlDialect, request: LockRequest, change: Change,
                  due_by: datetime) -> Optional[LeasedBatch]:
    """``lock_batch`` in two statements on an autocommit connection, where the server can fail a
    statement at once rather than wait for a row lock (``no_wait``); None when it did, and the
    caller takes the three-statement transaction that skips locked rows.

    The candidates are read with what a delivery needs and their version; one UPDATE by key
    then leases those that are still NEW at the version read (an optimistic lock: a row leased,
    released or edited since the read is left alone) and commits by itself. When it changed
    fewer rows than asked, the rows held under the lease's token say which.

    A connection lost from the UPDATE on leaves the lease's outcome unknown, and running it
    again would lease other rows under the same token: it raises ``LeaseOutcomeUnknown``, and
    the caller reads on another connection what the lease holds (``settle_lost_lease``)."""
    read = request.limit + 1
    rows = read_candidates(conn, dialect, request.shard, read, due_by, request.now, _NO_WAIT_COLUMNS)
    take = rows[:request.limit]
    session = session_of(conn) if take else None
    try:
        if take:
            try:
                changed = apply_to_versions(conn, change, [(row.id, row.version) for row in take], **{NO_WAIT: True})
            except DBAPIError as exc:
                if dialect.is_transient(exc) and not exc.connection_invalidated:  # a held row, a deadlock
                    return None
                raise
            if changed < len(take):
                take = _held(conn, take, change)
        return _batch(conn, request, rows, take, change, due_by)
    except DBAPIError as exc:
        if exc.connection_invalidated or isinstance(exc, OperationalError):
            raise LeaseOutcomeUnknown(f"a lease's outcome is unknown: {exc.orig!r}", session, rows, take) from exc
        raise


def settle_lost_lease(conn: Connection, lost: LeaseOutcomeUnknown, request: LockRequest, change: Change,
                      due_by: datetime) -> Optional[LeasedBatch]:
    """What the no-wait lease ``lost`` leased, read on ``conn`` once the lost connection's
    statement has ended (``lost_writes.statement_ended``): its delivery, as if its reply had come;
    None when it leased nothing (the caller locks again). A session still running its statement
    after ``_SETTLE_WAIT`` s leaves the outcome unknown: ``lost`` is raised, and the consumer
    whose pull failed gives its token back (``Client.pull_request``)."""
    if lost.session is None or not statement_ended(conn, lost.session, _SETTLE_WAIT):
        raise lost
    take = _held(conn, lost.take, change)
    return _batch(conn, request, lost.rows, take, change, due_by) if take else None


def _held(conn: Connection, take: Sequence[Any], change: Change) -> list[Any]:
    """The rows of ``take`` that the lease ``change`` holds (under its token)."""
    ours = set(conn.execute(_HELD_BY, {"ids": [row.id for row in take],
                                       "token": change.values["lease_token"]}).scalars())
    return [row for row in take if row.id in ours]


def _batch(conn: Connection, request: LockRequest, rows: Sequence[Any], take: Sequence[Any], change: Change,
           due_by: datetime) -> LeasedBatch:
    """The delivery of a no-wait lease that took ``take`` of the candidates ``rows``."""
    ordered = sorted(take, key=lambda row: (-row.priority, row.effect_time, row.id))
    leased = _deliveries(conn, request.topic, [(row, row.effect_time) for row in ordered], change)
    return LeasedBatch(leased, reached(request.shard, rows, request.limit + 1, {lm.id for lm in leased}, due_by),
                       drained=len(leased) == len(rows))


def _deliveries(conn: Connection, topic: str, rows: Sequence[tuple[Any, datetime]], change: Change,
                known: Optional[Mapping[int, tuple[int, ...]]] = None) -> list[LeasedMessage]:
    """What the lease ``change`` stored in ``rows`` ((row as read, its effect time), in delivery
    order), without reading it back: the rows plus what the lease set (``rows.leased`` builds the
    same from a row the change was applied to, at a dict per row); and the parents of the
    workflow rows among them, read unless ``known`` ({id: parents}) has them."""
    sets = change.values
    status = change.target.value if change.target else _NEW
    known = known or {}
    parents = {**parents_of(conn, [row.id for row, _ in rows if row.workflow_id is not None and row.id not in known]),
               **known}
    return [LeasedMessage(row.id, topic, row.data, status, when, row.retry_remaining,
                          row.attempt + change.attempt_delta, sets["ttr"], sets["lease_token"], sets["consumer"],
                          row.trace_context, row.priority, parents.get(row.id, ()), row.workflow_id)
            for row, when in rows]


def hand_off(conn: Connection, handoff: HandOff, due: dict[str, list[tuple[int, int, datetime]]],
             released: Optional[Mapping[int, Any]] = None, inserted: Optional[Mapping[int, NewRow]] = None) -> None:
    """Inside the transaction that made ``due`` due ({topic: [(id, priority, effect_time)]}):
    lease what the pulls waiting for them take (``tidemq_broker.handoff``), each under its own
    lease, as their own lock would. ``released``: steps this transaction released and read but
    has not written yet ({id: ``dependencies.Released``}): each is written now, and one a pull
    takes is released and leased by one UPDATE, without reading it again. ``inserted``: rows
    this transaction inserted ({id: the row}), leased by one UPDATE without being read back."""
    taken: set[int] = set()
    for topic, messages in due.items():
        for request, ids in handoff.takers(topic, messages):
            change = lease_change(request)
            if released is not None and all(id in released for id in ids):
                handoff.leased(request, _release_and_lease(conn, topic, [released[id] for id in ids], change))
                taken.update(ids)
            elif inserted is not None and all(id in inserted for id in ids):
                handoff.leased(request, _lease_inserted(conn, topic, [(id, inserted[id]) for id in ids], change))
            else:
                handoff.leased(request, lease_rows(conn, topic, ids, change))
    for change, ids in _by_release([step for step_id, step in sorted((released or {}).items())
                                    if step_id not in taken]):
        apply_to_ids(conn, change, ids)  # the rows were read FOR UPDATE: no deps_left guard needed


def _release_and_lease(conn: Connection, topic: str, steps: Sequence[Any], lease: Change) -> list[LeasedMessage]:
    """Release (WAITING -> NEW) and lease ``steps`` (``dependencies.Released``) in one UPDATE per
    release, and return them as deliveries."""
    steps = sorted(steps, key=lambda s: (-s.row.priority, s.effect_time, s.row.id))
    for release, ids in _by_release(steps):
        apply_to_ids(conn, release.then(lease), ids)
    # Their release's read carried their parents (``parents.released_parents``).
    known = {step.row.id: parents for step in steps if (parents := carried_parents(step.row)) is not None}
    return _deliveries(conn, topic, [(step.row, step.effect_time) for step in steps], lease, known)


class _Inserted(NamedTuple):
    """A row this transaction inserted, as ``_LOCK_BY_KEY`` would read it back."""

    id: int
    data: str
    retry_remaining: int
    trace_context: Optional[str]
    priority: int
    attempt: int = 0
    workflow_id: None = None


def _lease_inserted(conn: Connection, topic: str, rows: Sequence[tuple[int, NewRow]],
                    lease: Change) -> list[LeasedMessage]:
    """Lease rows this transaction inserted by one UPDATE, and return them as deliveries. No read
    first: the insert holds their row locks until the COMMIT, so nobody else can have taken or
    changed them, and what they hold is the insert's values."""
    known = sorted(((_Inserted(id, row.data, row.retry_remaining, row.trace_context or None, row.priority),
                     row.effect_time) for id, row in rows), key=lambda r: (-r[0].priority, r[1], r[0].id))
    apply_to_ids(conn, lease, [row.id for row, _ in known])
    return _deliveries(conn, topic, known, lease)


def _by_release(steps: Sequence[Any]) -> list[tuple[Change, list[int]]]:
    """``steps`` (``dependencies.Released``) grouped by their release (one per parent that
    released them): (the release, the ids), a statement each."""
    groups: dict[int, tuple[Change, list[int]]] = {}
    for step in steps:
        groups.setdefault(id(step.change), (step.change, []))[1].append(step.row.id)
    return list(groups.values())
