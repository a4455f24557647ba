"""The SQL implementations of the storage interface, and the factory that opens one."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigurationError
from .database import SqlDatabase
from .dialect import SqlDialect
from .sql import SqlStorage

__all__ = ["open_database", "open_storage"]


def _dialect_for(url: str) -> SqlDialect:
    if url.startswith(("mysql", "mariadb")):
        from .mysql import MySqlDialect

        return MySqlDialect()
    if url.startswith("sqlite"):
        from .sqlite import SqliteDialect

        return SqliteDialect()
    raise ConfigurationError(
        "TIDEMQ_DB_URL is not supported: use mysql+pymysql://user:pw@host:3306/db or sqlite:///file "
        f"(got a URL starting {url.split(':', 1)[0]!r})")


def open_database(url: str, **options: Any) -> SqlDatabase:
    """The engine and transaction object for SQLAlchemy ``url`` (MySQL/MariaDB or SQLite)."""
    dialect = _dialect_for(url)
    return SqlDatabase(dialect.create_engine(url, **options), dialect, dialect.create_produce_engine(url))


def open_storage(url: str, **options: Any) -> SqlStorage:
    """The message store at SQLAlchemy ``url``: MySQL/MariaDB or SQLite."""
    return SqlStorage(open_database(url, **options))
