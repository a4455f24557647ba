"""Applying a lifecycle :class:`~tidemq.lifecycle.Change` to message rows.

The lifecycle decides what a transition sets; this module only says it in SQLAlchemy Core:
the guard on the source states, the values, the attempt and version counters and the trace.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, Optional, Sequence

from sqlalchemy import ColumnElement, Connection, String, bindparam, case, delete, func, tuple_, update
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.visitors import InternalTraversal

from tidemq.lifecycle import Change

from ..schema import message as m
from .ids import IDS, bound_ids_in, ids_in

__all__ = ["values_of", "guard", "apply", "apply_to_ids", "apply_to_versions", "apply_each"]

_CHUNK = 1000
#: Text values (results) one statement carries at most: a batch of large results is split so no
#: statement nears the server's max_allowed_packet.
_CHUNK_BYTES = 4 << 20
#: SQLAlchemy's names of the servers that pick a row's own value with ``ELT(FIELD(...))``.
_FIELD_PICKERS = frozenset({"mysql", "mariadb"})


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
    return _status_in(change.source)


def _status_in(states: Sequence[Any]) -> ColumnElement[bool]:
    source = [status.value for status in states]
    return m.c.status == source[0] if len(source) == 1 else m.c.status.in_(source)


def apply(conn: Connection, change: Change, *where: Any) -> int:
    """Apply ``change`` to the rows matching ``where`` and its guard; return how many changed."""
    if change.delete:
        return conn.execute(delete(m).where(*where, guard(change))).rowcount
    return conn.execute(update(m).where(*where, guard(change)).values(values_of(change))).rowcount


def apply_to_ids(conn: Connection, change: Change, ids: Sequence[int], lease_token: Optional[str] = None,
                 no_workflow: bool = False, workflow_id: Optional[int] = None) -> int:
    """``apply`` to the rows ``ids`` (and, when given, held under ``lease_token``; with
    ``no_workflow``, only rows outside any workflow; with ``workflow_id``, only rows of that
    workflow), by a statement built once per kind of
    change with every value bound at execution: the UPDATEs of every lease and every plain ack,
    where building the statement and its cache key each time cost more of a broker's CPU than
    the database's answer. Returns how many rows changed."""
    if change.delete or not ids:
        where = (() if lease_token is None else (m.c.lease_token == lease_token,)) \
            + ((m.c.workflow_id.is_(None),) if no_workflow else ()) \
            + ((m.c.workflow_id == workflow_id,) if workflow_id is not None else ())
        return apply(conn, change, ids_in(ids), *where)
    stmt = _bound_update(tuple(change.source), change.target, tuple(sorted(change.values)), change.attempt_delta,
                         change.bump_version, bool(change.trace), lease_token is not None, no_workflow,
                         workflow_id is not None)
    params = {f"v_{name}": value for name, value in change.values.items()}
    params.update(ids=[int(i) for i in ids], v_trace=change.trace, v_token=lease_token, v_workflow=workflow_id)
    return conn.execute(stmt, params).rowcount


def apply_to_versions(conn: Connection, change: Change, rows: Sequence[tuple[int, int]],
                      **options: Any) -> int:
    """``apply_to_ids`` to the rows ``rows`` ((id, version)) that still have that version: an
    optimistic lock, which leaves alone a row changed since it was read, whatever it is now.
    ``options``: execution options of the statement. Returns how many rows changed."""
    if not rows:
        return 0
    stmt = _bound_update(tuple(change.source), change.target, tuple(sorted(change.values)), change.attempt_delta,
                         change.bump_version, bool(change.trace), False, versioned=True)
    params = {f"v_{name}": value for name, value in change.values.items()}
    params.update(ids=[int(id) for id, _ in rows], pairs=[(int(id), int(version)) for id, version in rows],
                  v_trace=change.trace)
    return conn.execute(stmt, params, execution_options=options).rowcount


@functools.lru_cache(maxsize=64)
def _bound_update(source: tuple[Any, ...], target: Any, names: tuple[str, ...], attempt_delta: int,
                  bump_version: bool, trace: bool, token: bool, no_workflow: bool = False,
                  in_workflow: bool = False, versioned: bool = False) -> Any:
    values: dict[Any, Any] = {name: bindparam(f"v_{name}", type_=m.c[name].type) for name in names}
    if target is not None:
        values["status"] = target.value
    if attempt_delta:
        values["attempt"] = m.c.attempt + attempt_delta
    if bump_version:
        values["version"] = m.c.version + 1
    if trace:
        values["trace"] = m.c.trace + bindparam("v_trace", type_=m.c.trace.type)
    where = [bound_ids_in(), _status_in(source)]
    if token:
        where.append(m.c.lease_token == bindparam("v_token", type_=m.c.lease_token.type))
    if no_workflow:
        where.append(m.c.workflow_id.is_(None))
    if in_workflow:
        where.append(m.c.workflow_id == bindparam("v_workflow", type_=m.c.workflow_id.type))
    if versioned:  # beside the ids' own IN, which makes it a walk of the primary key
        where.append(tuple_(m.c.id, m.c.version).in_(bindparam("pairs", expanding=True)))
    return update(m).where(*where).values(values)


def apply_each(conn: Connection, change: Change, rows: Sequence[tuple[int, Mapping[str, Any]]],
               lease_token: Optional[str] = None, no_workflow: bool = False, workflow_id: Optional[int] = None) -> int:
    """Apply ``change`` to each row of ``rows`` ((id, {column: value}), every row naming the same
    columns) with that row's own values of those columns (each message's result), in one UPDATE
    per chunk: a column whose values differ is set by a CASE on the id. ``lease_token``: only
    rows held under it change; ``no_workflow`` and ``workflow_id``: only rows outside any
    workflow, or of that one (see ``apply_to_ids``). Returns how many rows changed.

    Each chunk's statement is built once per size class (a power of two; the last id repeats
    and nulls fill the values, which are never picked: a repeated WHEN never matches twice, and
    FIELD never answers past the ids) with every value bound: built anew
    for each ack batch, the CASE of hundreds of branches cost the broker more than the write.
    The rows carry only what differs, not a change each: copying a change per row was most of
    the broker's work in an ack of results. On MySQL and MariaDB a text column is picked by
    ``ELT(FIELD(id, ...), ...)`` instead of the CASE, which the server walks branch by branch
    for every row: an ack of 500 successes, each with its own result, took 13 ms instead of
    15-17 (10-11 without results). FIELD reads the ids the WHERE's IN writes into the statement,
    not a bound parameter each: an id bound twice over cost the broker's Python about a third of
    such an ack."""
    if not rows:
        return 0
    own = tuple(rows[0][1])
    field = conn.dialect.name in _FIELD_PICKERS
    sizes = [sum(len(v) for v in values.values() if isinstance(v, str)) for _, values in rows]
    done, start = 0, 0
    while start < len(rows):
        end, size = start, 0
        while end < len(rows) and end - start < _CHUNK and (end == start or size < _CHUNK_BYTES):
            size += sizes[end]
            end += 1
        part = rows[start:end]
        columns = {name: [values[name] for _, values in part] for name in own}
        differ = tuple(sorted(name for name, got in columns.items() if any(v != got[0] for v in got)))
        bucket = 1 << (len(part) - 1).bit_length()
        stmt = _bound_case_update(tuple(change.source), change.target, tuple(sorted({*change.values, *own})), differ,
                                  change.attempt_delta, change.bump_version, bool(change.trace),
                                  lease_token is not None, bucket, no_workflow, workflow_id is not None, field)
        params: dict[str, Any] = {f"v_{name}": value for name, value in change.values.items() if name not in differ}
        params.update((f"v_{name}", got[0]) for name, got in columns.items() if name not in differ)
        ids = [int(id) for id, _ in part]
        params.update(ids=ids, v_trace=change.trace, v_token=lease_token, v_workflow=workflow_id)
        pad = bucket - len(part)
        if _compares(differ, field):  # FIELD reads the IN's own list; a CASE compares bound ids
            params.update(zip(_names("w", bucket), ids + ids[-1:] * pad))
        for name in differ:
            got = columns[name]
            params.update(zip(_names(f"c_{name}", bucket), got + [None] * pad))
        done += conn.execute(stmt, params).rowcount
        start = end
    return done


def _picks(name: str, field: bool) -> bool:
    """Whether column ``name``'s own values are picked by ``ELT(FIELD(...))`` (else a CASE)."""
    return field and isinstance(m.c[name].type, String)


def _compares(differ: Sequence[str], field: bool) -> bool:
    """Whether some column of ``differ`` is set by a CASE, which compares the id with bound ones."""
    return not all(_picks(name, field) for name in differ)


@functools.lru_cache(maxsize=256)
def _names(prefix: str, bucket: int) -> tuple[str, ...]:
    """The parameter names ``prefix_0`` .. ``prefix_{bucket-1}``, made once per size class."""
    return tuple(f"{prefix}_{k}" for k in range(bucket))


class _Listed(ColumnElement[Any]):
    """An expanding parameter written as a bare list (``1, 2, 3``), where SQL wants one
    argument per value (``FIELD(id, 1, 2, 3)``), not the parenthesised list of an IN."""

    inherit_cache = True
    _traverse_internals = [("param", InternalTraversal.dp_clauseelement)]

    def __init__(self, param: Any) -> None:
        self.param = param
        self.type = param.type


@compiles(_Listed)
def _compile_listed(element: _Listed, compiler: Any, **kw: Any) -> str:
    text = compiler.process(element.param, **kw)
    # SQLAlchemy writes an expanding parameter as "(<placeholder>)" and fills the placeholder at
    # execution with the values joined by commas.
    return text[1:-1] if text.startswith("(") and text.endswith(")") else text


@functools.lru_cache(maxsize=64)
def _bound_case_update(source: tuple[Any, ...], target: Any, names: tuple[str, ...], differ: tuple[str, ...],
                       attempt_delta: int, bump_version: bool, trace: bool, token: bool, bucket: int,
                       no_workflow: bool = False, in_workflow: bool = False, field: bool = False) -> Any:
    stmt = _bound_update(source, target, tuple(name for name in names if name not in differ), attempt_delta,
                         bump_version, trace, token, no_workflow, in_workflow)
    whens = [bindparam(key, type_=m.c.id.type) for key in _names("w", bucket)] if _compares(differ, field) else []
    cases: dict[str, Any] = {}
    for name in differ:
        column = m.c[name]
        values = [bindparam(key, type_=column.type) for key in _names(f"c_{name}", bucket)]
        if _picks(name, field):
            # FIELD finds the row's id in the list the WHERE's IN reads, written into the
            # statement once at execution (the ids are integers; as ``ids`` explains, binding
            # each one costs the broker more), so every row the WHERE picks is there and
            # FIELD never answers 0; ELT takes the value at that place.
            cases[name] = func.elt(func.field(m.c.id, _Listed(IDS)), *values, type_=column.type)
        else:
            cases[name] = case(*[(m.c.id == when, value) for when, value in zip(whens, values)], else_=column)
    return stmt.values(cases) if cases else stmt
