"""The no-wait lease on MariaDB (``claims.lease_no_wait``): candidates read with their version,
then one UPDATE by key that fails at once rather than wait for a row lock. A row changed between
the two is left for the next lock; a row another transaction holds sends the lock to the
transaction that skips locked rows, which never waits either."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text

from tests.conformance.storage_ops import insert, lock
from tidemq_broker.storages import claims, open_storage


@pytest.fixture
def storage(mysql_url):
    store = open_storage(mysql_url)
    yield store
    store.close()


def test_a_row_edited_between_the_read_and_the_update_is_left_alone_then_leased_as_edited(
        storage, mysql_db, monkeypatch):
    ids = insert(storage, "t.nowait", 3)
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
    first = lock(storage, "t.nowait")
    assert "version" in [c.name for c in reads[0]]  # the no-wait lease read the candidates
    assert sorted(m.id for m in first) == [ids[0], ids[2]]
    assert storage.reads.get_message(edited).status == "NEW"
    for m in first:  # the rows leased are delivered as stored
        stored = storage.reads.get_message(m.id)
        assert (m.status, m.attempt, m.lease_token, m.data) == ("RUNNING", stored.attempt, stored.lease_token, stored.data)
    [second] = lock(storage, "t.nowait")
    assert (second.id, second.data, second.attempt) == (edited, '{"edited": true}', 1)


def test_a_row_another_transaction_holds_is_passed_over_without_waiting(storage, mysql_db):
    ids = insert(storage, "t.nowaitheld", 3)
    with mysql_db.engine.connect() as other:
        other.execute(text("SELECT id FROM tidemq_message WHERE id = :id FOR UPDATE"), {"id": ids[0]})
        began = time.monotonic()
        got = lock(storage, "t.nowaitheld")
        # Functional bound: waiting for the lock would take innodb_lock_wait_timeout (50 s).
        assert sorted(m.id for m in got) == ids[1:] and time.monotonic() - began < 5.0
        other.rollback()
    [late] = lock(storage, "t.nowaitheld")
    assert late.id == ids[0] and late.attempt == 1
