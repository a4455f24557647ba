"""tidemq.enqueue on SQLite, the development store: commit and rollback, unique keys, a Session."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

import tidemq
from tidemq.errors import ConfigurationError
from tidemq_broker.storages import open_storage


@pytest.fixture
def store(tmp_path):
    url = f"sqlite:///{tmp_path}/dev.sqlite3"
    storage = open_storage(url)
    storage.schema.create_schema()
    engine = create_engine(url)
    yield storage, engine
    engine.dispose()
    storage.close()


def test_only_committed_messages_exist(store):
    storage, engine = store
    with engine.connect() as conn:
        tidemq.enqueue(conn, "dev.t", {"n": 0})
        conn.rollback()
    with engine.begin() as conn:
        kept = tidemq.enqueue(conn, "dev.t", {"n": 1}, delay=60, retry=2)
        assert tidemq.enqueue(conn, "dev.t", {"n": 2}, unique_key="k") == \
            tidemq.enqueue(conn, "dev.t", {"n": 3}, unique_key="k")
    stored = storage.reads.get_message(kept)
    assert stored.retry_remaining == 2 and stored.status == tidemq.MessageStatus.NEW.value
    # No settings row: one written in the application's transaction would lock it until the
    # commit, for every broker producing to the topic. The brokers make it.
    assert storage.topics.list_topics() == []
    # The rolled-back one left nothing (SQLite even hands its id out again).
    assert storage.counts.count_by_status("dev.t") == {"dev.t": {tidemq.MessageStatus.NEW.value: 2}}


def test_a_session_and_what_is_refused(store):
    storage, engine = store
    with Session(engine) as session:
        msg_id = tidemq.enqueue(session, "dev.s", [1, 2])
        session.commit()
    assert storage.reads.get_message(msg_id).data == "[1,2]"
    with pytest.raises(ConfigurationError, match="not an Engine"):
        tidemq.enqueue(engine, "dev.s", {})
    with pytest.raises(ConfigurationError, match="takes a SQLAlchemy Connection or Session"):
        tidemq.enqueue("mysql://nowhere", "dev.s", {})
