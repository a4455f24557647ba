"""A serial lease on MySQL waits for any other serial lease of the same topic (a row lock on the
topic's settings row): otherwise a second lease that saw nothing RUNNING before the first
committed, and read the head after, would start the next message while the first still runs."""

from __future__ import annotations

import threading

from sqlalchemy import text

from tests.servers import wait_until
from tidemq import clock
from tidemq_broker.storage import NewRow, TopicSettings
from tidemq_broker.storages import open_storage


def test_a_serial_lease_waits_for_the_topics_row_lock(mysql_url):
    storage = open_storage(mysql_url)
    try:
        now = clock.now()
        storage.save_topic(TopicSettings("t.serial.lock"), now)
        storage.insert_messages([NewRow("t.serial.lock", str(n), now, 0) for n in range(2)], now)
        result: list = []
        with storage.db.engine.connect() as holder:
            holder.execute(text("SELECT name FROM tidemq_topic WHERE name = 't.serial.lock' FOR UPDATE"))
            leasing = threading.Thread(target=lambda: result.append(
                storage.lock_serial("t.serial.lock", 30, "c2", clock.now())))
            leasing.start()
            with storage.db.engine.connect() as probe:
                # InnoDB refreshes innodb_trx only when it was last read over 0.1 s ago: poll slower.
                wait_until(lambda: probe.execute(text(
                    "SELECT COUNT(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'")).scalar(), 10,
                    0.25, what="the serial lease to wait for the topic's row lock")
            assert not result
            holder.rollback()
        leasing.join(10)
        [[head]] = result
        assert head.data == "0"
    finally:
        storage.close()
