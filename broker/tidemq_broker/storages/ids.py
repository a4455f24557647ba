"""``id IN (...)`` for the hot paths, with the ids written into the statement as literals.

The ids are integers (read from rows, or checked by the broker's intake). Binding hundreds of
parameters one by one (each escaped by the driver) was a fifth of a broker's CPU per pulled
batch. The statement stays one cached form: the ids are rendered only at execution. Writing
them into the SQL text itself made every statement new to SQLAlchemy's compiled cache, and the
compiled forms it dropped were garbage cycles: a broker serving small pulls spent 100 ms pauses
in the cyclic garbage collector every few seconds.
"""

from __future__ import annotations

from typing import Iterable, Union

from sqlalchemy import ColumnElement, bindparam

from ..schema import message as m

__all__ = ["IDS", "ids_in", "bound_ids_in", "concat_ids"]

#: The ids a statement built once is given at execution (``{"ids": [...]}``), rendered as
#: literals: the parameter of :func:`bound_ids_in`, which other clauses of the same statement
#: may read too.
IDS = bindparam("ids", expanding=True, literal_execute=True)


def ids_in(ids: Iterable[int]) -> ColumnElement[bool]:
    """The condition ``tidemq_message.id IN (ids)``."""
    return m.c.id.in_(bindparam("ids", [int(i) for i in ids], expanding=True, literal_execute=True, unique=True))


def bound_ids_in() -> ColumnElement[bool]:
    """``tidemq_message.id IN (:ids)`` for a statement built once: the ids are given at execution
    (``{"ids": [...]}``), rendered the same way as :func:`ids_in`'s."""
    return m.c.id.in_(IDS)


def concat_ids(text: Union[str, bytes]) -> list[int]:
    """The ids of a ``GROUP_CONCAT`` (MySQL and SQLite: comma separated), ascending."""
    if isinstance(text, bytes):
        text = text.decode()
    return sorted(int(id) for id in text.split(",") if id)
