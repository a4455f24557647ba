"""What MariaDB runs without a transaction: the no-wait lease (``claims.lease_no_wait``), its
candidates read with their version, then one UPDATE by key that fails at once rather than wait
for a row lock; and the ack of plain successes (``Acks._plain_autocommit``). A row changed
between the lease's two statements is left for the next lock; a row another transaction holds
sends the lock to the transaction that skips locked rows, which never waits either."""

from __future__ import annotations

import threading
import time

from sqlalchemy import text
import pytest

from tests.conformance.storage_ops import ack, insert, lock
from tests.servers import wait_until
from tidemq import clock
from tidemq.errors import StorageUnavailableError
from tidemq_broker.storage import AckItem, AckOutcome, LockRequest, Shard
from tidemq_broker.storages import claims


def test_a_row_edited_between_the_read_and_the_update_is_left_alone_then_leased_as_edited(
        mysql_store, mysql_db, monkeypatch):
    ids = insert(mysql_store, "t.nowait", 3)
    edited = ids[1]
    real, reads = claims.read_candidates, []

    def read_then_edit(conn, dialect, shard, limit, due_by, now, columns=()):
        rows = real(conn, dialect, shard, limit, due_by, now, columns)
        reads.append(columns)
        if len(reads) == 1:  # an operator edits a candidate: still NEW, at a new version
            mysql_db.tx(lambda c: c.execute(text("UPDATE tidemq_message SET data = '{\"edited\": true}', "
                                                 "version = version + 1 WHERE id = :id"), {"id": edited}))
        return rows

    monkeypatch.setattr(claims, "read_candidates", read_then_edit)
    first = lock(mysql_store, "t.nowait")
    assert "version" in [c.name for c in reads[0]]  # the no-wait lease read the candidates
    assert sorted(m.id for m in first) == [ids[0], ids[2]]
    assert mysql_store.reads.get_message(edited).status == "NEW"
    for m in first:  # the rows leased are delivered as stored
        stored = mysql_store.reads.get_message(m.id)
        assert (m.status, m.attempt, m.lease_token, m.data) == (
            "RUNNING", stored.attempt, stored.lease_token, stored.data)
    [second] = lock(mysql_store, "t.nowait")
    assert (second.id, second.data, second.attempt) == (edited, '{"edited": true}', 1)


def test_a_row_another_transaction_holds_is_passed_over_without_waiting(mysql_store, mysql_db):
    ids = insert(mysql_store, "t.nowaitheld", 3)
    with mysql_db.engine.connect() as other:
        other.execute(text("SELECT id FROM tidemq_message WHERE id = :id FOR UPDATE"), {"id": ids[0]})
        began = time.monotonic()
        got = lock(mysql_store, "t.nowaitheld")
        # Functional bound: waiting for the lock would take innodb_lock_wait_timeout (50 s).
        assert sorted(m.id for m in got) == ids[1:] and time.monotonic() - began < 5.0
        other.rollback()
    [late] = lock(mysql_store, "t.nowaitheld")
    assert late.id == ids[0] and late.attempt == 1


def _transactions(mysql_db) -> int:
    """COMMITs and ROLLBACKs the server ran so far (every session's)."""
    with mysql_db.engine.connect() as conn:
        rows = conn.execute(text("SHOW GLOBAL STATUS WHERE Variable_name IN ('Com_commit', 'Com_rollback')")).all()
    return sum(int(value) for _name, value in rows)


def test_a_lease_and_an_ack_of_plain_successes_open_no_transaction(mysql_store, mysql_db):
    insert(mysql_store, "t.autocommit", 1)
    [warm] = lock(mysql_store, "t.autocommit")
    ack(mysql_store, [AckItem(warm.id, warm.lease_token, True)])  # the autocommit connections are open now
    ids = insert(mysql_store, "t.autocommit", 3)
    before = _transactions(mysql_db)
    leased = lock(mysql_store, "t.autocommit")
    assert sorted(m.id for m in leased) == ids
    assert ack(mysql_store, [AckItem(m.id, m.lease_token, True) for m in leased]) == [AckOutcome.APPLIED] * 3
    # Our own reads of the counter each end with the pool's rollback: one, after ``before``.
    assert _transactions(mysql_db) - before == 1
    assert {mysql_store.reads.get_message(id).status for id in ids} == {"SUCCESS"}
    # The same ack again (its reply lost): answered as recorded by the exact path, which locks.
    assert ack(mysql_store, [AckItem(m.id, m.lease_token, True) for m in leased]) == [AckOutcome.APPLIED] * 3
    assert all(mysql_store.reads.get_message(id).trace.count("SUCCESS") == 1 for id in ids)


def _kill(mysql_db, conn) -> None:
    """KILL CONNECTION the session of ``conn`` from another connection, as an operator would."""
    session = conn.connection.dbapi_connection.thread_id()
    with mysql_db.engine.connect() as other:
        other.exec_driver_sql(f"KILL CONNECTION {session}")


def _lease_killed(mysql_db, monkeypatch, before_update: bool) -> None:
    """Kill the no-wait lease's connection just before its UPDATE is sent, or just after it
    committed (its reply then lost with the connection)."""
    real = claims.apply_to_versions

    def killed(conn, *args, **kwargs):
        if before_update:
            _kill(mysql_db, conn)
            return real(conn, *args, **kwargs)  # fails: the server closed the connection
        changed = real(conn, *args, **kwargs)  # committed by itself
        _kill(mysql_db, conn)
        conn.exec_driver_sql("SELECT 1")  # what follows the UPDATE finds the connection gone
        return changed

    monkeypatch.setattr(claims, "apply_to_versions", killed)


@pytest.mark.parametrize("before_update", [False, True], ids=["after-its-update", "before-its-update"])
def test_a_lease_whose_connection_is_killed_answers_with_what_it_holds(mysql_store, mysql_db, monkeypatch,
                                                                       before_update):
    # The outcome of a write on a lost connection is read on another once the lost session's
    # statement is over: the pull answers with what its lease holds (the UPDATE committed), or
    # leases again (it did not), instead of failing and leaving the rows to be given back.
    ids = insert(mysql_store, "t.nowaitkilled", 3)
    _lease_killed(mysql_db, monkeypatch, before_update)
    token = "k" * 32
    request = LockRequest(Shard("t.nowaitkilled"), "c1", 30, clock.now(), limit=100, lease_token=token)
    got = mysql_store.leases.lock_batch(request)
    assert sorted(m.id for m in got) == ids
    for m in got:
        stored = mysql_store.reads.get_message(m.id)
        assert (stored.status, stored.lease_token, stored.attempt) == ("RUNNING", token, 1)
        assert (m.lease_token, m.attempt) == (token, 1)
    monkeypatch.undo()
    assert lock(mysql_store, "t.nowaitkilled") == []  # each leased once


def test_a_lease_whose_lost_session_cannot_be_told_fails_and_its_token_gives_the_rows_back(
        mysql_store, mysql_db, monkeypatch):
    # A driver that does not say which session a connection is (or a session still running its
    # statement): running the lease again would take other rows under the same token and leave
    # these held until their lease ran out. It fails instead, as a lost COMMIT does, and the
    # caller gives the token back (a worker does so after every failed pull).
    ids = insert(mysql_store, "t.nowaitlost", 3)
    _lease_killed(mysql_db, monkeypatch, before_update=False)
    monkeypatch.setattr(claims, "session_of", lambda conn: None)
    request = LockRequest(Shard("t.nowaitlost"), "c1", 30, clock.now(), limit=100, lease_token="a" * 32)
    with pytest.raises(StorageUnavailableError, match="outcome is unknown"):
        mysql_store.leases.lock_batch(request)
    assert {mysql_store.reads.get_message(id).status for id in ids} == {"RUNNING"}
    monkeypatch.undo()
    assert mysql_store.leases.release("a" * 32, clock.now()) == 3
    assert sorted(m.id for m in lock(mysql_store, "t.nowaitlost")) == ids


def test_a_session_is_over_once_idle_or_gone_and_not_while_its_statement_runs(mysql_db):
    from tidemq_broker.storages.lost_writes import session_of, statement_ended

    with mysql_db.engine.connect() as watcher, mysql_db.engine.connect() as busy:
        session = session_of(busy)
        assert session == busy.connection.dbapi_connection.thread_id()
        assert statement_ended(watcher, session, 0.0)  # idle between statements
        running = threading.Thread(target=lambda: busy.exec_driver_sql("SELECT SLEEP(2)"))
        running.start()
        try:
            wait_until(lambda: not statement_ended(watcher, session, 0.0), 5, what="the SLEEP running")
            began = time.monotonic()
            assert not statement_ended(watcher, session, 0.2)
            assert time.monotonic() - began >= 0.2  # it looked for as long as it was told to
            assert statement_ended(watcher, session, 10.0)  # the SLEEP's end
        finally:
            running.join()
    with mysql_db.engine.connect() as watcher:
        other = mysql_db.engine.connect()
        killed = session_of(other)
        _kill(mysql_db, other)
        wait_until(lambda: statement_ended(watcher, killed, 0.0), 5, what="the killed session gone")
        other.invalidate()
        other.close()
