"""innodb_autoinc_lock_mode=2 (MySQL 8's default, required by Galera) with an increment of 3: a
multi-row INSERT's ids are not consecutive there, so the group commit reads them back with
RETURNING (MariaDB 10.5+) and still writes a whole group in one statement."""

from __future__ import annotations

import json
import threading

import pytest
from sqlalchemy import event

from tests.servers import MariaDB
from tidemq import clock
from tidemq_broker.storage import NewRow, RequestRef
from tidemq_broker.storages import open_storage


@pytest.fixture(scope="module")
def mode2_url():
    server = MariaDB("--innodb-autoinc-lock-mode=2", "--auto-increment-increment=3",
                     "--auto-increment-offset=2").start()
    yield server.create_database("tidemq_mode2")
    server.cleanup()


@pytest.fixture
def storage(mode2_url):
    store = open_storage(mode2_url)
    store.create_schema()
    yield store
    store.close()


def _rows(topic, datas, now):
    return [NewRow(topic, json.dumps(d), now, 0) for d in datas]


def test_a_group_is_one_insert_and_every_row_gets_its_own_id(storage):
    statements = []
    event.listen(storage.db.produce_engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    now = clock.now()
    ids = storage.insert_messages(_rows("t.mode2", range(200), now), now)
    inserts = [s for s in statements if s.startswith("INSERT INTO tidemq_message")]
    assert len(inserts) == 1 and "RETURNING" in inserts[0]  # not one statement per row
    assert len(set(ids)) == 200 and ids == sorted(ids)
    assert {i % 3 for i in ids} == {2}  # the server's own ids: offset 2, increment 3
    assert [storage.get_message(i).data for i in ids] == [json.dumps(n) for n in range(200)]
    [later] = storage.insert_messages(_rows("t.mode2", ["later"], now), now)
    assert later > ids[-1]  # a later produce gets a later id: SERIAL_QUEUE order holds


def test_concurrent_groups_interleave_ids_yet_each_row_keeps_its_own(storage):
    now = clock.now()
    answers: dict[str, int] = {}
    errors = []

    def produce(t):
        try:
            for k in range(30):
                datas = [f"{t}-{k}-{n}" for n in range(20)]
                answers.update(zip(datas, storage.insert_messages(_rows("t.mode2.mt", datas, now), now)))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(answers) == 4 * 30 * 20 and len(set(answers.values())) == len(answers)
    for data, msg_id in answers.items():
        assert json.loads(storage.get_message(msg_id).data) == data


def test_a_retried_request_gets_its_ids_back_without_consecutive_ids(storage):
    now = clock.now()
    first = storage.insert_messages(_rows("t.mode2.req", range(5), now), now, [RequestRef("call-m2", 0, 5)])
    again = storage.insert_messages(_rows("t.mode2.req", range(5), now), now, [RequestRef("call-m2", 0, 5)])
    assert again == first and storage.count_by_status("t.mode2.req") == {"t.mode2.req": {"NEW": 5}}


def test_shards_spread_a_nodes_ids_although_they_are_all_alike_modulo_the_increment(storage):
    now = clock.now()
    ids = storage.insert_messages(_rows("t.mode2.shard", range(300), now), now)
    assert {i % 3 for i in ids} == {2}  # MOD(id, 3) alone would give them all to one consumer
    shares = [storage.lock_batch("t.mode2.shard", rank, 3, 1000, 30, f"c{rank}", now) for rank in range(3)]
    assert sorted(m.id for share in shares for m in share) == sorted(ids)  # each once
    assert all(90 <= len(share) <= 110 for share in shares), [len(share) for share in shares]
    storage.insert_messages(_rows("t.mode2.shard", ["one more"], now), now)
    dues = [storage.next_due("t.mode2.shard", rank, 3) for rank in range(3)]
    assert sum(d is not None for d in dues) == 1  # the probe uses the same shard rule
