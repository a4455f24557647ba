"""What MariaDB runs without a transaction: the no-wait lease (``claims.lease_no_wait``), its
candidates read with their version, then one UPDATE by key that fails at once rather than wait
for a row lock; and the ack of plain successes (``Acks._plain_autocommit``). A row changed
between the lease's two statements is left for the next lock; a row another transaction holds
sends the lock to the transaction that skips locked rows, which never waits either."""

from __future__ import annotations

import time

from sqlalchemy import text
import pymysql
import pytest
from sqlalchemy.exc import OperationalError

from tests.conformance.storage_ops import ack, insert, lock
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
        assert (m.status, m.attempt, m.lease_token, m.data) == ("RUNNING", stored.attempt, stored.lease_token, stored.data)
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


def test_a_lease_whose_connection_is_lost_after_its_update_fails_and_its_token_gives_the_rows_back(
        mysql_store, monkeypatch):
    # Run again, the lease would take other rows under the same token and leave these held until
    # their lease ran out: it fails instead, as a lost COMMIT does, and the caller gives the
    # token back (a worker does so after every failed pull).
    ids = insert(mysql_store, "t.nowaitlost", 3)
    real = claims.apply_to_versions

    def update_then_lose(*args, **kwargs):
        real(*args, **kwargs)  # committed by itself
        raise OperationalError("UPDATE", {}, pymysql.err.OperationalError(2013, "Lost connection"),
                               connection_invalidated=True)

    monkeypatch.setattr(claims, "apply_to_versions", update_then_lose)
    request = LockRequest(Shard("t.nowaitlost"), "c1", 30, clock.now(), limit=100, lease_token="a" * 32)
    with pytest.raises(StorageUnavailableError):
        mysql_store.leases.lock_batch(request)
    assert {mysql_store.reads.get_message(id).status for id in ids} == {"RUNNING"}
    monkeypatch.setattr(claims, "apply_to_versions", real)
    assert mysql_store.leases.release("a" * 32, clock.now()) == 3
    assert sorted(m.id for m in lock(mysql_store, "t.nowaitlost")) == ids
