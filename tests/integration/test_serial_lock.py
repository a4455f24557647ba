"""A serial lease on MySQL waits for any other serial lease of the same topic (a row lock on the
topic's settings row): otherwise a second lease that saw nothing RUNNING before the first
committed, and read the head after, would start the next message while the first still runs."""

from __future__ import annotations

import threading

from sqlalchemy import text

from tests.servers import INNODB_TRX_POLL, LOCK_WAITS, wait_until
from tests.sqldb import open_sql
from tidemq import clock
from tidemq_broker.storage import LockRequest, NewRow, Shard, TopicSettings


def test_a_serial_lease_waits_for_the_topics_row_lock(mysql_url):
    storage, db = open_sql(mysql_url)
    try:
        now = clock.now()
        storage.topics.save_topic(TopicSettings("t.serial.lock"), now)
        storage.messages.insert_messages([NewRow("t.serial.lock", str(n), now, 0) for n in range(2)], now)
        result: list = []
        with db.engine.connect() as holder:
            holder.execute(text("SELECT name FROM tidemq_topic WHERE name = 't.serial.lock' FOR UPDATE"))
            leasing = threading.Thread(target=lambda: result.append(
                storage.leases.lock_serial(LockRequest(Shard("t.serial.lock"), "c2", 30, clock.now()))))
            leasing.start()
            with db.engine.connect() as probe:
                wait_until(lambda: probe.execute(text(LOCK_WAITS)).scalar(), 10, INNODB_TRX_POLL,
                           what="the serial lease to wait for the topic's row lock")
            assert not result
            holder.rollback()
        leasing.join(10)
        [[head]] = result
        assert head.data == "0"
    finally:
        storage.close()
