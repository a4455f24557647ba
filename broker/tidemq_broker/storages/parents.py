"""A step's parents in SQL: the ids a delivery names as its inputs (``depends_on``), read in
the transaction that leases it (a lock, or a hand-off's lease), or carried by the read that
released it (``released_parents``)."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from sqlalchemy import Connection, String, bindparam, case, func, select

from ..schema import dependency as d
from ..schema import message as m
from .ids import concat_ids

__all__ = ["carried_parents", "parents_of", "released_parents"]

_IDS = bindparam("ids", expanding=True, literal_execute=True)
# Each child's parents as one comma-separated list, not a row per edge: decoding a row per edge
# was most of a wide fan-in's delivery (a chord's callback waits on 10,000 members: read in 30
# ms, as one list in 6).
_PARENT_LISTS = select(d.c.child_id, func.count().label("n"),
                       func.group_concat(d.c.parent_id).cast(String).label("ids")) \
    .where(d.c.child_id.in_(_IDS)).group_by(d.c.child_id)
_PARENTS = select(d.c.child_id, d.c.parent_id).where(d.c.child_id.in_(_IDS)).order_by(d.c.child_id, d.c.parent_id)


def parents_of(conn: Connection, children: Sequence[int]) -> dict[int, tuple[int, ...]]:
    """{child id: its parents' ids, ascending} of ``children``, in one read of the child index
    (a lease's rows: at most ``MAX_PULL``, one statement); nothing to read, no statement. Each
    child's list comes as one string, checked against its count: a list the server cut short
    (``group_concat_max_len`` set below what the MySQL storage asks for) is read again edge by edge."""
    if not children:
        return {}
    ids = [int(i) for i in children]
    found: dict[int, tuple[int, ...]] = {}
    for row in conn.execute(_PARENT_LISTS, {"ids": ids}):
        parents = tuple(concat_ids(row.ids))
        if len(parents) != row.n:
            return _parents_by_edge(conn, ids)
        found[row.child_id] = parents
    return found


def _parents_by_edge(conn: Connection, children: list[int]) -> dict[int, tuple[int, ...]]:
    found: dict[int, list[int]] = {}
    for row in conn.execute(_PARENTS, {"ids": children}):
        found.setdefault(row.child_id, []).append(row.parent_id)
    return {child: tuple(parents) for child, parents in found.items()}


def released_parents(released: Any) -> tuple[Any, Any]:
    """Two columns for a read of ``message`` rows: the count and the list of each row's parents
    where ``released`` (a condition on the read's row) holds, NULL elsewhere. The read that
    releases a step then carries what its delivery names, and the hand-off that leases it in
    the same transaction reads no edges again (``carried_parents``); the subqueries run only
    for the rows that condition picks (a chord's callback is listed once, by the ack of its last
    member, not by every member's)."""
    n = select(func.count()).where(d.c.child_id == m.c.id).scalar_subquery()
    ids = select(func.group_concat(d.c.parent_id).cast(String)).where(d.c.child_id == m.c.id).scalar_subquery()
    return case((released, n), else_=None).label("parents_n"), case((released, ids), else_=None).label("parents")


def carried_parents(row: Any) -> Optional[tuple[int, ...]]:
    """The parents ``row`` carries from a read with ``released_parents``, ascending; None when it
    carries none, or when the server cut the list short (then ``parents_of`` reads them)."""
    n, ids = getattr(row, "parents_n", None), getattr(row, "parents", None)
    if n is None or ids is None:
        return None
    parents = tuple(concat_ids(ids))
    return parents if len(parents) == n else None
