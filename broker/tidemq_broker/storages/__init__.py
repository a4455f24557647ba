"""The SQL implementations of the storage interface, and the factory that opens one."""

from __future__ import annotations

from typing import Any

from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from tidemq.config import masked_url

from ..errors import ConfigurationError, quote
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
        f"(got a URL starting {quote(url.split(':', 1)[0])})")


def open_database(url: str, **options: Any) -> SqlDatabase:
    """The engine and transaction object for SQLAlchemy ``url`` (MySQL/MariaDB or SQLite).

    A URL that cannot be used raises ConfigurationError naming the expected form; the password
    is never part of the message."""
    dialect = _dialect_for(url)
    try:
        return SqlDatabase(dialect.create_engine(url, **options), dialect, dialect.create_produce_engine(url))
    except (ArgumentError, NoSuchModuleError, ValueError) as exc:
        raise ConfigurationError(
            f"TIDEMQ_DB_URL {masked_url(url)} cannot be used ({exc.__class__.__name__}: "
            f"{masked_url(str(exc).splitlines()[0])}): use mysql+pymysql://user:pw@host:3306/db, with several "
            "addresses as host1:3306,host2:3306, or sqlite:///relative/file, sqlite:////absolute/file") from None


def open_storage(url: str, **options: Any) -> SqlStorage:
    """The message store at SQLAlchemy ``url``: MySQL/MariaDB or SQLite."""
    return SqlStorage(open_database(url, **options))
