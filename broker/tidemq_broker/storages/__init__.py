"""The implementations of the storage interface, and the factory that opens one.

``open_storage(url)`` builds a :class:`~tidemq_broker.storage.Storage` on MySQL/MariaDB or SQLite:
one component per role, each around the same :class:`~.database.SqlDatabase`. What differs
between MySQL and SQLite is the database's dialect object, not a subclass. ``memory`` holds the
memory storage (``open_memory_storage``): the same roles on dicts in one process, for unit tests.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from tidemq.config import masked_url

from ..errors import ConfigurationError, quote
from .database import SqlDatabase
from .dialect import SqlDialect
from ..storage import Storage
from .acks import Acks
from .admin_sql import SqlConsole
from .counts import StatusCounts
from .dependencies import SqlDependencies
from .leases import Leases
from .migrations import Migrations
from .principals import SqlPrincipals
from .probes import PullProbes
from .reads import Reads
from .schedules import Schedules
from .sessions import SqlSessions
from .topics import Topics
from .writes import Writes

__all__ = ["open_database", "open_storage", "sql_storage"]


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


def open_storage(url: str, **options: Any) -> Storage:
    """The storage at SQLAlchemy ``url``: MySQL/MariaDB or SQLite (see :func:`open_database`)."""
    return sql_storage(open_database(url, **options))


def sql_storage(db: SqlDatabase) -> Storage:
    """The storage over ``db``: every role's component shares its engine and transactions, and
    closing the storage closes ``db``."""
    return Storage(schema=Migrations(db), messages=Writes(db), dependencies=SqlDependencies(db), leases=Leases(db),
                   acks=Acks(db),
                   probes=PullProbes(db), topics=Topics(db), reads=Reads(db), counts=StatusCounts(db),
                   schedules=Schedules(db), principals=SqlPrincipals(db), sessions=SqlSessions(db),
                   console=SqlConsole(db), closer=db.close)
