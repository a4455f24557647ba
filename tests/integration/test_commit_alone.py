"""A group commit of plain rows that no pull waits for is one INSERT on an autocommit connection
(``SqlDatabase.commit_alone``): one round trip instead of the INSERT and its COMMIT. An INSERT
must never run twice, so a connection the server closed while idle is replaced before anything
is sent, and one lost during the statement is reported, not retried."""

from __future__ import annotations

import pymysql
import pytest
from sqlalchemy.engine import make_url

from tidemq import clock
from tidemq_broker.errors import StorageUnavailableError
from tidemq_broker.storage import NewRow, RequestRef
from tests.sqldb import open_sql


def _admin(mysql_url: str) -> pymysql.connections.Connection:
    url = make_url(mysql_url)
    return pymysql.connect(host=url.host, port=url.port, user=url.username, password=url.password or "",
                           database=url.database, autocommit=True)


def _on_producer(db, sql: str):
    """``sql``'s first value, read on the connection ``commit_alone`` would use next."""
    return db.commit_alone(lambda conn: conn.exec_driver_sql(sql).first())


def _counters(db) -> tuple[int, int]:
    """The producer connection's own INSERT and COMMIT counts."""
    rows = db.commit_alone(lambda conn: conn.exec_driver_sql(
        "SHOW SESSION STATUS WHERE Variable_name IN ('Com_insert', 'Com_commit')").all())
    got = {name: int(value) for name, value in rows}
    return got["Com_insert"], got["Com_commit"]


def _stored(admin, topic: str) -> list[str]:
    with admin.cursor() as cur:
        cur.execute("SELECT data FROM tidemq_message WHERE topic = %s ORDER BY id", (topic,))
        return [row[0] for row in cur.fetchall()]


def test_plain_rows_are_one_insert_without_a_commit_and_request_ids_keep_the_transaction(mysql_url):
    storage, db = open_sql(mysql_url)
    try:
        now = clock.now()
        storage.messages.insert_messages([NewRow("t.alone", '"warm"', now, 0)], now)
        inserts, commits = _counters(db)
        ids = storage.messages.insert_messages([NewRow("t.alone", f'"{n}"', now, 0) for n in range(3)], now)
        assert _counters(db) == (inserts + 1, commits)  # one statement, committed by itself
        assert ids == [ids[0], ids[0] + 1, ids[0] + 2]
        assert [storage.reads.get_message(i).data for i in ids] == ['"0"', '"1"', '"2"']
    finally:
        storage.close()


def test_rows_and_their_request_ids_commit_in_one_string_and_a_retry_leaves_nothing_behind(mysql_url):
    storage, db = open_sql(mysql_url)
    admin = _admin(mysql_url)
    try:
        now = clock.now()
        storage.messages.insert_messages([NewRow("t.req", '"warm"', now, 0)], now)
        inserts, commits = _counters(db)
        rows = [NewRow("t.req", f'"{n}"', now, 0) for n in range(3)]
        ids = storage.messages.insert_messages(rows, now, [RequestRef("req-1", 0, 2), RequestRef("req-2", 2, 1)])
        # The rows' INSERT, the request rows' and the COMMIT, all in the string on this connection.
        assert _counters(db) == (inserts + 2, commits + 1)
        # A retry of req-2: its request row's INSERT fails after the rows' INSERT in the same
        # string ran; the transaction is dropped with its connection and the stored answer read.
        assert storage.messages.insert_messages([NewRow("t.req", '"again"', now, 0)], now,
                                                [RequestRef("req-2", 0, 1)]) == [ids[2]]
        assert _stored(admin, "t.req") == ['"warm"', '"0"', '"1"', '"2"']  # no "again"
        [later] = storage.messages.insert_messages([NewRow("t.req", '"later"', now, 0)], now,
                                                   [RequestRef("req-3", 0, 1)])
        assert storage.reads.get_message(later).data == '"later"'
    finally:
        admin.close()
        storage.close()


def test_rows_beyond_one_statement_go_in_one_transaction(mysql_url):
    storage, db = open_sql(mysql_url)
    try:
        now = clock.now()
        storage.messages.insert_messages([NewRow("t.big", '"warm"', now, 0)], now)
        inserts, _ = _counters(db)
        big = '"' + "x" * 1_500_000 + '"'  # three of them pass the 4 MiB an INSERT is kept under
        ids = storage.messages.insert_messages([NewRow("t.big", big, now, 0) for _ in range(3)], now)
        assert _counters(db)[0] == inserts  # not alone: several INSERTs, one COMMIT
        assert len(set(ids)) == 3 and all(storage.reads.get_message(i).data == big for i in ids)
    finally:
        storage.close()


def test_under_lock_mode_2_a_group_with_request_ids_goes_straight_to_the_transaction(mysql_url, monkeypatch):
    # Lock mode 2 (interleaved ids) is a server start option; the dialect's reading of it is
    # what decides, so it is set as that check would have set it on such a server.
    storage, db = open_sql(mysql_url)
    try:
        now = clock.now()
        storage.messages.insert_messages([NewRow("t.mode2", '"warm"', now, 0)], now)
        monkeypatch.setattr(db.dialect, "_consecutive_ids", False)
        alone = []
        commit_alone = db.commit_alone
        monkeypatch.setattr(db, "commit_alone", lambda work, **kw: alone.append(1) or commit_alone(work, **kw))
        rows = [NewRow("t.mode2", f'"{n}"', now, 0) for n in range(3)]
        ids = storage.messages.insert_messages(rows, now, [RequestRef("m2-1", 0, 3)])
        assert alone == []  # its ids are checked before the COMMIT: no produce connection taken
        assert [storage.reads.get_message(i).data for i in ids] == ['"0"', '"1"', '"2"']
        assert storage.messages.insert_messages(rows, now, [RequestRef("m2-1", 0, 3)]) == ids  # a retry
        [plain] = storage.messages.insert_messages([NewRow("t.mode2", '"plain"', now, 0)], now)
        assert alone == [1]  # without request ids, RETURNING gives the ids in the one statement
        assert storage.reads.get_message(plain).data == '"plain"'
    finally:
        storage.close()


def test_a_producer_connection_killed_while_idle_is_replaced_before_the_insert_is_sent(mysql_url):
    storage, db = open_sql(mysql_url)
    admin = _admin(mysql_url)
    try:
        now = clock.now()
        storage.messages.insert_messages([NewRow("t.idle", '"first"', now, 0)], now)
        [idle] = _on_producer(db, "SELECT CONNECTION_ID()")
        with admin.cursor() as cur:
            cur.execute(f"KILL CONNECTION {int(idle)}")  # as wait_timeout or a server restart would
        [second] = storage.messages.insert_messages([NewRow("t.idle", '"second"', now, 0)], now)
        assert storage.reads.get_message(second).data == '"second"'
        assert _stored(admin, "t.idle") == ['"first"', '"second"']  # once each, no error
        assert _on_producer(db, "SELECT CONNECTION_ID()")[0] != idle
    finally:
        admin.close()
        storage.close()


def test_a_pooled_connection_found_closed_as_it_is_set_up_is_replaced_with_nothing_sent(mysql_url):
    storage, db = open_sql(mysql_url)
    admin = _admin(mysql_url)
    try:
        now = clock.now()
        # A keyed row goes through a transaction of the produce engine, which pools its connection.
        storage.messages.insert_messages([NewRow("t.setup", '"keyed"', now, 0, unique_key="k1")], now)
        pooled = db.produce_engine.raw_connection()
        driver = pooled.dbapi_connection
        pooled.close()  # back to the pool, alive
        driver._force_close()  # closed under the pool, as a statement that met a KILL leaves it
        # The producer's first connection comes from that pool: setting its autocommit fails
        # (InterfaceError (0, '')) before anything of the rows is sent. It is replaced.
        ids = storage.messages.insert_messages([NewRow("t.setup", f'"{n}"', now, 0) for n in range(2)], now)
        assert _stored(admin, "t.setup") == ['"keyed"', '"0"', '"1"']
        assert [storage.reads.get_message(i).data for i in ids] == ['"0"', '"1"']
    finally:
        admin.close()
        storage.close()


def test_a_connection_lost_during_the_statement_is_reported_and_the_insert_not_run_again(mysql_url):
    storage, db = open_sql(mysql_url)
    admin = _admin(mysql_url)
    runs = []

    def insert_after_a_kill(conn):
        runs.append(1)
        own = conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
        with admin.cursor() as cur:
            cur.execute(f"KILL CONNECTION {int(own)}")  # between the check and the statement
        return conn.exec_driver_sql("DO 1")  # the statement a lost connection leaves unknown

    try:
        with pytest.raises(StorageUnavailableError):
            db.commit_alone(insert_after_a_kill)
        assert len(runs) == 1
        # A caller that can tell what happened (request ids) gets its own answer instead.
        assert db.commit_alone(insert_after_a_kill, lost=lambda: "resolved by the caller") == "resolved by the caller"
        assert len(runs) == 2
        now = clock.now()
        [after] = storage.messages.insert_messages([NewRow("t.lost", '"after"', now, 0)], now)
        assert storage.reads.get_message(after).data == '"after"'  # a fresh connection took its place
    finally:
        admin.close()
        storage.close()


@pytest.mark.parametrize("committed", [False, True], ids=["lost before", "lost after the commit"])
def test_a_string_whose_connection_is_lost_is_settled_by_its_request_ids(mysql_url, monkeypatch, committed):
    """The string's connection is killed before it is sent (nothing committed) or after its
    COMMIT, before the answer is read: either way the transaction that follows stores the rows
    once and answers with their ids."""
    storage, db = open_sql(mysql_url)
    admin = _admin(mysql_url)
    real = type(db.dialect).insert_plain_answering
    strings = []

    def lost_string(self, conn, values, requests, now, commit=False):
        if not commit:
            return real(self, conn, values, requests, now, commit)
        strings.append(1)
        own = conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
        ids = real(self, conn, values, requests, now, commit) if committed else None
        with admin.cursor() as cur:
            cur.execute(f"KILL CONNECTION {int(own)}")
        conn.exec_driver_sql("DO 1")  # the lost connection, as the string's answer would find it
        return ids

    try:
        now = clock.now()
        monkeypatch.setattr(type(db.dialect), "insert_plain_answering", lost_string)
        ids = storage.messages.insert_messages([NewRow("t.settle", f'"{n}"', now, 0) for n in range(2)], now,
                                               [RequestRef("req-settle", 0, 2)])
        assert strings == [1]
        assert _stored(admin, "t.settle") == ['"0"', '"1"']  # once
        assert [storage.reads.get_message(i).data for i in ids] == ['"0"', '"1"']
    finally:
        admin.close()
        storage.close()
