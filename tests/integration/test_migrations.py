"""`tidemq db upgrade` from version 1, on both storages: the indexes version 2 drops are gone,
finished rows lose the lease_expire they kept, and nothing else changes."""

from __future__ import annotations

import pytest
from sqlalchemy import delete, insert, inspect, select, update

from tidemq import clock
from tidemq_broker.migrations import upgrade
from tidemq_broker.schema import SCHEMA_VERSION, message as m, schema_version as v
from tidemq_broker.storage import AckItem, LockRequest, MessageFilter, NewRow, Shard, TopicSettings
from tidemq_broker.storages import open_database, open_storage, sql_storage

DROPPED = {"idx_message_lease_token", "idx_message_status_id", "idx_message_status_lease",
           "idx_message_topic_status_id"}


@pytest.fixture(params=["sqlite", "mysql"])
def old_store(request, tmp_path):
    """A database at schema version 1: its indexes instead of today's, and a SUCCESS message
    that kept its lease_expire as version 1 did."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/v1.sqlite3"
    else:
        url = request.getfixturevalue("mariadb").create_database(f"migrate_{tmp_path.name[-12:]}".replace("-", "_"))
    db = open_database(url)
    store = sql_storage(db)
    store.schema.create_schema()
    now = clock.now()
    ids = store.messages.insert_messages([NewRow("mig", str(i), now, 0) for i in range(3)], now)
    leased = store.leases.lock_batch(LockRequest(Shard("mig"), "c", 30, now, limit=2))
    store.acks.ack([AckItem(leased[0].id, leased[0].lease_token, True)], now, "c", "b", TopicSettings)
    with db.engine.begin() as conn:
        for name, columns in (("idx_message_lease_token", "lease_token"), ("idx_message_status_id", "status, id"),
                              ("idx_message_status_lease", "status, lease_expire"),
                              ("idx_message_topic_status_id", "topic, status, id")):
            conn.exec_driver_sql(f"CREATE INDEX {name} ON {m.name} ({columns})")
        on = f" ON {m.name}" if conn.dialect.name != "sqlite" else ""
        conn.exec_driver_sql(f"DROP INDEX idx_message_topic_status_lease{on}")
        conn.exec_driver_sql("DROP TABLE tidemq_produce_request")  # version 4's table
        conn.exec_driver_sql(f"ALTER TABLE {m.name} DROP COLUMN trace_context")  # version 6's column
        conn.exec_driver_sql(f"DROP INDEX idx_message_workflow{on}")  # version 13's index, columns and table
        for column in ("deps_left", "workflow_id", "wait_mode", "deps_failed"):  # and version 12's
            conn.exec_driver_sql(f"ALTER TABLE {m.name} DROP COLUMN {column}")
        conn.exec_driver_sql("DROP TABLE tidemq_dependency")
        conn.exec_driver_sql("DROP TABLE tidemq_workflow")
        conn.exec_driver_sql(f"DROP INDEX uk_message_unique_key{on}")  # version 14's index and column
        conn.exec_driver_sql(f"ALTER TABLE {m.name} DROP COLUMN keyed_topic")
        conn.exec_driver_sql(f"CREATE UNIQUE INDEX uk_message_topic_unique_key ON {m.name} (topic, unique_key)")
        conn.execute(update(m).where(m.c.id == ids[2]).values(unique_key="k2"))  # a keyed row from before
        conn.execute(update(m).where(m.c.id == leased[0].id).values(lease_expire=clock.after(now, 30)))
        conn.execute(delete(v))
        conn.execute(insert(v).values(version=1, applied_at=now))
    yield store, db, ids, leased
    store.close()


def _indexes(db):
    return {ix["name"] for ix in inspect(db.engine).get_indexes(m.name)}


def test_upgrade_applies_version_2_once(old_store):
    store, db, ids, leased = old_store
    assert DROPPED <= _indexes(db)
    store.schema.create_schema()  # what a starting broker does: it must not claim the new version
    assert store.schema.schema_version() == 1

    applied = upgrade(store.schema)
    assert [step.split(":")[0] for step in applied] == [str(n) for n in range(2, SCHEMA_VERSION + 1)]
    assert store.schema.schema_version() == SCHEMA_VERSION
    assert not DROPPED & _indexes(db) and "idx_message_topic_status_lease" in _indexes(db)
    assert "tidemq_produce_request" in inspect(db.engine).get_table_names()
    columns = {column["name"] for column in inspect(db.engine).get_columns(m.name)}
    assert {"trace_context", "deps_left", "workflow_id", "wait_mode", "deps_failed"} <= columns
    assert {"tidemq_dependency", "tidemq_workflow"} <= set(inspect(db.engine).get_table_names())
    assert "idx_message_workflow" in _indexes(db)
    assert "keyed_topic" in columns and "uk_message_unique_key" in _indexes(db)
    assert "uk_message_topic_unique_key" not in _indexes(db)
    now = clock.now()
    # The key stored before the step is still taken: a produce with it answers the stored id.
    again = store.messages.insert_messages([NewRow("mig", "again", now, 0, unique_key="k2"),
                                            NewRow("mig", "other", now, 0, unique_key="k3")], now)
    assert again[0] == ids[2] and again[1] not in ids
    done, running, new = (store.reads.get_message(i) for i in (leased[0].id, leased[1].id, ids[2]))
    assert (done.status, done.lease_expire) == ("SUCCESS", None)
    assert running.status == "RUNNING" and running.lease_expire is not None  # a live lease is kept
    assert new.status == "NEW" and new.data == "2"
    console = store.console
    assert [msg.id for msg in console.list_page(MessageFilter(status="SUCCESS"), 10).messages] == [done.id]
    assert upgrade(store.schema) == []
    with db.engine.connect() as conn:
        assert sorted(conn.execute(select(v.c.version)).scalars()) == list(range(1, SCHEMA_VERSION + 1))


def test_a_new_database_starts_at_the_current_version(tmp_path):
    store = open_storage(f"sqlite:///{tmp_path}/new.sqlite3")
    try:
        assert upgrade(store.schema) == []
        assert store.schema.schema_version() == SCHEMA_VERSION
    finally:
        store.close()


def test_every_schema_step_has_its_sql_for_a_dba():
    """db/migrations/ repeats each step for a DBA who applies changes by hand: one file per step,
    named by its version, that records that version."""
    from pathlib import Path

    from tidemq_broker.storages.migrations import STEPS

    folder = Path(__file__).resolve().parents[2] / "db" / "migrations"
    for step in STEPS:
        [path] = folder.glob(f"{step.version:03d}_*.sql")
        assert f"VALUES ({step.version}, UTC_TIMESTAMP(3))" in path.read_text()
    assert len(list(folder.glob("*.sql"))) == len(STEPS)
