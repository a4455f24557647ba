"""The text of a multi-row INSERT into the message table, its values escaped as MySQL reads them.

Built by hand rather than by the driver: escaping every value of every row through PyMySQL was
the largest part of a broker's CPU time under produce load (docs/PERFORMANCE.md, "Hot paths").
"""

from __future__ import annotations

from typing import Any

import pymysql
from pymysql.constants import SERVER_STATUS

from tidemq.tables import MESSAGE as M

from .rows import INSERT_COLUMNS

__all__ = ["insert_sql", "chunks_by_size", "literal_rows"]

_STATEMENT_BYTES = 4 * 1024 * 1024  # keep each INSERT well under max_allowed_packet
_COLS = ", ".join(INSERT_COLUMNS)
_DATA = INSERT_COLUMNS.index("data")
_SHARED = [col for col in INSERT_COLUMNS if col != "data"]  # the columns rows of a group often share
#: What a backslash-escaping server needs escaped in a string literal; the backslash goes first.
_ESCAPES = [("\\", "\\\\"), ("'", "\\'"), ("\0", "\\0"), ("\n", "\\n"), ("\r", "\\r"), ("\032", "\\Z")]


def insert_sql(dbapi: pymysql.connections.Connection, rows: list[dict[str, Any]], suffix: str = "") -> str:
    """One multi-row INSERT of ``rows`` (a group commit's chunk), ``suffix`` appended; the
    first row's data is its one parameter (``literal_rows``)."""
    return f"INSERT INTO {M.name} ({_COLS}) VALUES " + literal_rows(dbapi, rows) + suffix


def chunks_by_size(values: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """``values`` (rows to insert) in chunks of one INSERT each, each well under the server's
    packet limit."""
    chunks: list[list[dict[str, Any]]] = [[]]
    size = 0
    for row in values:
        row_size = len(row["data"]) * 2 + len(row["trace"]) + 512  # escaping may double the data
        if chunks[-1] and size + row_size > _STATEMENT_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(row)
        size += row_size
    return chunks


def literal_rows(dbapi: pymysql.connections.Connection, rows: list[dict[str, Any]]) -> str:
    """The VALUES list of a multi-row INSERT, escaped as the connection ``dbapi`` would.

    Rows of one group commit share most values (topic, times, trace line, NULLs): each distinct
    set of them is escaped and joined once per statement, as the text around a row's ``data``,
    instead of once per row, which was the largest part of a broker's CPU time under produce
    load. Only ``data`` differs from row to row. The first row's data stays a ``%s`` parameter,
    so the driver always %-formats the statement and every literal ``%`` is doubled.
    """
    escape = dbapi.escape
    # PyMySQL's own escaping (str.translate) cost more than the rest of a row together.
    quote = escape if dbapi.server_status & SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES else _quote
    literals: dict[tuple[type, Any], str] = {}
    frames: dict[tuple[tuple[Any, ...], tuple[type, ...]], tuple[str, str]] = {}
    out = []
    for index, row in enumerate(rows):
        shared = tuple([row[col] for col in _SHARED])
        key = (shared, tuple(map(type, shared)))  # True and 1 are equal keys, not equal literals
        frame = frames.get(key)
        if frame is None:
            parts = []
            for value in shared:
                literal = literals.get((type(value), value))
                if literal is None:
                    literal = literals[(type(value), value)] = escape(value).replace("%", "%%")
                parts.append(literal)
            frame = frames[key] = ("(" + ", ".join(parts[:_DATA] + [""]), ", ".join([""] + parts[_DATA:]) + ")")
        data = row["data"]
        if index:
            data = (quote(data) if type(data) is str else escape(data)).replace("%", "%%")
        else:
            data = "%s"
        out.append(frame[0] + data + frame[1])
    return ", ".join(out)


def _quote(value: str) -> str:
    """``value`` as a MySQL string literal (backslash escapes on), what PyMySQL's ``escape``
    gives but for ``"``, which needs no escape between single quotes. Each ``replace`` runs
    only when its character is there: JSON text rarely holds any of them."""
    for char, escaped in _ESCAPES:
        if char in value:
            value = value.replace(char, escaped)
    return "'" + value + "'"
