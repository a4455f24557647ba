"""The retention of dependency edges in SQL: the edges of messages that are gone.

An edge (``tidemq_dependency``) is needed while its child exists: to count and release it, to
name its inputs, to draw its workflow. Messages leave by many ways (retention, the archive, a
cancel of a waiting step, an operator's delete, a restore of an older table), and the edges of
a deleted child would stay for ever. Rather than a statement on each of those paths, the
maintenance leader sweeps the edges in child order, a bounded batch per look, and deletes those
whose child is no longer stored (``maintenance/edges.py``).
"""

from __future__ import annotations

from sqlalchemy import Connection, delete, select

from ..schema import dependency as d
from ..schema import message as m
from .database import SqlDatabase
from .ids import ids_in

__all__ = ["SqlEdges"]


class SqlEdges:
    """``forget_orphan_edges`` of the dependencies role."""

    _db: SqlDatabase

    def forget_orphan_edges(self, after: int, limit: int) -> tuple[int, int]:
        def work(conn: Connection) -> tuple[int, int]:
            children = list(conn.execute(select(d.c.child_id).where(d.c.child_id > after).distinct()
                                         .order_by(d.c.child_id).limit(limit)).scalars())
            if not children:
                return 0, 0
            stored = set(conn.execute(select(m.c.id).where(ids_in(children))).scalars())
            gone = [child for child in children if child not in stored]
            deleted = conn.execute(delete(d).where(d.c.child_id.in_(gone))).rowcount if gone else 0
            return children[-1], deleted

        return self._db.tx(work)
