"""Applying a lifecycle :class:`~tidemq.lifecycle.Change` to message rows.

The lifecycle decides what a transition sets; this module only says it in SQLAlchemy Core:
the guard on the source states, the values, the attempt and version counters and the trace.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, Connection, delete, update

from tidemq.lifecycle import Change

from ..schema import message as m

__all__ = ["values_of", "guard", "apply"]


def values_of(change: Change) -> dict[Any, Any]:
    """The SET clause of ``change``: its values, the target status and the counters."""
    values: dict[Any, Any] = dict(change.values)
    if change.target is not None:
        values["status"] = change.target.value
    if change.attempt_delta:
        values["attempt"] = m.c.attempt + change.attempt_delta
    if change.bump_version:
        values["version"] = m.c.version + 1
    if change.trace:
        values["trace"] = m.c.trace + change.trace
    return values


def guard(change: Change) -> ColumnElement[bool]:
    """``status`` is one of the states ``change`` may leave."""
    source = [status.value for status in change.source]
    return m.c.status == source[0] if len(source) == 1 else m.c.status.in_(source)


def apply(conn: Connection, change: Change, *where: Any) -> int:
    """Apply ``change`` to the rows matching ``where`` and its guard; return how many changed."""
    if change.delete:
        return conn.execute(delete(m).where(*where, guard(change))).rowcount
    return conn.execute(update(m).where(*where, guard(change)).values(values_of(change))).rowcount
