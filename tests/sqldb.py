"""Tests of the SQL storage that reach its database directly (age rows, stand in for the pipeline,
listen to statements, read raw tables): the storage and its database object, opened together."""

from __future__ import annotations

from typing import Any

from tidemq_broker.storage import Storage
from tidemq_broker.storages import open_database, sql_storage
from tidemq_broker.storages.database import SqlDatabase

__all__ = ["open_sql"]


def open_sql(url: str, **options: Any) -> tuple[Storage, SqlDatabase]:
    """The SQL storage at ``url`` and the database object it works through (closed with it)."""
    db = open_database(url, **options)
    return sql_storage(db), db
