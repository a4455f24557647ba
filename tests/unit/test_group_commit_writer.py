"""The broker's group-commit writer, against the memory storage: batching and the isolation of a
bad request. No database, no sleeps."""

from __future__ import annotations

import threading

import pytest

from tests.background import InThread
from tests.servers import wait_until
from tidemq import clock
from tidemq.errors import TidemqError
from tidemq_broker.storage import NewRow
from tidemq_broker.storages.memory import open_memory_storage
from tidemq_broker.topics import TopicCache
from tidemq_broker.writer import GroupCommitWriter


class Gated:
    """The memory storage's message writes, each insert held at ``gate`` (when set) until it is
    opened, so requests pile up behind a commit; ``inserts`` records each insert's data."""

    def __init__(self, messages) -> None:
        self._messages = messages
        self.inserts: list[list[str]] = []
        self.gate: threading.Event | None = None
        self.inserting = threading.Event()

    def insert_messages(self, rows, now, requests=(), **who):
        self.inserting.set()
        if self.gate is not None:
            self.gate.wait(30)
        ids = self._messages.insert_messages(rows, now, requests, **who)
        self.inserts.append([row.data for row in rows])
        return ids

    def __getattr__(self, name):
        return getattr(self._messages, name)


def _rows(*datas: str) -> list[NewRow]:
    # "bad" leaves retry_remaining NULL, which the table refuses: the whole insert fails.
    return [NewRow("t.write", data, clock.now(), None if data == "bad" else 0) for data in datas]


@pytest.fixture
def storage():
    return open_memory_storage()


@pytest.fixture
def store(storage):
    return Gated(storage.messages)


def _writer(storage, store, commits, slots=1):
    return GroupCommitWriter(store, TopicCache(storage.topics), "b:1", lambda earliest, ids: commits.append(max(ids)),
                             slots=slots)


def _call(writer, rows) -> InThread:
    """One produce RPC's thread: ``writer.write(rows)``."""
    return InThread(writer.write, rows, 30)


def test_requests_that_queue_behind_a_commit_share_the_next_one(storage, store):
    commits: list[int] = []
    writer = _writer(storage, store, commits)
    store.gate = threading.Event()
    try:
        first = _call(writer, _rows("0"))
        assert store.inserting.wait(10)
        waiting = [_call(writer, _rows(f"{n}a", f"{n}b")) for n in range(1, 21)]
        wait_until(lambda: len(writer._coalescer._pending) == 20, 10)
        assert first.is_alive() and all(c.is_alive() for c in waiting)  # nothing answers before its commit
        store.gate.set()
        ids = [c.value() for c in waiting]
        assert first.value() == [1]
        assert store.inserts[0] == ["0"] and len(store.inserts) == 2  # one commit for the 20 queued
        assert sorted(store.inserts[1]) == sorted(d for n in range(1, 21) for d in (f"{n}a", f"{n}b"))
        for call, got in zip(waiting, ids):  # each caller gets its own rows' ids, in its order
            assert [store.inserts[1][i - 2] for i in got] == [row.data for row in call.args[0]]
        assert commits == [1, 41]
        assert [t.name for t in storage.topics.list_topics()] == ["t.write"]
    finally:
        store.gate.set()
        writer.stop()


def test_a_request_that_breaks_the_shared_commit_is_refused_alone(storage, store):
    writer = _writer(storage, store, [])
    store.gate = threading.Event()
    try:
        blocker = _call(writer, _rows("first"))
        assert store.inserting.wait(10)
        good1 = _call(writer, _rows("x1", "x2"))
        bad = _call(writer, _rows("y1", "bad"))
        good2 = _call(writer, _rows("z1"))
        wait_until(lambda: len(writer._coalescer._pending) == 3, 10)
        store.gate.set()
        assert blocker.value() == [1]
        assert len(good1.value()) == 2 and len(good2.value()) == 1
        with pytest.raises(TidemqError, match="column retry_remaining cannot be NULL"):
            bad.value()
        stored = [data for insert in store.inserts for data in insert]
        assert sorted(stored) == ["first", "x1", "x2", "z1"]  # nothing of the bad request, all of the others
        assert storage.counts.count_by_status() == {"t.write": {"NEW": 4}}
    finally:
        store.gate.set()
        writer.stop()


def test_a_stopped_writer_commits_what_was_queued_and_refuses_new_rows(storage, store):
    writer = _writer(storage, store, [])
    store.gate = threading.Event()
    try:
        running = _call(writer, _rows("running"))
        assert store.inserting.wait(10)
        queued = _call(writer, _rows("queued"))
        wait_until(lambda: len(writer._coalescer._pending) == 1, 10)
        writer.stop()
        with pytest.raises(TidemqError, match="shutting down"):
            writer.write(_rows("late"), timeout=1)
        store.gate.set()
        assert running.value() == [1] and queued.value() == [2]
    finally:
        store.gate.set()


def test_two_slots_commit_side_by_side_and_a_lone_request_needs_no_other_thread(storage, store):
    writer = _writer(storage, store, [], slots=2)
    assert writer.write(_rows("alone")) == [1]  # committed in this thread: nothing else runs
    store.gate = threading.Event()
    try:
        store.inserting.clear()
        a = _call(writer, _rows("a"))
        assert store.inserting.wait(10)
        store.inserting.clear()
        b = _call(writer, _rows("b"))
        assert store.inserting.wait(10)  # the second slot commits while the first is held
        c = _call(writer, _rows("c"))
        wait_until(lambda: len(writer._coalescer._pending) == 1, 10)  # no third slot: c queues
        store.gate.set()
        assert sorted(a.value() + b.value() + c.value()) == [2, 3, 4]
    finally:
        store.gate.set()
