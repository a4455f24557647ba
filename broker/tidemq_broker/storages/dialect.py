"""What differs between SQL databases: the statements each dialect writes its own way.

One class per dialect implements this (``mysql.MySqlDialect``, ``sqlite.SqliteDialect``); the
storage's components call these hooks and share everything else.
"""

from __future__ import annotations

import abc
from datetime import datetime
from typing import Any, Optional, Protocol, Sequence

from sqlalchemy import Connection, Engine, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.expression import Executable

from ..schema import topic as t

__all__ = ["CallerTransaction", "SqlDialect"]


class CallerTransaction(Protocol):
    """The caller's open transaction (``tidemq.enqueue``'s): run one statement."""

    #: Which statements to write.
    dialect: "SqlDialect"

    def execute(self, stmt: Executable) -> tuple[Optional[int], list[tuple[Any, ...]]]:
        """Run ``stmt``; return the connection's last insert id and the rows it read."""


class SqlDialect(abc.ABC):
    """The dialect hooks of the SQL storage."""

    #: True when the database takes one writing transaction at a time (SQLite).
    single_writer: bool = False
    #: The interchangeable servers a URL names (``failover.Addresses``), or None for one.
    addresses: Optional[Any] = None

    @abc.abstractmethod
    def create_engine(self, url: str, **options: Any) -> Engine:
        """The engine for ``url``, configured as this dialect needs (isolation, pragmas, pool)."""

    def create_produce_engine(self, url: str) -> Optional[Engine]:
        """A separate engine for the produce path, or None to share the main one."""
        return None

    def insert_plain_answering(self, conn: Connection, values: list[dict[str, Any]],
                               requests: list[tuple[str, int, int]], now: datetime,
                               commit: bool = False) -> Optional[list[int]]:
        """Insert rows without unique keys and, in the same round trip, the produce-request rows
        ``(request_id, first row, row count)`` with their ids; return the ids, or None when this
        dialect cannot (the caller then inserts both its own way). ``commit``: ``conn`` is in
        autocommit mode, and the same round trip opens the transaction and commits it; a
        statement that fails leaves it open, for the caller to drop with the connection."""
        return None

    def insert_plain_alone(self, conn: Connection, values: list[dict[str, Any]]) -> Optional[list[int]]:
        """``insert_plain`` in a single statement, which ``conn`` (autocommit) commits by itself;
        None, with nothing written, when these rows take more than one statement."""
        return None

    def commits_alone(self, answering: bool) -> bool:
        """False when ``insert_plain_alone`` (``answering``: ``insert_plain_answering`` with
        ``commit``) is known to decline whatever the rows: the caller then neither builds their
        values for it nor takes a connection. True may still meet a refusal (too many rows)."""
        return False

    def usable(self, conn: Connection) -> bool:
        """False when ``conn`` is known, without a round trip, to be closed by the server."""
        return True

    def is_transient(self, exc: DBAPIError) -> bool:
        """True for deadlocks and lock-wait timeouts: the transaction may simply be retried."""
        return False

    def is_crowded(self, exc: DBAPIError) -> bool:
        """True when a new connection was refused because the server (or the user) has as many
        as it allows: one already open may come free soon."""
        return False

    @abc.abstractmethod
    def insert_plain(self, conn: Connection, values: list[dict[str, Any]]) -> list[int]:
        """Insert message rows without unique keys; return their ids in order."""

    @abc.abstractmethod
    def insert_ignoring_duplicates(self, conn: Connection, values: list[dict[str, Any]]) -> None:
        """Insert message rows with unique keys, skipping (topic, unique_key) already stored."""

    @abc.abstractmethod
    def insert_topics_ignoring_duplicates(self, conn: Connection, values: list[dict[str, Any]]) -> None:
        """Insert topic rows, skipping names already present."""

    @abc.abstractmethod
    def insert_failure_keys(self, conn: Connection, values: list[dict[str, Any]]) -> None:
        """Insert sign-in failure rows whose key is not stored yet, and hold a write lock on the
        row of every key in ``values`` (new or not) until the transaction ends."""

    @abc.abstractmethod
    def enqueue_keyed(self, tx: CallerTransaction, values: dict[str, Any]) -> Optional[int]:
        """Insert the message row ``values`` (it has a unique key) in the caller's transaction
        ``tx``, or nothing when its (topic, unique_key) is stored; return the id of the row
        stored under that key."""

    def force_index(self, stmt: Any, index: str) -> Any:
        """``stmt`` (a SELECT of message rows) made to read ``index``, where the dialect needs
        telling."""
        return stmt

    def lock_index_hint(self, stmt: Any) -> Any:
        """``stmt`` (a SELECT of message rows) made to read the lock index."""
        return self.force_index(stmt, "idx_message_lock")

    def alter_table(self, conn: Connection, table: str, columns: Sequence[str] = (), drop_index: Optional[str] = None,
                    add_index: Optional[str] = None, unique: bool = False) -> None:
        """A schema step's change of ``table``: add ``columns`` (each ``name TYPE ...``), drop the
        index ``drop_index``, add the index ``add_index`` (``name (column, ...)``; ``unique``: a
        unique one), in that order."""
        for column in columns:
            conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {column}")
        if drop_index:
            conn.exec_driver_sql(f"DROP INDEX {drop_index}")
        if add_index:
            kind = "UNIQUE INDEX" if unique else "INDEX"
            conn.exec_driver_sql(f"CREATE {kind} {add_index.replace(' (', f' ON {table} (', 1)}")

    def no_wait(self, conn: Connection) -> bool:
        """Whether ``conn``'s server fails a statement with the execution option
        ``no_wait.NO_WAIT`` at once instead of letting it wait for a row lock (MariaDB only)."""
        return bool(getattr(conn.dialect, "is_mariadb", False))

    def id_step(self, conn: Connection) -> int:
        """How far apart the ids one server hands out are (1 here; see the MySQL dialect)."""
        return 1

    def shard_clause(self, id_column: Any, total: int, rank: int) -> Any:
        """The condition ``id_column`` is in QUEUE shard ``rank`` of ``total``: ``MOD(id, total) = rank``
        here; see the MySQL dialect for servers whose ids step by more than 1."""
        return id_column % total == rank

    def lock_topic_row(self, conn: Connection, topic: str) -> bool:
        """Serialise serial leases of one topic (a row lock on its topic row); False when the
        topic has no row to lock.

        Without it two serial leases could each see nothing RUNNING, and the second, reading
        after the first committed, would take the next head while the first still runs."""
        return conn.execute(select(t.c.name).where(t.c.name == topic).with_for_update()).first() is not None
