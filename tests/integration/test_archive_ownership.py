"""The archive job and the broker's retention job never select the same rows."""

from __future__ import annotations

from datetime import timedelta

import pymysql
from sqlalchemy import update
from sqlalchemy.engine import make_url

from tidemq import clock
from tidemq_broker.maintenance.retention import Retention
from tidemq_broker.schema import message
from tidemq_broker.storage import AckItem, LockRequest, NewRow, Shard, TopicSettings
from tests.sqldb import open_sql
from tidemq_pipeline import store


def test_archive_takes_only_what_retention_leaves(mysql_url):
    storage, db = open_sql(mysql_url)
    now = clock.now()
    settings = {"owned.by.archive": TopicSettings("owned.by.archive", retention_days=3, archive=True),
                "kept.forever": TopicSettings("kept.forever", retention_days=0),
                "deleted.by.broker": TopicSettings("deleted.by.broker", retention_days=3)}
    for s in settings.values():
        storage.topics.save_topic(s, now)
    for topic in [*settings, "no.settings.row"]:
        storage.messages.insert_messages([NewRow(topic, "1", now, 0) for _ in range(10)], now)
        leased = storage.leases.lock_batch(LockRequest(Shard(topic), "c", 30, now, limit=10))
        storage.acks.ack([AckItem(m.id, m.lease_token, i % 2 == 0) for i, m in enumerate(leased)], now, "c", "b",
                    TopicSettings)
    with db.engine.begin() as conn:  # everything finished ten days ago
        conn.execute(update(message).values(finish_time=now - timedelta(days=10)))

    url = make_url(mysql_url)
    conn = pymysql.connect(host=url.host, port=url.port, user=url.username, database=url.database, autocommit=True)
    try:
        cutoffs = store.Cutoffs.compute(store.db_now(conn), store.topics(conn), min_age=60)
        with conn.cursor() as cur:
            cur.execute(f"SELECT topic, status, COUNT(*) FROM tidemq_message WHERE {cutoffs.predicate()} "
                        "GROUP BY topic, status")
            archivable = {(t, s): n for t, s, n in cur.fetchall()}
    finally:
        conn.close()
    assert archivable == {
        ("owned.by.archive", "SUCCESS"): 5, ("owned.by.archive", "FAIL"): 5,
        ("kept.forever", "SUCCESS"): 5, ("kept.forever", "FAIL"): 5,
        ("no.settings.row", "SUCCESS"): 5, ("no.settings.row", "FAIL"): 5,
        ("deleted.by.broker", "FAIL"): 5,
    }
    assert Retention(storage.topics, storage.messages).run() == 5  # exactly the SUCCESS rows the archive leaves alone
    assert storage.counts.count_by_status("deleted.by.broker") == {"deleted.by.broker": {"FAIL": 5}}
    storage.close()
