"""The shared engine and transaction object every SQL component works through.

``SqlDatabase`` owns the SQLAlchemy engine, runs each unit of work in one transaction (retrying
the ones the dialect calls transient: deadlocks, lock-wait timeouts) and turns a lost database
into ``StorageUnavailableError``. The storage's components and the console's store each receive
the same instance; none of them opens transactions of its own.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Optional, TypeVar

from sqlalchemy import Connection, Engine, event
from sqlalchemy.sql.expression import Executable
from sqlalchemy.exc import DBAPIError, OperationalError, TimeoutError as PoolTimeoutError

from tidemq.outage import Outage

from ..errors import StorageUnavailableError
from . import no_wait
from .dialect import SqlDialect
from .kept import Kept
from .reach import Reach
from .workflow_tally import Outcomes

__all__ = ["NoConnectionError", "SqlDatabase"]

log = logging.getLogger(__name__)
#: Fresh connections a unit of work may need: one for its lost connection, then (a restart) one
#: from a renewed pool.
_RECONNECTS = 2
#: Connections kept for ``read`` (taken from the engine's pool), and how long a read waits for one.
_READERS, _READER_WAIT = 8, 5.0
#: How long a unit of work refused a new connection (the server full) waits for one of its kind
#: that is open and in use to come back.
_CROWDED_WAIT = 1.0

T = TypeVar("T")


class NoConnectionError(StorageUnavailableError):
    """A unit of work found no open connection and the server refused a new one (at
    ``max_connections``, down): nothing of it was sent. A group commit of plain rows refused
    so then tries a transaction, whose pool may have a connection free (``Writes.insert_messages``)."""


class SqlDatabase:
    """An engine, its dialect's hooks, and transactions."""

    def __init__(self, engine: Engine, dialect: SqlDialect, produce_engine: Optional[Engine] = None) -> None:
        self.engine = engine
        self.dialect = dialect
        # Produce's own connections (MySQL: multi-statement, so a group commit's rows and its
        # request ids go in one round trip); every other use, the console's included, keeps
        # single-statement connections.
        self.produce_engine = produce_engine or engine
        # SQLite has one writer at a time: a process lock serialises transactions instead of
        # letting them fail with "database is locked" (it also keeps a multi-row INSERT's rowids
        # consecutive). MySQL runs transactions concurrently.
        self._serial: ContextManager[Any] = threading.RLock() if dialect.single_writer else nullcontext()
        # Autocommit connections for ``read`` and ``autocommit``, opened when first needed.
        self._readers = Kept(_READERS)
        self._writers = Kept(_READERS)
        # Autocommit connections of the produce engine, for ``commit_alone``.
        self._producers = Kept(_READERS)
        #: Logs a database outage once, and its end; the callers of ``tx`` that get its
        #: StorageUnavailableError do not log it again.
        self.outage = Outage(log, "calls to the database")
        #: Told after each commit that ended workflows (``workflow_tally``; a broker's metrics).
        self.workflow_outcomes = Outcomes()
        self._local = threading.local()  # .lost: connections this thread's unit of work lost so far
        for pooled in {self.engine, self.produce_engine}:
            event.listen(pooled, "handle_error", self._on_error)
        no_wait.enable(self.engine)
        self.reach = Reach(list(dict.fromkeys([self.engine, self.produce_engine])), watch=not dialect.single_writer,
                           addresses=dialect.addresses)

    def _on_error(self, context: Any) -> None:
        """On a lost connection, renew the whole pool only when the unit of work lost one before.

        SQLAlchemy's default drops every pooled connection whenever one turns out lost. After a
        restart they are all stale, but one connection killed (``KILL CONNECTION``, a proxy, a
        ``wait_timeout``) says nothing about the others, and with connections killed ten times a
        second every unit of work paid for a new connection. So the first loss drops that one
        connection only; a second in the same unit of work means the server restarted, and the
        pool is renewed (``tx`` runs the work again after each).
        """
        if context.is_disconnect:
            context.invalidate_pool_on_disconnect = getattr(self._local, "lost", 0) > 0

    def tx(self, work: Callable[[Connection], T], attempts: int = 12, produce: bool = False,
           committed: Optional[Callable[[], None]] = None) -> T:
        """Run ``work(conn)`` in one transaction and return its result.

        A transaction the dialect calls transient (deadlock, lock-wait timeout; on a Galera
        cluster also a certification conflict, reported as a deadlock at COMMIT, and a local
        transaction aborted by a replicated one) was rolled back entirely, so it runs again,
        after a growing, jittered pause: brokers writing through different Galera nodes can
        abort each other's transactions several times in a row under load.

        A pooled connection is not pinged before use (that would add a round trip to every
        produce): if it turns out dead before the COMMIT was sent, nothing was committed, so the
        work runs again on a fresh connection (twice at most, see ``_on_error``). A connection
        lost during the COMMIT leaves the outcome unknown and is reported, never retried.

        ``committed`` is called right after the COMMIT (a hand-off's delivery, ``handoff.py``).

        A new connection refused because the server has as many as it allows (other clients hold
        them) is tried again, on an idle connection kept for ``read``, ``autocommit`` or
        ``commit_alone`` given back to the pool for it (``_free_kept``): the kept connections are
        taken from the same pool, and can leave it with none of its own when the server fills up.
        A database that cannot be reached (refused or lost connections, no pooled connection
        free within the pool's timeout) raises ``StorageUnavailableError``, a retriable error;
        the first of an outage is logged (``outage``), the others are left to the callers.
        """
        self._local.lost = 0
        with self.reach:
            return self._tx(work, attempts, produce, committed)

    def _tx(self, work: Callable[[Connection], T], attempts: int, produce: bool, committed: Any) -> T:
        for attempt in range(1, attempts + 1):
            self.reach.check()  # out of reach meanwhile: not one more connection's timeout
            committing = opened = False
            try:
                engine = self.produce_engine if produce else self.engine
                with self._serial, engine.connect() as conn:
                    opened = True
                    with conn.begin():
                        result = work(conn)
                        committing = True
                    if committed is not None:
                        committed()  # before the connection's check-in, a round trip sooner
                self.outage.succeeded()
                return result
            except DBAPIError as exc:
                if not opened and self.dialect.is_crowded(exc) and attempt < attempts:
                    # Refused a new connection, the server full: an idle kept connection goes
                    # back to the pool for this unit of work (or one of the pool's own comes
                    # back meanwhile, which the pool hands out before it tries to open one).
                    if not self._free_kept(engine):
                        _pause(attempt)
                    continue
                if self.dialect.is_transient(exc) and attempt < attempts:
                    _pause(attempt)
                    continue
                if exc.connection_invalidated and not committing and self._local.lost < _RECONNECTS:
                    self._local.lost += 1
                    continue
                if isinstance(exc, OperationalError) or exc.connection_invalidated:
                    # An earlier attempt that lost its connection did not reach its COMMIT.
                    raise self._unavailable(exc.orig, sent=opened) from exc
                raise
            except PoolTimeoutError as exc:
                raise self._unavailable(exc) from exc
        raise AssertionError("unreachable")

    def _unavailable(self, cause: BaseException, sent: bool = True) -> StorageUnavailableError:
        """The error for a unit of work the database did not serve (``sent``: any of it reached the server)."""
        if not sent:
            self.reach.check()  # silent meanwhile: the broker's failure, not the request's (reach.py)
        if not self.reach.out_of_reach:  # else reach.py named the fault, once: not a line more
            self.outage.failed(cause)
        error = StorageUnavailableError if sent else NoConnectionError
        return error(f"the database is unavailable: {cause!r}")

    def read(self, work: Callable[[Connection], T]) -> T:
        """Run ``work(conn)``, which only reads, on a connection in autocommit mode: each
        statement sees what was committed before it, as it would in a READ COMMITTED
        transaction, without the transaction around it.

        For the reads made many times a second (the pull hub's probes, a pull's next due time,
        waiting Results calls): ``tx`` adds a pool checkout, a COMMIT and the rollback on
        check-in to each, several times the CPU of the read itself. A few connections are kept
        for such reads (``_READERS``); a lost one is dropped and the read made once more on
        another (a read changes nothing); if that fails too, the database is unavailable.
        SQLite (one writer, reads through ``tx``) keeps its process lock instead.
        """
        return self._autocommit(work, self._readers)

    def autocommit(self, work: Callable[[Connection], T]) -> T:
        """``read``, for a unit of work whose statements may write, each committed by itself
        (the no-wait lease, ``claims.lease_no_wait``; the ack of plain successes). It runs again
        on another connection when its own was lost, so it must be safe to run twice, or raise
        something else than the driver's error once a write may have committed (the lease
        does). Its connections are not the readers': a slow probe must not hold up a lease."""
        return self._autocommit(work, self._writers)

    def commit_alone(self, work: Callable[[Connection], T], attempts: int = 12,
                     lost: Optional[Callable[[], T]] = None) -> T:
        """Run ``work(conn)``, one round trip that commits what it writes, on a produce connection
        in autocommit mode, where ``tx`` takes two (the statements, then COMMIT) and a pool
        checkout with a transaction's bookkeeping around them. For a group commit of plain rows
        that no pull waits for (``Writes.insert_messages``).

        An INSERT must not run twice, and its outcome is unknown once it was sent on a connection that
        then broke. So a connection is looked at before use, without a round trip (``SqlDialect.usable``):
        one the server closed while it sat here (``KILL``, ``wait_timeout``, a restart) is replaced at no
        risk. A connection lost during the statement raises ``StorageUnavailableError`` and is not retried,
        as a lost COMMIT in ``tx``, unless the caller can tell what happened: then ``lost()`` is returned
        instead (a group with request ids: the transaction's retry finds them stored or not). A transient
        refusal (deadlock, lock-wait timeout, a Galera certification conflict) committed nothing: the work
        runs again on a fresh connection, after the pause ``tx`` makes. ``work`` may also be one string
        that opens a transaction and commits it (``insert_plain_answering(commit=True)``): a connection is
        dropped after any error, so a transaction left open by a failed statement is rolled back by the
        server.
        """
        if self.dialect.single_writer:
            return self.tx(work, produce=True)
        with self.reach:
            return self._commit_alone(work, attempts, lost)

    def _commit_alone(self, work: Callable[[Connection], T], attempts: int, lost: Optional[Callable[[], T]]) -> T:
        conn = self._take(self._producers, "produce")
        driver_error = self.engine.dialect.loaded_dbapi.Error
        reopened = False
        try:
            for attempt in range(1, attempts + 1):
                self.reach.check()
                if conn is not None and not self.dialect.usable(conn):
                    conn = _dropped(conn)
                if conn is None:
                    try:
                        conn = _autocommit_connection(self.produce_engine)
                    except (DBAPIError, driver_error) as raised:
                        # Nothing of the work was sent. A pooled connection the server closed
                        # (a KILL) fails as its autocommit is set: replaced once. Any other
                        # failure to connect: the database cannot be reached now.
                        exc = self._judged(raised)
                        if exc.connection_invalidated and not reopened and attempt < attempts:
                            reopened = True
                            continue
                        conn = self._traded(self._producers, exc)
                        if conn is not None:
                            continue
                        raise self._unavailable(exc.orig, sent=False) from raised
                    except PoolTimeoutError as exc:
                        raise self._unavailable(exc) from exc
                try:
                    result = work(conn)
                    break
                except (DBAPIError, driver_error) as raised:
                    exc = self._judged(raised)
                    # Dropped on any error: a statement that failed inside a transaction the work
                    # opened leaves it open, and the server rolls it back with the connection.
                    conn = _dropped(conn)
                    if self.dialect.is_transient(exc) and not exc.connection_invalidated and attempt < attempts:
                        _pause(attempt)
                        continue
                    if isinstance(exc, OperationalError) or exc.connection_invalidated:
                        if lost is not None:
                            return lost()
                        raise self._unavailable(exc.orig) from raised
                    if exc is raised:
                        raise
                    raise exc from raised
                except BaseException:
                    conn = _dropped(conn)  # its state is not known: not for the next unit
                    raise
        finally:
            self._producers.give(conn)
        self.outage.succeeded()
        return result

    def _autocommit(self, work: Callable[[Connection], T], connections: Kept) -> T:
        if self.dialect.single_writer:
            return self.tx(work)
        with self.reach:
            return self._autocommit_unit(work, connections)

    def _autocommit_unit(self, work: Callable[[Connection], T], connections: Kept) -> T:
        conn = self._take(connections, "autocommit")
        try:
            for attempt in range(2):
                self.reach.check()
                try:
                    if conn is None:
                        conn = self._opened(connections)
                    result = work(conn)
                    break
                except DBAPIError as exc:
                    sent, conn = conn is not None, _dropped(conn)  # None: its connect failed, nothing sent
                    if exc.connection_invalidated and attempt == 0:
                        continue
                    if isinstance(exc, OperationalError) or exc.connection_invalidated:
                        raise self._unavailable(exc.orig, sent=sent) from exc
                    raise
                except self.engine.dialect.loaded_dbapi.Error as exc:
                    sent, conn = conn is not None, _dropped(conn)
                    if attempt == 0:
                        continue
                    raise self._unavailable(exc, sent=sent) from exc
                except PoolTimeoutError as exc:
                    raise self._unavailable(exc) from exc
                except BaseException:
                    conn = _dropped(conn)  # its state is not known: not for the next unit
                    raise
        finally:
            connections.give(conn)
        self.outage.succeeded()
        return result

    def _opened(self, connections: Kept) -> Connection:
        """A new autocommit connection for an empty slot of ``connections``; when the server
        refuses it for having as many as it allows, one of ``connections`` given back meanwhile."""
        try:
            return _autocommit_connection(self.engine)
        except DBAPIError as exc:
            conn = self._traded(connections, exc)
            if conn is None:
                raise
            return conn

    def _free_kept(self, engine: Engine) -> bool:
        """Give one idle kept connection of ``engine`` back to its pool (its slot left empty),
        from the kind of work that keeps most idle; False if none is idle."""
        kinds = [self._producers] if engine is self.produce_engine else []
        if engine is self.engine:
            kinds += [self._readers, self._writers]
        for kept in sorted(kinds, key=lambda k: -k.idle_count()):
            conn = kept.surrender()
            if conn is not None:
                try:
                    conn.close()  # to the pool, its isolation level reset
                except Exception:  # broken meanwhile: gone, as the pool would drop it
                    _dropped(conn)
                return True
        return False

    def _traded(self, connections: Kept, exc: DBAPIError) -> Optional[Connection]:
        """For a unit of work whose new connection ``exc`` refused: when the server is full
        (other clients hold every connection it allows), an open connection of ``connections``
        that another unit of work gives back within ``_CROWDED_WAIT``, else None."""
        return connections.trade(_CROWDED_WAIT) if self.dialect.is_crowded(exc) else None

    def _judged(self, raised: BaseException) -> DBAPIError:
        """``raised`` as SQLAlchemy would have wrapped it. A driver error from a connection's
        setup, or from the work's own use of the driver's cursor (several results of one
        string), is not wrapped: it is judged here, a lost connection flagged
        ``connection_invalidated`` as SQLAlchemy flags one it sees."""
        if isinstance(raised, DBAPIError):
            return raised
        dialect = self.engine.dialect
        return DBAPIError.instance(None, None, raised, dialect.loaded_dbapi.Error,  # type: ignore[arg-type]
                                   connection_invalidated=dialect.is_disconnect(raised, None, None))

    def _take(self, connections: Kept, kind: str) -> Optional[Connection]:
        """One of ``connections`` (None: a slot whose connection is to be opened), waiting for a
        free one at most ``_READER_WAIT`` seconds: more would hold up the caller past its deadline."""
        try:
            return connections.take(_READER_WAIT)
        except TimeoutError:
            raise self._unavailable(PoolTimeoutError(f"no {kind} connection free within {_READER_WAIT} s")) from None

    def autocommit_read(self, stmt: Executable, params: Optional[dict[str, Any]] = None) -> list[Any]:
        """The rows of one read statement (``read``)."""
        return self.read(lambda conn: list(conn.execute(stmt, params).all()))

    def close(self) -> None:
        """Release every pooled connection."""
        self.reach.stop()
        for connections in (self._readers, self._writers, self._producers):
            for conn in connections.idle():
                _dropped(conn)
        self.engine.dispose()
        if self.produce_engine is not self.engine:
            self.produce_engine.dispose()


def _pause(attempt: int) -> None:
    """Wait before attempt ``attempt + 1`` of a unit of work: growing, jittered, at most 0.1 s
    (brokers retrying together must not meet again)."""
    time.sleep(random.uniform(0.5, 1.0) * min(0.1, 0.002 * 2 ** attempt))


def _autocommit_connection(engine: Engine) -> Connection:
    """A new connection of ``engine`` kept in autocommit mode for its whole life. Its setup is
    not wrapped by SQLAlchemy: a connection lost here raises the driver's error."""
    conn = engine.connect()
    try:
        conn.execution_options(isolation_level="AUTOCOMMIT")
    except BaseException:
        _dropped(conn)  # not back to the pool: it failed, its state is unknown
        raise
    return conn


def _dropped(reader: Optional[Connection]) -> None:
    """Close a read connection that failed (or whose state is unknown) for good; None."""
    if reader is not None:
        try:
            reader.invalidate()
            reader.close()
        except Exception:  # already broken: nothing to give back
            pass
    return None
