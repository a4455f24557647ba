"""What the admin console reads and changes beyond the broker's own operations.

Console users, keyset pages of messages that stay fast on millions of rows, edits and deletes
that append a trace line naming the admin, and the figures the dashboard shows. It works on any
SQL store (MySQL/MariaDB or SQLite): the factory gives it the storage's database object, so it
shares its engine and transactions. Message edits and deletes are transitions, so they are the storage's own
operations (``MessageWrites.edit_message``, ``MessageWrites.delete_messages``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Optional, Sequence

from sqlalchemy import Connection, case, delete, func, insert, select, update

from tidemq.lifecycle import FINAL_STATUSES, STATUSES, MessageStatus

from ..records import (COUNTED_FROM, SCAN_WINDOW, AdminUser, MessageFilter, MessagePage, MessageResult, TopicBacklog,
                       TopicCounts)
from ..schema import admin_session
from ..schema import admin_user as u
from ..schema import alarm as a
from ..schema import message as m
from ..schema import topic_count as tc
from ..schema import topic_stats as ts
from .database import SqlDatabase
from .reads import RESULT_COLUMNS, topics_present
from .rows import to_message
from .workflow_reads import SqlWorkflowReads

__all__ = ["SqlConsole"]


@dataclass
class _Plan:
    indexed: list[Any] = field(default_factory=list)
    residual: list[Any] = field(default_factory=list)
    # Conditions of one index walk each, merged by id: every status of one topic, or every
    # topic of one status (the index leads with topic).
    branches: list[list[Any]] = field(default_factory=list)
    index: Optional[str] = None


class SqlConsole(SqlWorkflowReads):
    """Console operations over the storage's database object; each method is one transaction
    (the workflow reads are in ``workflow_reads.py``)."""

    def __init__(self, db: SqlDatabase) -> None:
        self._db = db

    # -- users -------------------------------------------------------------------------------
    def get_user(self, name: str) -> Optional[AdminUser]:
        """The user called ``name``, if any."""
        row = self._db.tx(lambda c: c.execute(select(u.c.name, u.c.password_hash, u.c.role)
                                                   .where(u.c.name == name)).first())
        return AdminUser(row.name, row.password_hash, row.role) if row else None

    def users(self) -> list[AdminUser]:
        """Every user, by name."""
        rows = self._db.tx(lambda c: c.execute(select(u.c.name, u.c.password_hash, u.c.role)
                                                    .order_by(u.c.name)).all())
        return [AdminUser(r.name, r.password_hash, r.role) for r in rows]

    def save_user(self, name: str, password_hash: str, role: str, now: datetime) -> bool:
        """Create the user or replace its password and role (ending its sessions); True when it
        was created."""
        def work(conn: Connection) -> bool:
            if conn.execute(select(u.c.name).where(u.c.name == name).with_for_update()).first() is None:
                conn.execute(insert(u).values(name=name, password_hash=password_hash, role=role,
                                              add_time=now, update_time=now))
                return True
            conn.execute(update(u).where(u.c.name == name).values(password_hash=password_hash, role=role,
                                                                   update_time=now))
            # A new password ends every session signed in with the old one, in the same
            # transaction: a stolen session must not outlive the reset meant to lock it out.
            conn.execute(delete(admin_session).where(admin_session.c.user_name == name))
            return False

        return self._db.tx(work)

    # -- listing -----------------------------------------------------------------------------
    def list_page(self, flt: MessageFilter, limit: int, before_id: Optional[int] = None,
                  window: int = SCAN_WINDOW) -> MessagePage:
        """A page of messages matching ``flt`` with ids below ``before_id``, newest first.

        Topic, status, id and unique_key are answered from indexes. Text and time ranges are
        checked row by row, so they examine at most ``window`` ids per page.
        """
        def work(conn: Connection) -> MessagePage:
            plan = self._plan(conn, flt)
            if plan is None:
                return MessagePage([], None)
            floor: Optional[int] = None
            conds = list(plan.indexed) + list(plan.residual)
            if before_id is not None:
                conds.append(m.c.id < before_id)
            if plan.residual and flt.id is None:
                top = before_id if before_id is not None else (conn.execute(select(func.max(m.c.id))).scalar() or 0) + 1
                floor = max(top - window, 0)
                conds.append(m.c.id >= floor)
            found = self._walk(conn, plan, conds, limit + 1, newest_first=True)
            rows = [to_message(r._mapping) for r in _rows(conn, found[:limit])]
            if len(found) > limit:
                return MessagePage(rows, found[limit - 1], floor)
            more = floor is not None and floor > 1
            return MessagePage(rows, floor if more else None, floor)

        return self._db.tx(work)

    def _walk(self, conn: Connection, plan: _Plan, conds: list[Any], limit: int, newest_first: bool) -> list[int]:
        """The first ``limit`` ids matching ``conds`` (highest or lowest first): one index walk
        per branch of the plan (one per status of a topic, or one per topic of a status), merged."""
        order = m.c.id.desc() if newest_first else m.c.id.asc()
        found: list[int] = []
        for branch in plan.branches or [[]]:
            stmt = select(m.c.id).where(*conds, *branch).order_by(order).limit(limit)
            if plan.index:
                stmt = self._db.dialect.force_index(stmt, plan.index)
            found.extend(conn.execute(stmt).scalars())
        found.sort(reverse=newest_first)
        return found[:limit]

    def _plan(self, conn: Connection, flt: MessageFilter) -> Optional[_Plan]:
        plan = _Plan()
        if flt.id is not None:
            plan.indexed.append(m.c.id == flt.id)
        if flt.topic:
            plan.indexed.append(m.c.topic == flt.topic)
        if flt.status:
            plan.indexed += _status_conds(flt.status)
        if flt.id is None and not flt.unique_key and (flt.topic or flt.status):
            # Walk (topic, status, lease_expire = NULL) in id order: the primary key ends the
            # index. Without FORCE INDEX MySQL's planner prefers idx_message_lock and sorts every
            # row of the range: 1 s on a 1M table instead of a 5 ms walk.
            plan.index = "idx_message_topic_status_lease"
            if not flt.status:
                plan.branches = [_status_conds(status.value) for status in STATUSES]
            elif not flt.topic:
                topics = topics_present(conn)
                if not topics:
                    return None
                plan.branches = [[m.c.topic == name] for name in topics]
        if flt.unique_key:
            plan.indexed.append(m.c.unique_key == flt.unique_key)
            if not flt.topic:
                # The unique index leads with topic: naming every topic turns it into ranges.
                names = topics_present(conn)
                if not names:
                    return None
                plan.indexed.append(m.c.topic.in_(names))
        if flt.effect_from:
            plan.residual.append(m.c.effect_time >= flt.effect_from)
        if flt.effect_to:
            plan.residual.append(m.c.effect_time < flt.effect_to)
        if flt.added_from:
            plan.residual.append(m.c.add_time >= flt.added_from)
        if flt.added_to:
            plan.residual.append(m.c.add_time < flt.added_to)
        if flt.text:
            plan.residual.append(m.c.data.contains(flt.text, autoescape=True))
        return plan

    def matching_ids(self, flt: MessageFilter, after_id: int, limit: int) -> list[int]:
        """Ids above ``after_id`` matching ``flt`` (every criterion), ascending: for bulk actions."""
        def work(conn: Connection) -> list[int]:
            plan = self._plan(conn, flt)
            if plan is None:
                return []
            return self._walk(conn, plan, [*plan.indexed, *plan.residual, m.c.id > after_id], limit, newest_first=False)

        return self._db.tx(work)

    # -- dashboard ---------------------------------------------------------------------------
    def results_page(self, topic: str, limit: int, before_id: Optional[int] = None) -> list[MessageResult]:
        def work(conn: Connection) -> list[MessageResult]:
            # One range of (topic, status, lease_expire) per final status, read newest first: the
            # index ends with the id, and lease_expire is NULL in every final status.
            found: list[MessageResult] = []
            below = [m.c.id < before_id] if before_id is not None else []
            for status in FINAL_STATUSES:
                rows = conn.execute(select(*RESULT_COLUMNS).where(
                    m.c.topic == topic, m.c.status == status.value, m.c.lease_expire.is_(None),
                    m.c.result.is_not(None), *below).order_by(m.c.id.desc()).limit(limit))
                found += [MessageResult(**row._mapping) for row in rows]
            return sorted(found, key=lambda r: r.id, reverse=True)[:limit]

        return self._db.tx(work)

    def topics_present(self) -> list[str]:
        """Every topic that has messages (read along an index that starts with topic)."""
        return self._db.tx(topics_present)

    def topic_counts(self, known: Optional[dict[str, dict[str, int]]] = None,
                     topics: Optional[Sequence[str]] = None) -> "TopicCounts":
        """Messages per topic and status for the dashboard and topics pages.

        A status the leader's stored count (``tidemq_topic_count``) puts at ``COUNTED_FROM`` or
        more is taken from it, with its time; the other statuses, and every status when nothing
        was stored yet, are counted now in one grouped query along (topic, status, ...). On a
        large table that leaves out the bulk (finished messages) while the few in flight stay
        exact. ``known`` holds counts the caller made itself just now ({topic: {status: n}}, e.g.
        NEW from the backlog query): those statuses are neither counted again nor stored ones.
        ``topics``: the topics that have messages, when the caller read them already."""
        known = known or {}
        known_statuses = {status for by_status in known.values() for status in by_status}

        def work(conn: Connection) -> "TopicCounts":
            present = list(topics) if topics is not None else topics_present(conn)
            stored: dict[str, dict[str, int]] = {}
            counted_at: Optional[datetime] = None
            for row in conn.execute(select(tc)).all():
                stored.setdefault(row.status, {})[row.topic] = int(row.messages)
                counted_at = row.counted_at if counted_at is None else min(counted_at, row.counted_at)
            from_store = {status for status, by_topic in stored.items()
                          if sum(by_topic.values()) >= COUNTED_FROM and status not in known_statuses}
            live = [s.value for s in STATUSES if s.value not in from_store and s.value not in known_statuses]
            counts: dict[str, dict[str, int]] = {}
            if present and live:
                for topic, status, n in conn.execute(
                        select(m.c.topic, m.c.status, func.count())
                        .where(m.c.topic.in_(present), m.c.status.in_(live)).group_by(m.c.topic, m.c.status)):
                    counts.setdefault(topic, {})[status] = int(n)
            for status in from_store:
                for topic, n in stored[status].items():
                    counts.setdefault(topic, {})[status] = n
            for topic, by_status in known.items():
                counts.setdefault(topic, {}).update({status: n for status, n in by_status.items() if n})
            return TopicCounts(counts, sorted(from_store), counted_at if from_store else None)

        return self._db.tx(work)

    def backlog(self, topics: Sequence[str], now: datetime) -> dict[str, TopicBacklog]:
        """Due and scheduled NEW counts per topic, each an index range on (topic, status, effect_time)."""
        def work(conn: Connection) -> dict[str, TopicBacklog]:
            out = {name: TopicBacklog(0, 0, None) for name in topics}
            if not topics:
                return out
            # One grouped query over the NEW ranges of every topic, not three per topic.
            due = m.c.effect_time <= now
            for name, total, due_count, oldest in conn.execute(
                    select(m.c.topic, func.count(), func.sum(case((due, 1), else_=0)),
                           func.min(case((due, m.c.effect_time), else_=None)))
                    .where(m.c.topic.in_(list(topics)), m.c.status == MessageStatus.NEW.value)
                    .group_by(m.c.topic)):
                out[name] = TopicBacklog(int(due_count or 0), int(total) - int(due_count or 0), oldest)
            return out

        return self._db.tx(work)

    def topic_stats(self, since: datetime) -> dict[str, list[dict[str, Any]]]:
        """Hourly report rows (tidemq_topic_stats) since ``since``, per topic, oldest first."""
        stmt = select(ts).where(ts.c.hour >= since).order_by(ts.c.topic, ts.c.hour)
        out: dict[str, list[dict[str, Any]]] = {}
        for row in self._db.tx(lambda c: c.execute(stmt).all()):
            out.setdefault(row.topic, []).append(dict(row._mapping))
        return out

    def open_alarms(self, limit: int = 50) -> list[dict[str, Any]]:
        """Alarms not resolved yet, newest first."""
        stmt = select(a).where(a.c.resolved_at.is_(None)).order_by(a.c.raised_at.desc()).limit(limit)
        return [dict(r._mapping) for r in self._db.tx(lambda c: c.execute(stmt).all())]


def _status_conds(status: str) -> list[Any]:
    """``status = s``, and outside RUNNING ``lease_expire IS NULL`` (always true there), which
    turns (topic, status, lease_expire) into a walk in id order. RUNNING rows, the ones in flight,
    are few enough to sort."""
    if status == MessageStatus.RUNNING.value:
        return [m.c.status == status]
    return [m.c.status == status, m.c.lease_expire.is_(None)]


def _rows(conn: Connection, ids: list[int]) -> list[Any]:
    """The full rows of ``ids``, in that order."""
    if not ids:
        return []
    by_id = {row.id: row for row in conn.execute(select(m).where(m.c.id.in_(ids)))}
    return [by_id[i] for i in ids if i in by_id]
