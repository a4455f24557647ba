"""Dependencies between messages in SQL: inserting steps with their edges, and what an ack does
to the steps waiting on the messages it finishes (``tidemq.dependencies``).

**Exactly one release.** The last members of a fan-in may succeed at the same instant in acks
on different brokers. Each ack reads the waiting children with a locking read (``FOR UPDATE``),
which takes their row locks and holds them until its COMMIT; a second ack's read of the same
child waits for that lock and then reads the committed row (InnoDB's locking reads see the
latest version, at any isolation level; SQLite runs one writer at a time, and an ack writes
its SUCCESS before it looks for children). The acks therefore count one after another, each
sees what the ones before it left, and only the ack whose count takes ``deps_left`` to 0
releases the child (WAITING -> NEW, ``deps_left`` 0, one UPDATE); the others lower
``deps_left``. Any later look finds the child NEW.

**The plain ack pays nothing.** Only a message with a ``workflow_id`` can have dependents (every
step of a submission and every message a step waits on gets one, under the row lock of that
message), so the ack's fast path guards its UPDATE with ``workflow_id IS NULL`` (a column of
the row it updates by key anyway) and leaves every workflow message to the exact path, which
reads ``workflow_id`` with the lease token it locks anyway and only then looks for children.

**Failures by wait mode.** A dependency that ends FAIL or CANCELLED cancels a child waiting
after success, and the walk goes on from it (:func:`stop_after`); for a child waiting after
complete or after failure it counts as ended, failed, under the same row locks as a success,
and the child is released when nothing is left. A child waiting after failure whose last
dependency ended a success with none failed is cancelled as not needed, and the walk goes on
from it too. Every step of a workflow that ends here is tallied for the workflow's row
(``workflows.py``), which the caller settles last.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Mapping, NamedTuple, Optional, Sequence

from sqlalchemy import Connection, Integer, bindparam, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from tidemq import dependencies as deps
from tidemq import lifecycle
from tidemq.lifecycle import Change
from tidemq.dependencies import WaitMode, WorkflowState
from tidemq.lifecycle import MessageStatus
from tidemq.tables import MESSAGE as M

from ..records import WorkflowStep, add_released
from ..schema import dependency as d
from ..schema import message as m
from ..schema import produce_request as r
from ..schema import workflow as w
from ..workflow_store import WorkflowCancel
from .changes import apply, apply_to_ids, guard
from .ids import bound_ids_in, ids_in
from .parents import released_parents
from .request_ids import id_list, stored_answer
from .rows import insert_columns, row_values
from .steps import WAITED_ON, check_known, check_steps, edges, parent_ids, plan
from .workflow_tally import Tally, policy_of
from .edges import SqlEdges
from .workflows import SqlWorkflows, create_workflow, settle

__all__ = ["SqlDependencies", "has_dependents", "release_after", "stop_after", "Released"]

_CHUNK = 1000
_EDGE_CHUNK = 10_000  # about 25 bytes an edge: far below any packet limit
_WAITING = MessageStatus.WAITING.value
# The statements of every release, built once with the ids bound at execution: every ack of a
# workflow's steps runs them, and building them each time was the broker's work, not the database's.
_EDGE_IDS = bindparam("ids", expanding=True, literal_execute=True)
_CHILDREN = select(d.c.parent_id, d.c.child_id).where(d.c.parent_id.in_(_EDGE_IDS))
# A release needs each child's edges counted, not an edge per row: decoding a row per edge was
# most of a wide fan-in's cost.
_CHILD_COUNTS = select(d.c.child_id, func.count().label("n"), func.min(d.c.parent_id).label("first")) \
    .where(d.c.parent_id.in_(_EDGE_IDS)).group_by(d.c.child_id)
_LOWER_DEPS_LEFT = update(m).where(bound_ids_in(), m.c.status == _WAITING) \
    .values(deps_left=m.c.deps_left - bindparam("n", type_=Integer))
# Every waiting child of the acked parents, locked (ascending ids: one lock order for every ack)
# and read with its ``deps_left`` before anything is written: the ack then writes only what its
# counts make of each, a release by one UPDATE that also zeroes ``deps_left``. With a delivery's
# columns for an ack with a hand-off: a step it releases and leases to a waiting pull then needs
# no second read (``claims.lease_read``).
_CHILD_COLUMNS = (m.c.id, m.c.deps_left, m.c.effect_time, m.c.topic, m.c.priority, m.c.wait_mode, m.c.deps_failed,
                  m.c.workflow_id)
_DELIVERY_COLUMNS = (m.c.data, m.c.retry_remaining, m.c.attempt, m.c.trace_context)


def _waiting_children(deliver: bool, counted: bool) -> Any:
    """The locking read of the waiting children (``deliver``: with a delivery's columns), by id
    (``counted`` False: ``ids`` are the children) or, ``counted``, joined to the count of the
    parents ``ids`` each waits on (one statement where there were two: an ack of a few hundred
    steps at most; the edges are read without locks, as the count alone read them)."""
    columns = _CHILD_COLUMNS + (_DELIVERY_COLUMNS if deliver else ())
    if not counted:
        return select(*columns).where(bound_ids_in(), m.c.status == _WAITING).order_by(m.c.id).with_for_update()
    counts = _CHILD_COUNTS.subquery()
    # A child whose count reaches its deps_left is released (or not needed) by this ack: with a
    # delivery's columns, its parents too, for the hand-off that may lease it (``parents.py``).
    parents = released_parents(m.c.deps_left == counts.c.n) if deliver else ()
    return select(*columns, counts.c.n, counts.c.first, *parents) \
        .select_from(m.join(counts, m.c.id == counts.c.child_id)) \
        .where(m.c.status == _WAITING).order_by(m.c.id).with_for_update()


_WAITING_CHILDREN = {(deliver, counted): _waiting_children(deliver, counted)
                     for deliver in (False, True) for counted in (False, True)}
_CANCELLED = MessageStatus.CANCELLED.value
_RUNNING = MessageStatus.RUNNING.value


class Released(NamedTuple):
    """A step an ack releases, as its release read it (``row``: the delivery's columns), the
    effect time the release gives it and the release itself, not written yet."""

    row: Any
    effect_time: datetime
    change: Change


class SqlDependencies(SqlWorkflows, SqlEdges):
    """Steps with dependencies: one transaction per submission; and the workflows' rows."""

    def insert_steps(self, steps: Sequence[WorkflowStep], now: datetime, request_id: str = "",
                     **who: object) -> list[int]:
        order = check_steps(steps)
        if not steps:
            return []
        wanted = parent_ids(steps)
        finished: dict[int, str] = {}

        def work(conn: Connection) -> list[int]:
            finished.clear()
            if request_id:
                # Submissions with dependencies are rare next to plain produce: looking for a
                # stored answer first costs them a read instead of a rolled-back transaction.
                found = conn.execute(select(r.c.ids).where(r.c.request_id == request_id)).scalar()
                if found is not None:
                    return stored_answer(request_id, found, len(steps))
            # Locked, so an ack cannot record an outcome of one between this read and the edges:
            # it waits, then finds the workflow id set and looks for the new steps.
            statuses: dict[int, str] = {}
            for start in range(0, len(wanted), _CHUNK):
                stmt = select(m.c.id, m.c.status).where(ids_in(wanted[start : start + _CHUNK])).with_for_update()
                statuses.update((row.id, row.status) for row in conn.execute(stmt))
            check_known(wanted, statuses)
            starts = plan(steps, order, statuses)
            columns_of: dict[tuple[int, int, int, Optional[int]], dict] = {}

            def values(i: int, workflow: Optional[int]) -> dict:
                # One change per kind of start and workflow (most steps share one), its columns
                # made once: a change per row was the largest part of a submission's Python time.
                start, mode = starts[i], steps[i].wait_mode
                key = (start.deps_left, mode, start.deps_failed, workflow)
                columns = columns_of.get(key)
                if columns is None:
                    change = deps.waiting(now, start.deps_left, mode, start.deps_failed, **who)
                    columns = columns_of[key] = {**insert_columns(change), M.workflow_id: workflow}
                return row_values(steps[i].row, columns)

            # The workflow's id is its first step's, known once that row is in: the first step
            # goes alone, the others carry the id in their INSERT (an UPDATE of every step
            # afterwards cost as much as the INSERT). Their ids are above the first one's.
            ids = self._db.dialect.insert_plain(conn, [values(0, None)])
            workflow = ids[0]
            if len(steps) > 1:
                ids += self._db.dialect.insert_plain(conn, [values(i, workflow) for i in range(1, len(steps))])
            # The first step's own workflow id, and a message waited on that belongs to no
            # workflow joins this one: its ack then looks for the steps, and the workflow ends
            # only once it has ended too.
            waited = [id for id in wanted if statuses[id] in WAITED_ON]
            marked = [workflow] + waited
            adopted = -1  # the first step is no message waited on
            for start in range(0, len(marked), _CHUNK):
                adopted += conn.execute(update(m).where(ids_in(marked[start : start + _CHUNK]),
                                                        m.c.workflow_id.is_(None))
                                        .values(workflow_id=workflow)).rowcount
            rows = edges(steps, ids, statuses)
            _insert_edges(conn, rows)
            stopped = failed = 0
            for i in order:  # parents first: each stop names a parent already stopped
                start = starts[i]
                if start.stopped:
                    by = start.by_id if start.by_id is not None else ids[start.by_step or 0]
                    change = (deps.not_needed(now, by) if start.not_needed
                              else deps.dependency_failed(now, by, start.by_status))
                    apply(conn, change, m.c.id == ids[i])
                    stopped, failed = stopped + 1, failed + (not start.not_needed)
            if request_id:
                conn.execute(insert(r).values(request_id=request_id, ids=id_list(ids), created=now))
            finished.update(create_workflow(conn, workflow, policy_of(steps), len(ids) + adopted, stopped, failed, now))
            return ids

        # On produce connections: on Galera their reads wait for what the cluster committed
        # before (``mysql._wait_for_cluster_writes``), so a dependency stored through another
        # node a moment ago is found.
        try:
            ids = self._db.tx(work, produce=True)
        except IntegrityError:
            if not request_id:
                raise
            # The same call committed through another broker meanwhile: answer as it was.
            ids = self._db.tx(work, produce=True)
        self._db.workflow_outcomes.ended(finished)
        return ids

    def cancel_workflows(self, workflow_ids: Sequence[int], running: bool, now: datetime,
                         topics: Optional[set[str]] = None, released: Optional[dict[str, dict[int, int]]] = None,
                         **who: str) -> list[WorkflowCancel]:
        change, marking = lifecycle.cancel(), lifecycle.request_cancel(now, **who)
        broker = who.get("broker", "")  # the released or stopped dependents' traces name a broker only
        finished: dict[int, str] = {}
        held_topics: set[str] = set()
        freed: dict[int, tuple[str, int]] = {}

        def work(conn: Connection) -> list[WorkflowCancel]:
            finished.clear()
            held_topics.clear()
            freed.clear()
            counts, tally, found = [], Tally(), []
            for workflow_id in workflow_ids:
                steps = conn.execute(select(m.c.id, m.c.status, m.c.topic).where(m.c.workflow_id == workflow_id)
                                     .with_for_update()).all()
                pending = sorted(row.id for row in steps if change.allows({"status": row.status}))
                for start in range(0, len(pending), _CHUNK):
                    apply(conn, change, m.c.id.in_(pending[start : start + _CHUNK]))
                marked = 0
                if running:
                    held = sorted(row.id for row in steps if row.status == _RUNNING)
                    held_topics.update(row.topic for row in steps if row.status == _RUNNING)
                    for start in range(0, len(held), _CHUNK):
                        marked += apply(conn, marking, m.c.id.in_(held[start : start + _CHUNK]), guard(marking),
                                        ~m.c.cancel_requested)
                if pending:
                    tally.add(workflow_id, len(pending), len(pending))
                    freed.update(stop_after(conn, {id: lifecycle.CANCELLED.value for id in pending}, now, broker,
                                            tally))
                if steps:
                    found.append(workflow_id)
                counts.append(WorkflowCancel(len(pending), marked))
            # The workflows' rows last, after every message row this locks (as every transaction
            # that ends steps does), in one order.
            for workflow_id in sorted(set(found)):
                conn.execute(update(w).where(w.c.id == workflow_id, w.c.finished_at.is_(None))
                             .values(state=WorkflowState.CANCELLED.value))
            finished.update(settle(conn, tally, now))
            return counts

        counts = self._db.tx(work)
        self._db.workflow_outcomes.ended(finished)
        if topics is not None:
            topics.update(held_topics)
        add_released(released, freed)
        return counts


def _insert_edges(conn: Connection, rows: Sequence[tuple[int, int]]) -> None:
    """Store the (parent_id, child_id) edges, one multi-row INSERT per ``_EDGE_CHUNK``: the ids
    are integers, written as literals (binding two parameters per edge through executemany cost
    more than the statement)."""
    for start in range(0, len(rows), _EDGE_CHUNK):
        chunk = rows[start : start + _EDGE_CHUNK]
        conn.exec_driver_sql(f"INSERT INTO {d.name} (parent_id, child_id) VALUES "
                             + ", ".join(f"({int(p)}, {int(c)})" for p, c in chunk))


def _child_counts(conn: Connection, parents: Sequence[int]) -> dict[int, tuple[int, int]]:
    """{child id: (how many of ``parents`` it waits on, the lowest of them)}, by the primary key."""
    found: dict[int, tuple[int, int]] = {}
    for start in range(0, len(parents), _CHUNK):
        for row in conn.execute(_CHILD_COUNTS, {"ids": [int(i) for i in parents[start : start + _CHUNK]]}):
            count, first = found.get(row.child_id, (0, row.first))
            found[row.child_id] = (count + row.n, min(first, row.first))
    return found


def _children(conn: Connection, parents: Sequence[int]) -> list[tuple[int, int]]:
    """The (parent_id, child_id) edges of ``parents``, by the primary key."""
    found: list[tuple[int, int]] = []
    for start in range(0, len(parents), _CHUNK):
        rows = conn.execute(_CHILDREN, {"ids": [int(i) for i in parents[start : start + _CHUNK]]})
        found.extend((row.parent_id, row.child_id) for row in rows)
    return found


def has_dependents(conn: Connection, parent: int) -> bool:
    """Whether any message waits, or waited, on ``parent``."""
    return conn.execute(select(d.c.child_id).where(d.c.parent_id == parent).limit(1)).first() is not None


def release_after(conn: Connection, parents: Sequence[int], now: datetime, broker: str,
                  tally: Optional[Tally] = None, due: Optional[dict[str, list[tuple[int, int, datetime]]]] = None,
                  read: Optional[dict[int, "Released"]] = None) -> dict[int, tuple[str, int]]:
    """Inside the transaction that records the SUCCESS of ``parents``: lower ``deps_left`` of
    their waiting children and release (WAITING -> NEW) those that reach 0, each once (see the
    module's docstring); a child waiting after failure that reaches 0 with none failed is
    cancelled as not needed instead, and what waits on it in turn. Returns {id: (topic,
    priority)} of the messages released (what the pulls' lock hints need); the workflows' steps
    ended here go into ``tally``; those released due now into ``due`` ({topic: [(id, priority,
    effect_time)]}, for a hand-off). With ``read``, those are not written here: each goes into
    ``read`` with what its delivery holds and its release, which ``claims.hand_off`` writes."""
    wanted = sorted(set(parents))
    deliver = due is not None
    if len(wanted) <= _CHUNK:  # an ack's: children and their counts in one read
        found = conn.execute(_WAITING_CHILDREN[deliver, True], {"ids": wanted}).all()
        per_child = {row.id: (row.n, row.first) for row in found}
    else:
        per_child = _child_counts(conn, wanted)
        found = conn.execute(_WAITING_CHILDREN[deliver, False], {"ids": sorted(per_child)}).all() if per_child else []
    if not found:
        return {}
    ready, topics, unneeded = {}, {}, {}
    rows, lowered = {}, {}
    for row in found:
        count = per_child[row.id][0]
        if row.deps_left != count:  # still waiting on others
            lowered.setdefault(count, []).append(row.id)
        elif row.wait_mode == WaitMode.AFTER_FAILURE and row.deps_failed == 0:
            lowered.setdefault(count, []).append(row.id)
            unneeded[row.id] = row.workflow_id
        else:  # released: its release sets deps_left to 0
            ready[row.id], topics[row.id], rows[row.id] = row.effect_time, (row.topic, row.priority), row
            if tally is not None and row.workflow_id is not None:
                tally.opened(row.workflow_id)
    for count, children in lowered.items():
        conn.execute(_LOWER_DEPS_LEFT, {"ids": children, "n": count})
    by_parent: dict[int, list[int]] = {}  # the trace names one parent that released each child: its lowest
    for child in sorted({*ready, *unneeded}):
        by_parent.setdefault(per_child[child][1], []).append(child)
    for parent, children in by_parent.items():
        now_due = [child for child in children if child in ready and ready[child] <= now]
        if now_due:  # the common case: due now, one statement, built once (``apply_to_ids``)
            change = deps.released(now, now, parent, broker)
            if due is not None:
                for child in now_due:
                    topic, priority = topics[child]
                    due.setdefault(topic, []).append((child, priority, now))
            if read is not None:  # written by the hand-off, with the lease when a pull takes it
                read.update((child, Released(rows[child], now, change)) for child in now_due)
            else:
                # No ``deps_left`` guard: the rows were read FOR UPDATE in this transaction.
                apply_to_ids(conn, change, now_due)
        for child in children:
            if child in ready and ready[child] > now:  # produced with a later effect time, which it keeps: rare
                apply(conn, deps.released(now, ready[child], parent, broker), m.c.id == child)
        not_needed = [child for child in children if child in unneeded]
        if not_needed:
            apply(conn, deps.not_needed(now, parent, broker), ids_in(not_needed))
    if unneeded:
        if tally is not None:
            for workflow_id in unneeded.values():
                if workflow_id is not None:
                    tally.end(workflow_id, _CANCELLED, failed=False)
        topics.update(stop_after(conn, {id: _CANCELLED for id in unneeded}, now, broker, tally))
    return topics


def stop_after(conn: Connection, parents: Mapping[int, str], now: datetime, broker: str,
               tally: Optional[Tally] = None) -> dict[int, tuple[str, int]]:
    """Inside the transaction that records the FAIL or CANCELLED of ``parents`` ({id: status}):
    cancel their waiting children that wait after success, and theirs in turn (the policy stop);
    count the failure as ended for the others, releasing those with nothing left (or cancelling,
    as not needed, one waiting after failure: impossible here, a failure was counted). Returns
    {id: (topic, priority)} of the messages released; the workflows' steps cancelled go into
    ``tally``."""
    released: dict[int, tuple[str, int]] = {}
    frontier = dict(parents)
    while frontier:
        found = _children(conn, sorted(frontier))
        waiting = {row.id: row for row in conn.execute(
            select(m.c.id, m.c.wait_mode, m.c.deps_left, m.c.effect_time, m.c.topic, m.c.priority, m.c.workflow_id)
            .where(ids_in(sorted({c for _, c in found})), m.c.status == _WAITING).with_for_update())} if found else {}
        stops: dict[int, list[int]] = {}
        stopping: set[int] = set()
        ended: dict[int, list[int]] = {}  # child -> the failed parents it counts as ended
        for parent, child in sorted(found):
            row = waiting.get(child)
            if row is None:
                continue
            if row.wait_mode == WaitMode.AFTER_SUCCESS:
                if child not in stopping:
                    stopping.add(child)
                    stops.setdefault(parent, []).append(child)
            else:
                ended.setdefault(child, []).append(parent)
        after: dict[int, str] = {}
        for parent, children in stops.items():
            apply(conn, deps.dependency_failed(now, parent, frontier[parent], broker), ids_in(children))
            after.update((child, _CANCELLED) for child in children)
            if tally is not None:
                tally.end_many((waiting[child].workflow_id, _CANCELLED) for child in children
                               if waiting[child].workflow_id is not None)
        for child, failed in ended.items():
            conn.execute(update(m).where(m.c.id == child, m.c.status == _WAITING).values(
                deps_left=m.c.deps_left - len(failed), deps_failed=m.c.deps_failed + len(failed)))
            if waiting[child].deps_left - len(failed) <= 0:
                row = waiting[child]
                apply(conn, deps.released(now, row.effect_time, failed[-1], broker), m.c.id == child)
                released[child] = (row.topic, row.priority)
        frontier = after
    return released
