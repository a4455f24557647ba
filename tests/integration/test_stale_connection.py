"""The pool lends connections without pinging them first (a round trip per produce saved): a
connection the server dropped while it sat in the pool must cost the next unit of work nothing,
and a retried unit of work must not be applied twice."""

from __future__ import annotations

import pymysql
from sqlalchemy.engine import make_url

from tidemq import clock
from tidemq_broker.storage import NewRow
from tests.sqldb import open_sql


def test_a_connection_killed_in_the_pool_is_replaced_without_an_error_or_a_duplicate(mysql_url):
    storage, db = open_sql(mysql_url, pool_size=1)
    url = make_url(mysql_url)
    admin = pymysql.connect(host=url.host, port=url.port, user=url.username, password=url.password or "",
                            database=url.database, autocommit=True)
    try:
        now = clock.now()
        storage.messages.insert_messages([NewRow("t.stale", '"first"', now, 0)], now)
        pooled = db.tx(lambda conn: conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar())
        with admin.cursor() as cur:
            cur.execute(f"KILL CONNECTION {int(pooled)}")  # as wait_timeout or a server restart would
        [new_id] = storage.messages.insert_messages([NewRow("t.stale", '"second"', now, 0)], now)
        assert storage.reads.get_message(new_id).data == '"second"'
        with admin.cursor() as cur:
            cur.execute("SELECT data FROM tidemq_message WHERE topic = 't.stale' ORDER BY id")
            assert [row[0] for row in cur.fetchall()] == ['"first"', '"second"']  # once each
        assert db.tx(lambda conn: conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar()) != pooled
    finally:
        admin.close()
        storage.close()


def test_a_read_connection_killed_between_reads_is_replaced_and_reads_stay_fresh(mysql_url):
    """``SqlDatabase.read`` keeps autocommit connections for the hot reads: one killed between
    two reads costs the next read nothing, and each read sees what was committed before it."""
    storage, db = open_sql(mysql_url)
    url = make_url(mysql_url)
    admin = pymysql.connect(host=url.host, port=url.port, user=url.username, password=url.password or "",
                            database=url.database, autocommit=True)
    try:
        now = clock.now()
        [first] = storage.messages.insert_messages([NewRow("t.read", '"first"', now, 0)], now)
        [state] = storage.reads.get_results([first])
        assert state.status == "NEW"
        reader = db.read(lambda conn: conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar())
        with admin.cursor() as cur:
            cur.execute(f"KILL CONNECTION {int(reader)}")
        [second] = storage.messages.insert_messages([NewRow("t.read", '"second"', now, 0)], now)
        states = storage.reads.get_results([first, second])  # the killed reader, replaced
        assert [s.id for s in states] == [first, second]
        assert db.read(lambda conn: conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar()) != reader
    finally:
        admin.close()
        storage.close()
