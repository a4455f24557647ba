"""MySQL / MariaDB: the production dialect.

Run the server with READ COMMITTED (REPEATABLE READ makes concurrent batch locks deadlock and
blocks producers behind gap locks); the engine asks for it per connection anyway.
"""

from __future__ import annotations

import logging
import select
from datetime import datetime
from typing import Any, Optional, Sequence

import pymysql
from pymysql.constants import CLIENT
from sqlalchemy import Connection, Engine, create_engine, event, func, literal_column, make_url
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.exc import DBAPIError, IntegrityError

from tidemq.tables import MESSAGE as M
from tidemq.tables import PRODUCE_REQUEST

from ..schema import login_failure, message, topic
from .dialect import CallerTransaction, SqlDialect
from .failover import Addresses, mark_not_serving_as_disconnect, split_addresses
from .mysql_values import chunks_by_size, insert_sql


__all__ = ["MySqlDialect"]

log = logging.getLogger(__name__)
_TRANSIENT = {1205, 1213}  # lock wait timeout, deadlock: retry the transaction
_CROWDED = {1040, 1203}  # too many connections, of the server or of the user
# The server dropped the connection: killed (1927), gone away (2006), lost mid-query (2013), ...
_LOST_CONNECTION = {1927, 2006, 2013, 2014, 2045, 2055, 4031}
# A QUEUE shard is MOD(id DIV step, total) = rank, with step the server's id increment: with
# auto_increment_increment = n (a Galera cluster of n nodes sets it), every id one node hands out
# is alike modulo n, so MOD(id, n) would give each node's messages to one consumer; dividing by
# the step first spreads them again. The server reads its own setting in the statement itself:
# Galera changes it when nodes join or leave, and every broker must use the same rule at the same
# time (a rule cached per broker would leave some ids in no shard, or in two).
_ID_STEP = "@@GLOBAL.auto_increment_increment"
#: Seconds a transaction of tidemq's may sit idle at the server before MariaDB ends its
#: connection and rolls it back. No unit of work waits between its statements, so only one
#: whose broker can no longer reach the server idles: cut off by a network partition, its rows
#: would stay locked until ``wait_timeout`` (8 hours by default). MySQL has no such setting.
IDLE_TRANSACTION_TIMEOUT = 30


class MySqlDialect(SqlDialect):
    """MySQL 8 / MariaDB 10.5+ through PyMySQL."""

    def __init__(self) -> None:
        self._consecutive_ids: bool | None = None
        self._id_step = 1
        self._returning = False  # MariaDB 10.5+: INSERT ... RETURNING gives every row's id
        self.addresses: Optional[Addresses] = None

    def create_engine(self, url: str, pool_size: int = 16, multi_statements: bool = False,
                      **options: Any) -> Engine:
        # No pre-ping: it would add a round trip to every produce (an INSERT and a COMMIT).
        # SqlDatabase.tx runs a unit of work again on a fresh connection when its connection
        # turns out dead before the COMMIT was sent. The rollback on check-in stays: without it
        # the consume rate fell by about a tenth here (docs/PERFORMANCE.md).
        # FOUND_ROWS is SQLAlchemy's own flag (rowcount = rows matched); set here, the
        # connect_args flag replaces the one it would add.
        flags = CLIENT.FOUND_ROWS | (CLIENT.MULTI_STATEMENTS if multi_statements else 0)
        # A URL may name several addresses (a Galera cluster): see storages/failover.py.
        # The produce engine and the main engine share one Addresses, so they use the same node.
        url, addresses = split_addresses(url)
        if addresses and self.addresses is None:
            self.addresses = Addresses(addresses)
        engine = create_engine(
            url,
            pool_size=pool_size,
            max_overflow=pool_size * 2,
            pool_pre_ping=False,
            # Last in, first out: a unit of work gets the connection used most recently, the one
            # least likely to have been dropped meanwhile (connections killed by an operator or a
            # proxy, wait_timeout). First in, first out handed out the oldest idle connection:
            # under connections killed ten times a second, almost always a dead one.
            pool_use_lifo=True,
            pool_recycle=1800,
            pool_timeout=5,
            isolation_level="READ COMMITTED",
            # Fail fast while the server is down instead of hanging past the caller's deadline:
            # PyMySQL reads the server's greeting under read_timeout, so a connection accepted and
            # never answered (a proxy whose server is gone) fails in 3 s too; statements get 30 s
            # once it is open (``_statement_timeouts``).
            # The insert watch's GROUP_CONCAT of 500 ids: MySQL's default 1,024 bytes would cut it.
            # /*M! … */ is run by MariaDB alone (10.3 and later); MySQL reads it as a comment.
            connect_args={"connect_timeout": 3, "read_timeout": 3, "write_timeout": 30, "charset": "utf8mb4",
                          "client_flag": flags,
                          "init_command": "SET SESSION group_concat_max_len = 1048576 /*M!100300 , SESSION "
                                          f"idle_transaction_timeout = {IDLE_TRANSACTION_TIMEOUT} */",
                          **_tls_args(url)},
            **options,
        )
        if addresses and self.addresses is not None:
            self.addresses.attach(engine)
        mark_not_serving_as_disconnect(engine)
        event.listen(engine, "connect", _statement_timeouts)
        _quiet_lost_connection_resets()
        return engine

    def create_produce_engine(self, url: str) -> Optional[Engine]:
        # Multi-statement connections, for produce only: the console and everything else never
        # get a connection on which one string may carry two statements.
        # No ROLLBACK on check-in: it was a third round trip per group commit (INSERT, COMMIT,
        # ROLLBACK), and these connections serve SqlDatabase.tx(produce=True) alone, whose
        # conn.begin() always ends with a COMMIT or a ROLLBACK before the connection goes back.
        engine = self.create_engine(url, pool_size=4, multi_statements=True, pool_reset_on_return=None)
        event.listen(engine, "connect", _wait_for_cluster_writes)
        return engine

    def insert_plain_answering(self, conn: Connection, values: list[dict[str, Any]],
                               requests: list[tuple[str, int, int]], now: datetime,
                               commit: bool = False) -> Optional[list[int]]:
        if self._consecutive_ids is None:
            self._check_autoincrement(conn)
        returning = not self._consecutive_ids  # lock mode 2: the ids come back with RETURNING
        chunks = chunks_by_size(values)
        dbapi = conn.connection.dbapi_connection
        # Under lock mode 2 a gap in the ids is corrected before the COMMIT (``_correct_answers``),
        # so the COMMIT cannot travel in the same string.
        if (returning and (commit or not self._returning)) or len(chunks) != 1 \
                or not dbapi.client_flag & CLIENT.MULTI_STATEMENTS:
            return None
        escape = dbapi.escape
        step = self._id_step
        # The ids are LAST_INSERT_ID() + k * step, so the request rows can name them in the same
        # string: "r<first>:<step>:<count>" (tidemq_broker.storages.writes reads it back). Under
        # lock mode 2 that is only what a multi-row INSERT does in practice, not a promise, so
        # the request rows come back too and are checked against the ids RETURNING gave.
        answers = ", ".join(
            f"({escape(request_id)}, CONCAT('r', LAST_INSERT_ID() + {start * step}, ':{step}:{count}'), "
            f"{escape(now)})".replace("%", "%%") for request_id, start, count in requests)
        req = PRODUCE_REQUEST
        sql = (("START TRANSACTION; " if commit else "") +
               insert_sql(dbapi, values, f" RETURNING {M.id}" if returning else "") +
               f"; INSERT INTO {req.name} ({req.request_id}, {req.ids}, {req.created}) "
               f"VALUES {answers}" + (f" RETURNING {req.request_id}, {req.ids}" if returning else "") +
               ("; COMMIT" if commit else ""))
        cursor = dbapi.cursor()
        try:
            cursor.execute(sql, (values[0]["data"],))
            if commit:
                cursor.nextset()  # past START TRANSACTION, to the rows' INSERT
            ids = self._inserted_ids(cursor, len(values), returning)  # of the rows' INSERT
            try:
                cursor.nextset()  # the request rows: a request id stored already fails here
            except pymysql.err.IntegrityError as exc:
                raise IntegrityError(f"INSERT INTO {req.name} ...", None, exc) from exc
            if returning:
                self._correct_answers(cursor, dict(cursor.fetchall()), ids, requests)
            if commit:
                cursor.nextset()  # the COMMIT's own answer: a Galera conflict fails here
        finally:
            cursor.close()
        return ids

    def _correct_answers(self, cursor: Any, stored: dict[str, str], ids: list[int],
                         requests: list[tuple[str, int, int]]) -> None:
        """Store the id list of every request whose "r<first>:<step>:<count>" (written from
        LAST_INSERT_ID()) does not name the ids its rows got: under lock mode 2 a group's ids may
        leave gaps, and a retried request must get back exactly the ids of its first answer.
        Runs in the group's transaction, before its COMMIT."""
        step = self._id_step
        wrong = []
        for request_id, start, count in requests:
            own = ids[start : start + count]
            if not own:
                continue  # an empty call: "r<any>:<step>:0" names no ids, which is right
            if stored[request_id] != f"r{own[0]}:{step}:{count}" or \
                    own != [own[0] + k * step for k in range(count)]:
                wrong.append((",".join(str(i) for i in own), request_id))
        if wrong:
            log.debug("%d produce request(s) got non-consecutive ids; storing their id lists", len(wrong))
            cursor.executemany(f"UPDATE {PRODUCE_REQUEST.name} SET {PRODUCE_REQUEST.ids} = %s "
                               f"WHERE {PRODUCE_REQUEST.request_id} = %s", wrong)

    def shard_clause(self, id_column: Any, total: int, rank: int) -> Any:
        return func.mod(id_column.op("DIV")(literal_column(_ID_STEP)), total) == rank

    def is_transient(self, exc: DBAPIError) -> bool:
        args = getattr(exc.orig, "args", ())
        return bool(args) and args[0] in _TRANSIENT

    def is_crowded(self, exc: DBAPIError) -> bool:
        args = getattr(exc.orig, "args", ())
        return bool(args) and args[0] in _CROWDED

    def id_step(self, conn: Connection) -> int:
        # Read each time: Galera changes the increment when nodes join or leave.
        return int(conn.exec_driver_sql(f"SELECT {_ID_STEP}").scalar() or 1)

    def _check_autoincrement(self, conn: Connection) -> None:
        """Multi-row INSERT ids are first, first+step, ... only under lock modes 0 and 1. Under
        mode 2 (MySQL 8's default, Galera's requirement) MariaDB 10.5+ still reports each row's
        id with RETURNING; MySQL, which has no RETURNING, gets one INSERT per row."""
        mode, step, version = conn.exec_driver_sql(
            "SELECT @@innodb_autoinc_lock_mode, @@auto_increment_increment, VERSION()").one()
        self._consecutive_ids = int(mode) in (0, 1)
        self._id_step = int(step)
        self._returning = _mariadb_with_returning(str(version))
        if _mariadb_version(str(version)) < (10, 8) and "mariadb" in str(version).lower():
            # Older MariaDB parses DESC in an index and ignores it: idx_message_lock's priority
            # DESC then cannot serve the lock's ORDER BY, and every lock sorts its due rows.
            log.warning("MariaDB %s ignores descending indexes: the pull lock sorts instead of reading "
                        "idx_message_lock in order (slower on large backlogs). Use MariaDB 10.8+ or MySQL 8.",
                        version)
        if not self._consecutive_ids and not self._returning:
            log.warning(
                "innodb_autoinc_lock_mode=%s on a server without INSERT ... RETURNING: each message is "
                "inserted by its own statement (slower). Set innodb_autoinc_lock_mode=1.", mode)

    def insert_plain(self, conn: Connection, values: list[dict[str, Any]]) -> list[int]:
        if self._consecutive_ids is None:
            self._check_autoincrement(conn)
        returning = not self._consecutive_ids and self._returning
        # Under lock mode 2 without RETURNING (MySQL) only a one-row INSERT tells its row's id.
        chunks = chunks_by_size(values) if self._consecutive_ids or returning else [[row] for row in values]
        ids: list[int] = []
        for chunk in chunks:
            result = _insert_rows(conn, chunk, f" RETURNING {M.id}" if returning else "")
            ids.extend(self._inserted_ids(result, len(chunk), returning))
        return ids

    def insert_plain_alone(self, conn: Connection, values: list[dict[str, Any]]) -> Optional[list[int]]:
        if self._consecutive_ids is None:
            self._check_autoincrement(conn)
        if not (self._consecutive_ids or self._returning) or len(chunks_by_size(values)) > 1:
            return None
        # On the driver's cursor, as insert_plain_answering's string (commit_alone judges the
        # driver's errors): SQLAlchemy's execution was about 25 µs of a lone direct produce().
        returning = not self._consecutive_ids
        cursor = conn.connection.dbapi_connection.cursor()
        try:
            cursor.execute(insert_sql(cursor.connection, values, f" RETURNING {M.id}" if returning else ""),
                           (values[0]["data"],))
            return self._inserted_ids(cursor, len(values), returning)
        finally:
            cursor.close()

    def _inserted_ids(self, result: Any, count: int, returning: bool) -> list[int]:
        """The ids of the ``count`` rows one INSERT wrote (``result``: SQLAlchemy's or the driver's
        cursor at that statement): read back with RETURNING, in the order of its VALUES list, or
        LAST_INSERT_ID() (the first row's) and the server's increment."""
        if returning:
            return [int(row[0]) for row in result.fetchall()]
        first = int(result.lastrowid)
        return [first + k * self._id_step for k in range(count)]

    def commits_alone(self, answering: bool) -> bool:
        if self._consecutive_ids is None:
            return True  # not known before the first INSERT's check: its call will tell
        # Lock mode 2 corrects the answers' ids before the COMMIT, which cannot share the string.
        return bool(self._consecutive_ids or (self._returning and not answering))

    def usable(self, conn: Connection) -> bool:
        # A socket the server closed reads as ready (its end, or the error packet sent before
        # it); an open connection between statements has nothing to read. poll, not select:
        # a broker's descriptors may pass 1024.
        sock = getattr(conn.connection.dbapi_connection, "_sock", None)
        if sock is None:
            return False
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return not poller.poll(0)

    def insert_ignoring_duplicates(self, conn: Connection, values: list[dict[str, Any]]) -> None:
        for chunk in chunks_by_size(values):
            _insert_rows(conn, chunk, f" ON DUPLICATE KEY UPDATE {M.id} = {M.id}")

    def insert_topics_ignoring_duplicates(self, conn: Connection, values: list[dict[str, Any]]) -> None:
        stmt = mysql_insert(topic).values(values)
        conn.execute(stmt.on_duplicate_key_update(name=stmt.inserted.name))

    def insert_failure_keys(self, conn: Connection, values: list[dict[str, Any]]) -> None:
        # ON DUPLICATE KEY UPDATE takes an exclusive lock on a row that exists (a plain INSERT
        # would take a shared one, and two attempts upgrading it would deadlock).
        stmt = mysql_insert(login_failure).values(values)
        conn.execute(stmt.on_duplicate_key_update(key_hash=stmt.inserted.key_hash))

    def enqueue_keyed(self, tx: CallerTransaction, values: dict[str, Any]) -> Optional[int]:
        # LAST_INSERT_ID(id) makes a duplicate report the stored row's id as the insert id, in
        # the same round trip; InnoDB's exclusive lock on the key makes a second transaction
        # enqueuing it wait for the first to end.
        stmt = mysql_insert(message).values(values)
        new_id, _ = tx.execute(stmt.on_duplicate_key_update(id=func.last_insert_id(message.c.id)))
        return new_id

    def force_index(self, stmt: Any, index: str) -> Any:
        # With the console's (topic, status, lease_expire) index present, the optimizer may pick
        # an index merge plus a filesort of every NEW row of the topic, which made each lock
        # cost hundreds of ms on 200k due messages. Naming every priority makes one bounded
        # range per priority (each ends at the first message not yet due), read in index order:
        # no row is sorted. The console's pages walk (topic, status, lease_expire) the same way.
        for name in ("mysql", "mariadb"):
            stmt = stmt.with_hint(message, f"FORCE INDEX ({index})", dialect_name=name)
        return stmt

    def alter_table(self, conn: Connection, table: str, columns: Sequence[str] = (), drop_index: Optional[str] = None,
                    add_index: Optional[str] = None, unique: bool = False) -> None:
        # One ALTER TABLE: MySQL rebuilds the table once for all of its changes.
        kind = "UNIQUE INDEX" if unique else "INDEX"
        changes = [f"ADD COLUMN {column}" for column in columns] + \
            ([f"DROP INDEX {drop_index}"] if drop_index else []) + ([f"ADD {kind} {add_index}"] if add_index else [])
        if changes:
            conn.exec_driver_sql(f"ALTER TABLE {table} " + ", ".join(changes))


def _tls_args(url: str) -> dict[str, Any]:
    """TLS as the URL asks for it (``?ssl_ca=...``: required, the server verified), else none.

    PyMySQL 1.2 turned on opportunistic TLS by default: it builds a TLS context, loading the
    system's whole CA store, for every new connection (about 40 ms of CPU here, some 100 queries'
    worth), and verifies nothing unless a CA is named. Every connection replaced after a KILL,
    a ``wait_timeout`` or a restart paid it: with connections killed ten times a second the
    brokers spent their CPU on it. Named in the URL, TLS stays on and is checked."""
    if any(key.startswith("ssl") for key in make_url(url).query):
        return {}
    return {"ssl_disabled": True}


class _LostConnectionResets(logging.Filter):
    """Drops SQLAlchemy's "Exception during reset or similar" (an ERROR and a traceback) when the
    rollback of a connection going back to the pool failed because the server had dropped it (a
    restart, a KILL, wait_timeout). The pool discards that connection anyway and the next unit of
    work gets a fresh one; an outage is logged once by ``SqlDatabase``. Under connections killed
    ten times a second this was one traceback per kill. Any other reset failure still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.exc_info or record.msg != "Exception during reset or similar":
            return True
        error = record.exc_info[1]
        lost = (isinstance(error, pymysql.err.OperationalError) and bool(error.args)
                and error.args[0] in _LOST_CONNECTION)
        closed = isinstance(error, pymysql.err.InterfaceError) and error.args == (0, "")  # lost before: closed
        return not (lost or closed)


_RESETS_FILTER = _LostConnectionResets()


def _quiet_lost_connection_resets() -> None:
    pool_log = logging.getLogger("sqlalchemy.pool.impl.QueuePool")  # the pool's class logger
    if _RESETS_FILTER not in pool_log.filters:
        pool_log.addFilter(_RESETS_FILTER)


def _wait_for_cluster_writes(dbapi_connection: Any, record: Any) -> None:
    """On a Galera node, make a produce's reads and INSERTs wait until the node has applied every
    transaction the cluster committed before them (``wsrep_sync_wait`` bits 1 and 4).

    A node assigns auto-increment ids from its own counter, which moves past another node's ids
    only once their writesets are applied here. Without the wait, a client whose produce through
    a broker on node A was acknowledged, and whose next produce goes through a broker on node B,
    could get a smaller id for the later message: a SERIAL_QUEUE would run them out of order.
    The wait costs one group round trip per group commit, not per message.

    The reads: a submission with dependencies (``SqlDependencies.insert_steps``, which runs on
    these connections) reads the messages it waits on, and one committed through another node a
    moment before must be found there, not refused as unknown; a produce's look for its request
    id must likewise find the first attempt's answer, committed through another node.
    """
    with dbapi_connection.cursor() as cur:
        cur.execute("SHOW VARIABLES LIKE 'wsrep_on'")
        row = cur.fetchone()
        if row and row[1] == "ON":
            cur.execute("SET SESSION wsrep_sync_wait = @@wsrep_sync_wait | 5")


def _mariadb_version(version: str) -> tuple[int, int]:
    """(major, minor) of a ``VERSION()`` like ``10.11.19-MariaDB-0+deb12u1``."""
    major, minor = (int(part) for part in version.split("-")[0].split(".")[:2])
    return major, minor


def _mariadb_with_returning(version: str) -> bool:
    """True for MariaDB 10.5 and later."""
    return "mariadb" in version.lower() and _mariadb_version(version) >= (10, 5)


def _insert_rows(conn: Connection, rows: list[dict[str, Any]], suffix: str = "") -> Any:
    return conn.exec_driver_sql(insert_sql(conn.connection.dbapi_connection, rows, suffix), (rows[0]["data"],))


def _statement_timeouts(dbapi_conn: Any, record: Any) -> None:
    """A new connection's reads wait 30 s from now on (3 s while it was being opened)."""
    dbapi_conn._read_timeout = 30  # PyMySQL applies it at its next read
