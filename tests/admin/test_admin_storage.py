"""The console's storage operations on every store (memory, SQLite, MariaDB): bounded scans,
index choice, users, deletes."""

from __future__ import annotations

import json

import pytest

from tidemq import clock
from tidemq_broker.storage import LockRequest, MessageFilter, NewRow, Shard
from tidemq_broker.storages import open_database, sql_storage


@pytest.fixture
def storage(console_storage):
    return console_storage


@pytest.fixture
def store(storage):
    return storage.console


def _fill(storage, topic, datas):
    now = clock.now()
    storage.topics.ensure_topics([topic], now)
    rows = [NewRow(topic=topic, data=d, effect_time=now, retry_remaining=0) for d in datas]
    return storage.messages.insert_messages(rows, now, broker="x")


def test_text_search_scans_a_bounded_window_and_continues_older(store, storage):
    ids = _fill(storage, "t", [json.dumps({"n": i, "tag": "hit" if i in (2, 25) else "miss"}) for i in range(30)])
    flt = MessageFilter(text="hit")
    first = store.list_page(flt, 10, window=10)
    assert [m.id for m in first.messages] == [ids[25]] and first.scanned_from == ids[-1] + 1 - 10
    assert first.next_before_id == first.scanned_from  # older ids remain to be searched
    empty = store.list_page(flt, 10, first.next_before_id, window=10)
    assert empty.messages == [] and empty.next_before_id is not None
    found, before, pages = [], None, 0
    while True:
        page = store.list_page(flt, 10, before, window=10)
        found += [m.id for m in page.messages]
        pages += 1
        if page.next_before_id is None:
            break
        before = page.next_before_id
    assert found == [ids[25], ids[2]]
    assert pages >= 3


def test_topic_pages_merge_statuses_newest_first(store, storage):
    ids = _fill(storage, "t", ["1", "2", "3", "4", "5"])
    _fill(storage, "other", ["9"])
    storage.leases.lock_batch(LockRequest(Shard("t"), "c", 30, clock.now(), limit=2))
    page = store.list_page(MessageFilter(topic="t"), 3)
    assert [m.id for m in page.messages] == sorted(ids, reverse=True)[:3]
    rest = store.list_page(MessageFilter(topic="t"), 3, page.next_before_id)
    assert [m.id for m in rest.messages] == sorted(ids, reverse=True)[3:] and rest.next_before_id is None


def test_unique_key_is_found_without_a_topic(store, storage):
    now = clock.now()
    storage.topics.ensure_topics(["a", "b"], now)
    [wanted] = storage.messages.insert_messages([NewRow("b", "1", now, 0, unique_key="k1")], now)
    storage.messages.insert_messages([NewRow("a", "1", now, 0, unique_key="k2")], now)
    assert [m.id for m in store.list_page(MessageFilter(unique_key="k1"), 10).messages] == [wanted]


def test_one_status_is_paged_across_topics_newest_first(store, storage):
    """A status without a topic walks each topic's index range and merges them by id."""
    from tidemq_broker.storage import AckItem, TopicSettings

    ids = {}
    for topic in ("a", "b", "c"):
        ids[topic] = _fill(storage, topic, [str(i) for i in range(4)])
        leased = storage.leases.lock_batch(LockRequest(Shard(topic), "c", 30, clock.now(), limit=3))
        items = [AckItem(msg.id, msg.lease_token, i != 1) for i, msg in enumerate(leased)]
        storage.acks.ack(items, clock.now(), "c", "b", TopicSettings)  # 2 SUCCESS, 1 FAIL
    succeeded = sorted((i for topic in ids for i in (ids[topic][0], ids[topic][2])), reverse=True)
    seen, before = [], None
    while True:
        page = store.list_page(MessageFilter(status="SUCCESS"), 4, before)
        seen += [msg.id for msg in page.messages]
        assert all(msg.status == "SUCCESS" for msg in page.messages)
        if page.next_before_id is None:
            break
        before = page.next_before_id
    assert seen == succeeded
    failed = sorted(ids[topic][1] for topic in ids)
    assert store.matching_ids(MessageFilter(status="FAIL"), 0, 2) == failed[:2]
    assert store.matching_ids(MessageFilter(status="FAIL"), failed[1], 2) == failed[2:]
    assert [m.id for m in store.list_page(MessageFilter(status="NEW"), 10).messages] == sorted(
        (ids[topic][3] for topic in ids), reverse=True)


def test_delete_keeps_running_messages(storage):
    ids = _fill(storage, "t", ["1", "2"])
    [held] = storage.leases.lock_batch(LockRequest(Shard("t"), "c", 30, clock.now(), limit=1))
    assert storage.messages.delete_messages(ids) == 1
    assert storage.reads.get_message(held.id).status == "RUNNING"


def test_users_are_saved_and_updated(store):
    assert store.save_user("amy", "hash-1", "viewer", clock.now()) is True
    assert store.save_user("amy", "hash-2", "admin", clock.now()) is False
    user = store.get_user("amy")
    assert (user.password_hash, user.role) == ("hash-2", "admin")
    assert store.get_user("nobody") is None


def test_mysql_walks_the_console_indexes(mysql_url, mariadb):
    """EXPLAIN of the console's pages as the store plans them, first and later pages: an index
    walk in id order, never a filesort."""
    db = open_database(mysql_url)
    storage = sql_storage(db)
    try:
        store = storage.console
        _fill(storage, "t", [str(i) for i in range(50)])
        from sqlalchemy import select

        from tidemq_broker.schema import message as m

        index = "idx_message_topic_status_lease"
        filters = [MessageFilter(topic="t", status=s) for s in ("NEW", "SUCCESS", "FAIL")]
        filters += [MessageFilter(status=s) for s in ("NEW", "SUCCESS", "FAIL")] + [MessageFilter(topic="t")]
        for flt in filters:
            with db.engine.connect() as conn:
                plan = store._plan(conn, flt)
            assert plan.index == index
            for branch in plan.branches or [[]]:
                for keyset in ((), (m.c.id < 40,)):
                    stmt = db.dialect.force_index(select(m.c.id).where(*plan.indexed, *branch, *keyset)
                                                  .order_by(m.c.id.desc()).limit(51), index)
                    sql = str(stmt.compile(db.engine, compile_kwargs={"literal_binds": True}))
                    explained = mariadb.execute("EXPLAIN " + sql, mysql_url.rsplit("/", 1)[-1])
                    assert explained[0][5] == index, (flt, explained)
                    if not any("RUNNING" in str(c.compile(compile_kwargs={"literal_binds": True})) for c in branch):
                        assert "filesort" not in str(explained[0][-1]), (flt, explained)
    finally:
        storage.close()


def test_mysql_finds_leases_by_index_ranges(mysql_url, mariadb):
    """Lease expiry, release and a pull's read-back name their topics, so each is a range of
    (topic, status, lease_expire) and never a scan of the table."""
    db = open_database(mysql_url)
    storage = sql_storage(db)
    try:
        for topic in ("a", "b"):
            _fill(storage, topic, [str(i) for i in range(3000)])
        mariadb.execute("ANALYZE TABLE tidemq_message", mysql_url.rsplit("/", 1)[-1])  # as on any table of size
        from sqlalchemy import select

        from tidemq_broker.schema import message as m
        from tidemq_broker.storages.reads import topics_present

        with db.engine.connect() as conn:
            topics = topics_present(conn)
        assert sorted(topics) == ["a", "b"]
        for where in ((m.c.lease_expire < clock.now(),), (m.c.lease_token == "0" * 32,),  # expiry, release,
                      (m.c.lease_expire == clock.now(), m.c.lease_token == "0" * 32)):  # a pull's read-back
            stmt = select(m.c.id).where(m.c.topic.in_(topics), m.c.status == "RUNNING", *where)
            sql = str(stmt.compile(db.engine, compile_kwargs={"literal_binds": True}))
            explained = mariadb.execute("EXPLAIN " + sql, mysql_url.rsplit("/", 1)[-1])
            # Either index starting (topic, status) bounds the walk to the RUNNING rows of each topic.
            assert explained[0][3] == "range", explained
            assert explained[0][5] in ("idx_message_topic_status_lease", "idx_message_lock"), explained
        plan = mariadb.execute("EXPLAIN SELECT DISTINCT topic FROM tidemq_message", mysql_url.rsplit("/", 1)[-1])
        assert "group-by" in str(plan[0][-1]), plan  # a loose index scan: one probe per topic
    finally:
        storage.close()


def test_counts_take_large_statuses_from_the_leaders_count_and_count_the_rest_now(storage):
    from tidemq_broker.maintenance.counts import TopicCounts
    from tidemq_broker.storage import COUNTED_FROM

    admin = storage.console
    now = clock.now()
    storage.messages.insert_messages([NewRow("c.one", "1", now, 0)] * 3, now)
    fresh = admin.topic_counts()
    assert fresh.counts == {"c.one": {"NEW": 3}} and fresh.stored == [] and fresh.counted_at is None
    job = TopicCounts(storage.counts, interval=10.0)
    assert job.run() == 3 and job.interval == 10.0
    assert admin.topic_counts().counts == {"c.one": {"NEW": 3}}  # small: still counted live
    # A large count of finished messages (as on a busy installation) is read from the store;
    # the messages in flight are still counted now.
    storage.counts.save_topic_counts({"c.one": {"SUCCESS": COUNTED_FROM + 5, "NEW": 3}}, now)
    storage.messages.insert_messages([NewRow("c.one", "2", now, 0)], now)
    counted = admin.topic_counts()
    assert counted.counts == {"c.one": {"SUCCESS": COUNTED_FROM + 5, "NEW": 4}}
    assert counted.stored == ["SUCCESS"] and counted.counted_at is not None
    # Counts the caller made itself (the dashboard's NEW, from its backlog query) are used as given.
    assert admin.topic_counts(known={"c.one": {"NEW": 7}}).counts == {"c.one": {"SUCCESS": COUNTED_FROM + 5, "NEW": 7}}
