"""innodb_autoinc_lock_mode=2 (MySQL 8's default, required by Galera) with an increment of 3: a
multi-row INSERT's ids are not consecutive there, so the group commit reads them back with
RETURNING (MariaDB 10.5+) and still writes a whole group in one statement."""

from __future__ import annotations

import json
import threading

import pymysql
import pytest
from sqlalchemy import text

from tests.servers import MariaDB
from tidemq import clock
from tidemq_broker.storage import LockRequest, NewRow, RequestRef, Shard
from tests.sqldb import open_sql


@pytest.fixture(scope="module")
def mode2_url():
    server = MariaDB("--innodb-autoinc-lock-mode=2", "--auto-increment-increment=3",
                     "--auto-increment-offset=2").start()
    yield server.create_database("tidemq_mode2")
    server.cleanup()


@pytest.fixture
def sql(mode2_url):
    store, db = open_sql(mode2_url)
    store.schema.create_schema()
    yield store, db
    store.close()


@pytest.fixture
def storage(sql):
    return sql[0]


@pytest.fixture
def db(sql):
    """The storage's database object: these tests watch its statements and read its tables."""
    return sql[1]


def _rows(topic, datas, now):
    return [NewRow(topic, json.dumps(d), now, 0) for d in datas]


def test_a_group_is_one_insert_and_every_row_gets_its_own_id(storage, monkeypatch):
    # Watched at the driver's cursor: the group commit runs its INSERT on it, past SQLAlchemy.
    statements = []
    execute = pymysql.cursors.Cursor.execute
    monkeypatch.setattr(pymysql.cursors.Cursor, "execute",
                        lambda cursor, query, args=None: statements.append(query) or execute(cursor, query, args))
    now = clock.now()
    ids = storage.messages.insert_messages(_rows("t.mode2", range(200), now), now)
    inserts = [s for s in statements if s.startswith("INSERT INTO tidemq_message")]
    assert len(inserts) == 1 and "RETURNING" in inserts[0]  # not one statement per row
    assert len(set(ids)) == 200 and ids == sorted(ids)
    assert {i % 3 for i in ids} == {2}  # the server's own ids: offset 2, increment 3
    assert [storage.reads.get_message(i).data for i in ids] == [json.dumps(n) for n in range(200)]
    [later] = storage.messages.insert_messages(_rows("t.mode2", ["later"], now), now)
    assert later > ids[-1]  # a later produce gets a later id: SERIAL_QUEUE order holds


def test_concurrent_groups_interleave_ids_yet_each_row_keeps_its_own(storage):
    now = clock.now()
    answers: dict[str, int] = {}
    errors = []

    def produce(t):
        try:
            for k in range(30):
                datas = [f"{t}-{k}-{n}" for n in range(20)]
                answers.update(zip(datas, storage.messages.insert_messages(_rows("t.mode2.mt", datas, now), now)))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(answers) == 4 * 30 * 20 and len(set(answers.values())) == len(answers)
    for data, msg_id in answers.items():
        assert json.loads(storage.reads.get_message(msg_id).data) == data


def test_a_retried_request_gets_its_ids_back_without_consecutive_ids(storage):
    now = clock.now()
    first = storage.messages.insert_messages(_rows("t.mode2.req", range(5), now), now, [RequestRef("call-m2", 0, 5)])
    again = storage.messages.insert_messages(_rows("t.mode2.req", range(5), now), now, [RequestRef("call-m2", 0, 5)])
    assert again == first and storage.counts.count_by_status("t.mode2.req") == {"t.mode2.req": {"NEW": 5}}


def _stored_answers(db, *request_ids):
    names = ", ".join(f"'{name}'" for name in request_ids)  # the tests' own constants
    with db.engine.connect() as conn:
        return dict(conn.execute(text(
            f"SELECT request_id, ids FROM tidemq_produce_request WHERE request_id IN ({names})")).all())


def test_requests_are_stored_with_their_rows_in_one_string(storage, db):
    now = clock.now()
    refs = [RequestRef("one-a", 0, 3), RequestRef("one-b", 3, 4)]
    ids = storage.messages.insert_messages(_rows("t.mode2.one", range(7), now), now, refs)
    # "r<first>:<step>:<count>", written from LAST_INSERT_ID() in the INSERT's own round trip.
    assert _stored_answers(db, "one-a", "one-b") == {"one-a": f"r{ids[0]}:3:3", "one-b": f"r{ids[3]}:3:4"}


def test_a_group_whose_ids_do_not_follow_the_step_stores_each_requests_id_list(storage, db, monkeypatch):
    """Lock mode 2 does not promise a multi-row INSERT consecutive ids. Here the dialect is told a
    step the server does not use, so "r<first>:<step>:<count>" names ids the rows did not get, as
    it would after a gap: the check against RETURNING must store the real lists before the
    commit, or a retried call would be answered with ids of other messages."""
    now = clock.now()
    storage.messages.insert_messages(_rows("t.mode2.gap", ["warm-up"], now), now)  # the dialect reads the server's step
    dialect = db.dialect
    assert dialect._id_step == 3
    monkeypatch.setattr(dialect, "_id_step", 6)
    refs = [RequestRef("gap-a", 0, 3), RequestRef("gap-b", 3, 4)]
    first = storage.messages.insert_messages(_rows("t.mode2.gap", range(7), now), now, refs)
    assert all(b - a == 3 for a, b in zip(first, first[1:]))  # the server's step, not the one assumed
    assert _stored_answers(db, "gap-a", "gap-b") == {
        "gap-a": ",".join(map(str, first[:3])), "gap-b": ",".join(map(str, first[3:]))}
    monkeypatch.undo()  # the retry, answered from what is stored
    again = storage.messages.insert_messages(_rows("t.mode2.gap", range(7), now), now, refs)
    assert again == first
    assert storage.counts.count_by_status("t.mode2.gap") == {"t.mode2.gap": {"NEW": 8}}


def test_concurrent_calls_each_get_their_own_ids_back_on_retry(storage):
    now = clock.now()
    answers: dict[str, list[int]] = {}
    errors = []

    def produce(t):
        try:
            for k in range(20):
                name = f"mt-{t}-{k}"
                answers[name] = storage.messages.insert_messages(_rows("t.mode2.mtreq", range(30), now), now,
                                                        [RequestRef(name, 0, 30)])
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(answers) == 80
    for name, ids in answers.items():
        assert storage.messages.insert_messages(_rows("t.mode2.mtreq", range(30), now), now, [RequestRef(name, 0,
                                                                                                         30)]) == ids
    assert storage.counts.count_by_status("t.mode2.mtreq") == {"t.mode2.mtreq": {"NEW": 80 * 30}}


def test_shards_spread_a_nodes_ids_although_they_are_all_alike_modulo_the_increment(storage):
    now = clock.now()
    ids = storage.messages.insert_messages(_rows("t.mode2.shard", range(300), now), now)
    assert {i % 3 for i in ids} == {2}  # MOD(id, 3) alone would give them all to one consumer
    shares = [storage.leases.lock_batch(LockRequest(Shard("t.mode2.shard", rank, 3), f"c{rank}", 30, now,
                                                    limit=1000)) for rank in range(3)]
    assert sorted(m.id for share in shares for m in share) == sorted(ids)  # each once
    assert all(90 <= len(share) <= 110 for share in shares), [len(share) for share in shares]
    storage.messages.insert_messages(_rows("t.mode2.shard", ["one more"], now), now)
    dues = [storage.probes.next_due(Shard("t.mode2.shard", rank, 3)) for rank in range(3)]
    assert sum(d is not None for d in dues) == 1  # the probe uses the same shard rule
