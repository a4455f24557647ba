"""The memory storage's tables: plain dicts behind one lock, so each operation is one atomic
transaction, as a serializable SQL transaction would be.

Message rows are ``{column name: value}`` with the names of ``tidemq.tables.MESSAGE``: the form
``tidemq.lifecycle.Change.allows`` and ``Change.apply_to`` work on, so every transition is the
lifecycle's, applied one way (:func:`apply`). Ids are handed out as an auto-increment column
does: ``1, 1 + step, 1 + 2 step, ...``, never reused, the step being a server's
``auto_increment_increment`` (a Galera cluster of n nodes: n), so the shard rule
``MOD(id DIV step, total) = rank`` has the ids it has on such a server.
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any, Iterable, Iterator, Optional

from tidemq.lifecycle import Change
from tidemq.tables import MESSAGE as M

from ...records import AdminUser, Principal, Schedule
from ...schema import message as message_table
from ..workflow_tally import Outcomes

__all__ = ["MemoryState", "ConstraintError", "apply", "NOT_NULL"]

Row = dict[str, Any]
#: The message columns the schema declares NOT NULL: an insert that leaves one of them empty is
#: refused, whole, as a database refuses it.
NOT_NULL = frozenset(column.name for column in message_table.c if not column.nullable and column.name != M.id)


class ConstraintError(ValueError):
    """Raised when a row breaks a constraint the SQL schema declares (a NOT NULL column)."""


class MemoryState:
    """Every table of one memory storage, and the lock each operation holds while it runs."""

    def __init__(self, id_step: int = 1) -> None:
        if id_step < 1:
            raise ValueError(f"id_step must be 1 or more, got {id_step}")
        self.lock = threading.RLock()
        self.id_step = id_step
        self._next_id = 1
        self.messages: dict[int, Row] = {}  # by id, in id order
        self.unique: dict[tuple[str, str], int] = {}  # (topic, unique_key) -> id
        self.children: dict[int, set[int]] = {}  # tidemq_dependency: parent id -> the ids waiting on it
        self.parents: dict[int, set[int]] = {}  # the same edges by child (the child index)
        self.workflows: dict[int, Row] = {}  # tidemq_workflow by id, {column: value}
        self.outcomes = Outcomes()  # told of the workflows an operation ended, once it is done
        self.requests: dict[str, tuple[datetime, list[int]]] = {}  # request id -> (created, ids answered)
        self.topics: dict[str, Row] = {}  # by name: TopicSettings' fields, times and the rate's bucket
        self.topic_counts: list[tuple[str, str, int, datetime]] = []  # the leader's (topic, status, n, at)
        self.schedules: dict[str, Schedule] = {}
        self.principals: dict[str, Principal] = {}
        self.users: dict[str, AdminUser] = {}
        self.sessions: dict[str, Row] = {}  # by the id's hash: user_name, created, last_seen
        self.failures: dict[str, list[Any]] = {}  # by the key's hash: [failures, last_failure]

    def new_id(self) -> int:
        """The next id, as the column's auto-increment hands it out."""
        id, self._next_id = self._next_id, self._next_id + self.id_step
        return id

    def shard_of(self, id: int, total: int) -> int:
        """The QUEUE shard of message ``id`` among ``total``: ``MOD(id DIV step, total)``."""
        return (id // self.id_step) % total

    def rows(self, topic: Optional[str] = None, status: Optional[str] = None) -> Iterator[Row]:
        """The message rows (of ``topic``, in ``status``), in id order."""
        for row in self.messages.values():
            if (topic is None or row[M.topic] == topic) and (status is None or row[M.status] == status):
                yield row

    def insert(self, row: Row) -> None:
        """Store a new message row (its id set)."""
        self.messages[row[M.id]] = row
        if row[M.unique_key]:
            self.unique[(row[M.topic], row[M.unique_key])] = row[M.id]

    def delete(self, ids: Iterable[int]) -> int:
        """Remove the rows ``ids``; returns how many there were."""
        gone = 0
        for id in ids:
            row = self.messages.pop(id, None)
            if row is not None:
                gone += 1
                if row[M.unique_key]:
                    self.unique.pop((row[M.topic], row[M.unique_key]), None)
        return gone


def apply(state: MemoryState, change: Change, rows: Iterable[Row]) -> int:
    """Apply ``change`` to each of ``rows`` it ``allows`` (the caller has checked any other guard,
    such as the lease token): remove the row for a delete. Returns how many changed."""
    chosen = [row for row in rows if change.allows(row)]
    if change.delete:
        return state.delete([row[M.id] for row in chosen])
    for row in chosen:
        change.apply_to(row)
    return len(chosen)
