"""Transactional enqueue on real MariaDB, delivered by a real broker found through ZooKeeper:
the message exists if and only if the application's transaction commits, through a SQLAlchemy
Connection, an ORM Session or a plain PyMySQL connection."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pymysql
import pytest
from sqlalchemy import Column, Integer, String, create_engine, make_url, text
from sqlalchemy.orm import DeclarativeBase, Session

import tidemq
from tests.background import InThread
from tests.servers import INNODB_TRX_POLL, LOCK_WAITS, wait_until
from tidemq import BatchConsumer, Message, MessageType, Worker, clock
from tidemq.consumer import ConsumerSpec
from tidemq.errors import ConfigurationError, DataTooLargeError, InvalidDelayError, InvalidTopicError
from tidemq_broker.pulls import PullHub, long_poll
from tidemq_broker.storage import LockRequest, NewRow, Shard, TopicSettings
from tidemq_broker.storages import open_storage


class Base(DeclarativeBase):
    pass


class Order(Base):
    """The application's own table, in the same database as tidemq's."""

    __tablename__ = "app_order"
    id = Column(Integer, primary_key=True, autoincrement=True)
    item = Column(String(100), nullable=False)


@pytest.fixture
def app_engine(mysql_url):
    """The application's engine on tidemq's database, at the server's default isolation."""
    engine = create_engine(mysql_url)
    Base.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM app_order"))
    yield engine
    Base.metadata.drop_all(engine)
    engine.dispose()


@pytest.fixture
def pymysql_connect(mysql_url):
    url = make_url(mysql_url)
    opened = []

    def connect(**options):
        conn = pymysql.connect(host=url.host, port=url.port, user=url.username, password=url.password or "",
                               database=url.database, charset="utf8mb4", **options)
        opened.append(conn)
        return conn

    yield connect
    for conn in opened:
        conn.close()


class Received:
    """A worker on ``topic`` recording what its handler got."""

    def __init__(self, client, topic: str) -> None:
        self.messages: dict[int, Message] = {}
        self.at: dict[int, object] = {}
        spec = ConsumerSpec(topic, MessageType.QUEUE, self._handle, threads=2, ttr=30, batch=8)
        self.worker = Worker([spec], client=client, drain_timeout=5).start()
        wait_until(lambda: client.coordinator.consumers(topic), 10, what="consumer registration")

    def _handle(self, message: Message) -> None:
        self.at[message.id] = clock.now()
        self.messages[message.id] = message

    def wait_for(self, msg_id: int, timeout: float = 20) -> Message:
        wait_until(lambda: msg_id in self.messages, timeout, what=f"delivery of message {msg_id}")
        return self.messages[msg_id]


@pytest.fixture
def received(client, broker):
    workers = []

    def start(topic: str) -> Received:
        workers.append(Received(client, topic))
        return workers[-1]

    yield start
    for r in workers:
        r.worker.stop()


def _orders(engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(text("SELECT item FROM app_order ORDER BY id")).scalars())


def test_rollback_stores_and_delivers_nothing_commit_is_delivered(app_engine, client, broker, received):
    consumer = BatchConsumer("enq.rollback", client=client)
    with app_engine.connect() as conn:
        conn.execute(text("INSERT INTO app_order (item) VALUES ('lost')"))
        gone = tidemq.enqueue(conn, "enq.rollback", {"order": "lost"})
        conn.rollback()
    assert broker.storage.reads.get_message(gone) is None
    assert consumer.pull(max_messages=10, wait=1.0) == []  # a long-poll: returns at once if anything came

    worker = received("enq.commit")
    with app_engine.begin() as conn:
        conn.execute(text("INSERT INTO app_order (item) VALUES ('kept')"))
        kept = tidemq.enqueue(conn, "enq.commit", {"order": "kept"})
        assert broker.storage.reads.get_message(kept) is None  # not visible before the commit
    assert worker.wait_for(kept).data == {"order": "kept"}
    assert _orders(app_engine) == ["kept"]
    wait_until(lambda: broker.storage.reads.get_message(kept).status == tidemq.MessageStatus.SUCCESS.value, 10,
               what="the ack")


def test_a_delayed_enqueue_runs_at_its_time_not_at_the_commit(app_engine, client, broker, received):
    worker = received("enq.delay")
    with app_engine.begin() as conn:
        msg_id = tidemq.enqueue(conn, "enq.delay", {"close": 1}, delay=0.8, retry=[1, "2m"])
    stored = broker.storage.reads.get_message(msg_id)
    assert stored.retry_remaining == 2 and stored.retry_schedule == [1.0, 120.0]
    assert stored.effect_time > clock.now()
    worker.wait_for(msg_id)
    assert worker.at[msg_id] >= stored.effect_time - timedelta(milliseconds=1)


def test_the_topic_defaults_and_limits_apply_as_for_produce(app_engine, broker):
    broker.storage.topics.save_topic(TopicSettings("enq.small", retry_count=7, max_data_bytes=20), clock.now())
    with app_engine.begin() as conn:
        msg_id = tidemq.enqueue(conn, "enq.small", "short")
        with pytest.raises(DataTooLargeError, match="limit is 20 bytes"):
            tidemq.enqueue(conn, "enq.small", "x" * 30)
    assert broker.storage.reads.get_message(msg_id).retry_remaining == 7


def test_key_and_priority_are_stored_as_produce_stores_them(app_engine, broker):
    with app_engine.begin() as conn:
        urgent = tidemq.enqueue(conn, "enq.flow", {"n": 1}, key="customer-42", priority=9)
        plain = tidemq.enqueue(conn, "enq.flow", {"n": 2})
        with pytest.raises(tidemq.ValidationError, match="from 0 to 9"):
            tidemq.enqueue(conn, "enq.flow", {}, priority=10)
    stored = {m.id: m for m in (broker.storage.reads.get_message(urgent), broker.storage.reads.get_message(plain))}
    assert (stored[urgent].priority, stored[urgent].flow_key) == (9, "customer-42")
    assert (stored[plain].priority, stored[plain].flow_key) == (0, None)


def test_refused_input_leaves_the_transaction_usable_and_stores_nothing(app_engine, broker):
    with app_engine.begin() as conn:
        conn.execute(text("INSERT INTO app_order (item) VALUES ('a')"))
        with pytest.raises(InvalidTopicError, match=r"\[A-Za-z0-9._:-\]"):
            tidemq.enqueue(conn, "bad topic!", {})
        with pytest.raises(InvalidDelayError, match="10 years"):
            tidemq.enqueue(conn, "enq.bad", {}, delay=-1)
        with pytest.raises(InvalidDelayError, match="not both"):
            tidemq.enqueue(conn, "enq.bad", {}, delay=1, effect_time=clock.now())
        with pytest.raises(tidemq.InvalidDataError, match="JSON"):
            tidemq.enqueue(conn, "enq.bad", {"x": float("nan")})
        with pytest.raises(DataTooLargeError, match="the limit is 1048576 bytes"):
            tidemq.enqueue(conn, "enq.bad", "x" * (1024 * 1024 + 1))
        conn.execute(text("INSERT INTO app_order (item) VALUES ('b')"))
        good = tidemq.enqueue(conn, "enq.bad", {"ok": True})
    assert _orders(app_engine) == ["a", "b"]
    assert broker.storage.counts.count_by_status("enq.bad") == {"enq.bad": {tidemq.MessageStatus.NEW.value: 1}}
    assert broker.storage.reads.get_message(good).data == '{"ok":true}'
    with pytest.raises(ConfigurationError, match="not an Engine"):
        tidemq.enqueue(app_engine, "enq.bad", {})


def test_a_unique_key_returns_the_stored_id_within_and_across_transactions(app_engine, broker):
    with app_engine.begin() as conn:
        first = tidemq.enqueue(conn, "enq.key", {"n": 1}, unique_key="order-1")
        assert tidemq.enqueue(conn, "enq.key", {"n": 2}, unique_key="order-1") == first
    with app_engine.begin() as conn:
        assert tidemq.enqueue(conn, "enq.key", {"n": 3}, unique_key="order-1") == first
    assert broker.storage.reads.get_message(first).data == '{"n":1}'
    # A REPEATABLE READ snapshot taken before another transaction stored the key: the insert
    # still meets the committed row (inserts check keys against the latest version).
    with app_engine.execution_options(isolation_level="REPEATABLE READ").connect() as old:
        assert old.execute(text("SELECT COUNT(*) FROM app_order")).scalar() == 0  # the snapshot
        with app_engine.begin() as conn:
            second = tidemq.enqueue(conn, "enq.key", {"n": 4}, unique_key="order-2")
        assert tidemq.enqueue(old, "enq.key", {"n": 5}, unique_key="order-2") == second
        old.commit()
    assert broker.storage.reads.get_message(second).data == '{"n":4}'


@pytest.mark.parametrize("first_commits", [True, False])
def test_concurrent_transactions_with_one_key_store_one_message(app_engine, broker, first_commits):
    """The second transaction waits on the key until the first ends: it then gets the first's
    id (commit) or stores its own (rollback). Never two rows, never a deadlock."""
    isolation = app_engine.execution_options(isolation_level="READ COMMITTED")
    with isolation.connect() as one, isolation.connect() as two:
        first = tidemq.enqueue(one, "enq.race", {"by": 1}, unique_key="k")
        second = InThread(lambda: (tidemq.enqueue(two, "enq.race", {"by": 2}, unique_key="k"), two.commit())[0])
        wait_until(lambda: _lock_waits(app_engine) >= 1, 10, INNODB_TRX_POLL,
                   what="the second transaction to wait on the key")
        assert second.is_alive()
        one.commit() if first_commits else one.rollback()
        got = second.value()
    stored = broker.storage.counts.count_by_status("enq.race")["enq.race"]
    assert stored == {tidemq.MessageStatus.NEW.value: 1}
    if first_commits:
        assert got == first and broker.storage.reads.get_message(first).data == '{"by":1}'
    else:
        assert got != first and broker.storage.reads.get_message(got).data == '{"by":2}'


def _lock_waits(engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(LOCK_WAITS)).scalar())


def test_an_orm_session_commits_the_order_and_its_delayed_close_together(app_engine, client, broker, received):
    worker = received("order.close.session")
    with Session(app_engine) as session:
        session.add(Order(item="dropped"))
        dropped = tidemq.enqueue(session, "order.close.session", {"item": "dropped"})
        session.rollback()
    with Session(app_engine) as session:
        order = Order(item="book")
        session.add(order)
        session.flush()
        msg_id = tidemq.enqueue(session, "order.close.session", {"order_id": order.id}, delay=0.3)
        session.commit()
        order_id = order.id
    assert broker.storage.reads.get_message(dropped) is None
    assert worker.wait_for(msg_id).data == {"order_id": order_id}
    assert _orders(app_engine) == ["book"]
    assert dropped not in worker.messages


def test_a_plain_pymysql_connection(pymysql_connect, app_engine, client, broker, received):
    worker = received("enq.pymysql")
    conn = pymysql_connect(autocommit=False)
    with conn.cursor() as cur:
        cur.execute("INSERT INTO app_order (item) VALUES ('rolled back')")
    gone = tidemq.enqueue(conn, "enq.pymysql", {"n": 0})
    conn.rollback()
    with conn.cursor() as cur:
        cur.execute("INSERT INTO app_order (item) VALUES ('pen')")
    msg_id = tidemq.enqueue(conn, "enq.pymysql", {"n": 1}, unique_key="pen")
    assert tidemq.enqueue(conn, "enq.pymysql", {"n": 2}, unique_key="pen") == msg_id
    conn.commit()
    assert worker.wait_for(msg_id).data == {"n": 1}
    assert broker.storage.reads.get_message(gone) is None and _orders(app_engine) == ["pen"]

    auto = pymysql_connect(autocommit=True)
    with pytest.raises(ConfigurationError, match="autocommit"):
        tidemq.enqueue(auto, "enq.pymysql", {})
    auto.begin()
    late = tidemq.enqueue(auto, "enq.pymysql", {"n": 3})
    auto.commit()
    assert worker.wait_for(late).data == {"n": 3}


def test_a_waiting_pull_learns_of_a_commit_that_came_after_a_higher_id(mysql_url, app_engine):
    """The enqueue's id is older than a message committed meanwhile; only the hub's watch of
    recent inserts (not a high-water mark, not the slow re-checks, disabled here) can see it."""
    storage = open_storage(mysql_url)
    hub = PullHub(storage.probes, probe_interval=0.02, recheck=60, earliest_every=10**9)
    hub.start()
    topic = "enq.gap"
    attempts: list[int] = []
    committed = threading.Event()

    def attempt():
        attempts.append(1)
        return storage.leases.lock_batch(LockRequest(Shard(topic), "c", 30, clock.now(),
                                                     limit=10)) if committed.is_set() else []

    try:
        poll = InThread(long_poll, hub, time.monotonic() + 30, attempt, lambda: None, topic)
        # The watch's first look wakes every pull (it knows nothing yet): the second attempt.
        wait_until(lambda: len(attempts) >= 2 and hub._waiters.get(topic), 10, what="the pull to wait again")
        with app_engine.connect() as conn:
            enqueued = tidemq.enqueue(conn, topic, {"late": True})
            higher = storage.messages.insert_messages([NewRow("enq.other", "{}", clock.now(), 0)], clock.now())[0]
            assert higher > enqueued
            wait_until(lambda: hub._inserts.gaps >= 1, 10, what="the watch to pass over the uncommitted id")
            committed.set()
            conn.commit()
            found = poll.value(30)
        assert [m.id for m in found] == [enqueued]
    finally:
        hub.stop()
        storage.close()


def test_the_checkout_example_commits_an_order_with_its_delayed_close_or_neither(mysql_url, broker):
    from tidemq_examples import checkout

    engine = create_engine(mysql_url)
    checkout.metadata.create_all(engine)
    try:
        with pytest.raises(ValueError, match="needs an item"), engine.begin() as conn:
            checkout.place_order(conn, "lamp")
            checkout.place_order(conn, " ")  # fails after the first order and its close: both roll back
        with engine.begin() as conn:
            order_id, message_id = checkout.place_order(conn, "book")
        with engine.connect() as conn:
            assert list(conn.execute(text("SELECT id, item FROM example_order"))) == [(order_id, "book")]
        stored = broker.storage.reads.get_message(message_id)
        assert stored.data == f'{{"order_id":{order_id}}}' and stored.topic == "example.order.close"
        assert stored.effect_time > clock.now() + timedelta(seconds=checkout.PAYMENT_WINDOW - 60)
        assert broker.storage.counts.count_by_status("example.order.close")["example.order.close"] == {
            tidemq.MessageStatus.NEW.value: 1}
    finally:
        checkout.metadata.drop_all(engine)
        engine.dispose()


def test_a_truncate_under_a_running_broker_does_not_hide_the_next_commits(app_engine, client, broker):
    """TRUNCATE resets the ids below the insert watch's mark; the watch must notice and start
    again, or the next enqueued messages wait for a pull's slow re-check (10 s)."""
    waiting = BatchConsumer("enq.before", client=client)
    first = InThread(lambda: waiting.pull(max_messages=1, wait=30.0))  # the watch looks while a pull waits
    wait_until(lambda: broker.hub._waiters.get("enq.before"), 10, what="a waiting pull")
    top = max(client.produce_many("enq.other", [{"n": i} for i in range(50)]))
    wait_until(lambda: (broker.hub._inserts._mark or 0) >= top, 10, what="the watch to pass the produced ids")
    with app_engine.begin() as conn:
        conn.execute(text("TRUNCATE TABLE tidemq_message"))
    consumer = BatchConsumer("enq.after", client=client)
    for n in range(3):  # one after another, as the bug was seen: each must be found
        pull = InThread(lambda: consumer.pull(max_messages=1, wait=30.0))
        wait_until(lambda: broker.hub._waiters.get("enq.after"), 10, what="the pull to wait")
        with app_engine.begin() as conn:
            msg_id = tidemq.enqueue(conn, "enq.after", {"n": n})
        assert msg_id < top  # the counter went back
        committed = time.monotonic()
        [got] = pull.value(30)
        # A functional bound (the watch looks every 20 ms), far from a timing promise: without
        # the restart the pull waits for its 10 s re-check.
        assert got.id == msg_id and time.monotonic() - committed < 5.0
        consumer.ack(succeeded=[got.id])
    client.produce("enq.before", {})
    assert len(first.value(30)) == 1


def test_an_open_enqueue_transaction_holds_up_no_other_message_of_its_topic(app_engine, client, broker):
    """The open transaction's new row is locked until it commits; locks pass over it without
    waiting, deliver what was committed around it, and deliver it once it commits."""
    consumer = BatchConsumer("enq.open", client=client)
    with app_engine.connect() as conn:
        held = tidemq.enqueue(conn, "enq.open", {"held": True})  # uncommitted: its row is locked
        produced = client.produce("enq.open", {"produced": True})
        assert produced > held  # committed after a lower id that is still open
        began = time.monotonic()
        got = consumer.pull(max_messages=10, wait=20.0)
        # Functional bound: before, the lock waited for the open transaction (here held open
        # until after the pull returns) or for innodb_lock_wait_timeout.
        assert [m.id for m in got] == [produced] and time.monotonic() - began < 5.0
        consumer.ack(succeeded=[produced])
        conn.commit()
    [late] = consumer.pull(max_messages=10, wait=20.0)
    assert late.id == held


def test_a_row_another_transaction_holds_is_passed_over_then_delivered(app_engine, client, broker):
    """An enqueue whose unique key matches a stored message locks that row until the
    application commits: the lock skips it instead of waiting, and takes it afterwards."""
    first = client.produce("enq.keyed", {"n": 1}, unique_key="same")
    other = client.produce("enq.keyed", {"n": 2})
    consumer = BatchConsumer("enq.keyed", client=client)
    with app_engine.connect() as conn:
        assert tidemq.enqueue(conn, "enq.keyed", {"n": 3}, unique_key="same") == first  # locks row `first`
        began = time.monotonic()
        got = consumer.pull(max_messages=10, wait=20.0)
        assert [m.id for m in got] == [other] and time.monotonic() - began < 5.0
        conn.rollback()
    [again] = consumer.pull(max_messages=10, wait=20.0)
    assert again.id == first
