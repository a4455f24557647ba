"""Delivery semantics on real MariaDB and ZooKeeper: delays, retries, leases, cancel, batch
consumers, deduplication, dead letters, topic settings."""

from __future__ import annotations

import statistics
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import Engine, event

from tests.servers import wait_until
from tidemq import BatchConsumer, Client, Message, MessageType, Worker
from tidemq.consumer import ConsumerSpec
from tidemq.errors import DataTooLargeError
from tidemq import clock, trace
from tidemq_broker.storage import TopicSettings


def run_worker(client, topic, handler, type=MessageType.QUEUE, **options):
    spec = ConsumerSpec(topic, type, handler, **{"threads": 4, "ttr": 30, "batch": 16, **options})
    worker = Worker([spec], client=client, drain_timeout=5).start()
    wait_until(lambda: client.coordinator.consumers(topic), 10, what="consumer registration")
    return worker


def status_of(broker, msg_id):
    return broker.storage.reads.get_message(msg_id).status


def test_no_message_runs_before_its_effect_time_and_lateness_is_small(client, broker):
    ran: dict[int, float] = {}
    done = threading.Event()
    count = 120

    def handler(message: Message) -> None:
        ran[message.id] = time.time()
        if len(ran) == count:
            done.set()

    worker = run_worker(client, "delay.precise", handler)
    try:
        base = datetime.now(timezone.utc)
        wanted = {}
        for i in range(count):
            when = base + timedelta(milliseconds=300 + 17 * i)
            wanted[client.produce("delay.precise", {"i": i}, effect_time=when)] = when.timestamp()
        assert done.wait(30), f"only {len(ran)} of {count} delayed messages ran"
    finally:
        worker.stop()
    lateness_ms = [(ran[i] - wanted[i]) * 1000 for i in wanted]
    # effect_time is stored to the millisecond (truncated): allow that 1 ms, nothing more.
    assert min(lateness_ms) >= -1.0, f"a message ran {min(lateness_ms):.1f} ms early"
    print(f"\nlateness over {count} delayed messages: median {statistics.median(lateness_ms):.1f} ms, "
          f"max {max(lateness_ms):.1f} ms")


def test_delays_of_years_are_stored_and_not_delivered(client, broker):
    far = client.produce("delay.far", {"x": 1}, delay=9.9 * 365 * 86400)
    stored = broker.storage.reads.get_message(far)
    assert stored.effect_time > clock.now() + timedelta(days=3600)
    consumer = BatchConsumer("delay.far", client=client)
    assert consumer.pull(max_messages=10, wait=0.3) == []


def test_failures_follow_the_retry_schedule_then_succeed(client, broker):
    attempts: list[tuple[int, float]] = []
    done = threading.Event()

    def flaky(message: Message) -> None:
        attempts.append((message.attempt, time.monotonic()))
        if message.attempt < 3:
            raise ValueError(f"attempt {message.attempt} failed")
        done.set()

    worker = run_worker(client, "retry.schedule", flaky)
    try:
        msg_id = client.produce("retry.schedule", {}, retry=["300ms", 0.6, "1h"])
        assert done.wait(15)
        wait_until(lambda: status_of(broker, msg_id) == "SUCCESS", 10, what="SUCCESS recorded")
    finally:
        worker.stop()
    assert [a for a, _ in attempts] == [1, 2, 3]
    gaps = [b - a for (_, a), (_, b) in zip(attempts, attempts[1:])]
    assert gaps[0] >= 0.3 and gaps[1] >= 0.6, f"retried earlier than scheduled: {gaps}"
    stored = broker.storage.reads.get_message(msg_id)
    events = [e["event"] for e in trace.parse(stored.trace)]
    assert events == ["PRODUCED", "LOCKED", "RETRY", "LOCKED", "RETRY", "LOCKED", "SUCCESS"]
    assert "error=ValueError:_attempt_1_failed" in stored.trace
    assert stored.retry_remaining == 1


def test_topic_default_backoff_then_fail_is_a_dead_letter_that_can_be_requeued(client, broker):
    broker.storage.topics.save_topic(TopicSettings("retry.default", retry_count=2, retry_base=0.05, retry_max=0.2),
                                     clock.now())
    broker.topics.refresh()
    failures = []

    def always_fails(message: Message) -> None:
        failures.append(message.attempt)
        raise RuntimeError("x" * 2000)

    worker = run_worker(client, "retry.default", always_fails)
    try:
        msg_id = client.produce("retry.default", {"n": 1})  # retry=None: the topic's count (2)
        wait_until(lambda: status_of(broker, msg_id) == "FAIL", 15, what="FAIL after retries")
        stored = broker.storage.reads.get_message(msg_id)
        assert failures == [1, 2, 3] and stored.retry_remaining == 0
        fail_line = [e for e in trace.parse(stored.trace) if e["event"] == "FAIL"][0]
        assert len(fail_line["error"]) <= trace.ERROR_TEXT_LIMIT + 3
        assert client.requeue([msg_id], retry=0) == 1
        wait_until(lambda: len(failures) == 4, 10, what="the requeued message to run again")
        wait_until(lambda: status_of(broker, msg_id) == "FAIL", 10, what="FAIL again")
        assert client.requeue(topic="retry.default") == 1
        assert "REQUEUED" in broker.storage.reads.get_message(msg_id).trace
    finally:
        worker.stop()


def test_expired_lease_is_delivered_again_and_the_late_ack_is_refused(client, broker):
    msg_id = client.produce("lease.expire", {"n": 1})
    first = BatchConsumer("lease.expire", ttr=1, client=client, name="slow-consumer")
    [held] = first.pull(max_messages=1, wait=5)
    second = BatchConsumer("lease.expire", ttr=30, client=client, name="fast-consumer")
    [again] = second.pull(max_messages=1, wait=10)  # the leader returns the expired lease to NEW
    assert again.id == held.id == msg_id and again.attempt == 2
    assert first.ack(succeeded=[msg_id]).stale == [msg_id]
    assert second.ack(succeeded=[msg_id]).applied == [msg_id]
    stored = broker.storage.reads.get_message(msg_id)
    assert stored.status == "SUCCESS" and stored.trace.count("SUCCESS") == 1
    assert "lost_by=slow-consumer" in stored.trace


def test_an_abandoned_pull_is_given_back_by_the_token_its_caller_chose(client, broker):
    import uuid

    ids = client.produce_many("release.t", [{"n": n} for n in range(3)])
    token = uuid.uuid4().hex
    got = client.pull("release.t", "leaver", max_messages=10, wait=5, lease_token=token)
    assert sorted(d.id for d in got) == ids and {d.lease_token for d in got} == {token}
    assert client.release(token, "leaver") == 3  # as if the reply had never arrived
    assert client.release(token, "leaver") == 0
    again = BatchConsumer("release.t", client=client).pull(max_messages=10, wait=5)
    assert sorted(m.id for m in again) == ids and {m.attempt for m in again} == {1}
    assert "RELEASED consumer=leaver" in broker.storage.reads.get_message(ids[0]).trace


def test_touch_extends_the_lease(client, broker):
    msg_id = client.produce("lease.touch", {})
    consumer = BatchConsumer("lease.touch", ttr=2, client=client)
    [msg] = consumer.pull(max_messages=1, wait=5)
    assert msg.touch(120)
    assert broker.storage.reads.get_message(msg_id).lease_expire > clock.now() + timedelta(seconds=100)
    assert consumer.ack(succeeded=[msg_id]).applied == [msg_id]
    assert not msg.touch(120)  # finished: nothing to extend


def test_cancel_only_removes_pending_messages(client, broker):
    pending = client.produce("cancel.t", {}, delay=3600)
    running = client.produce("cancel.t", {})
    consumer = BatchConsumer("cancel.t", client=client)
    assert [m.id for m in consumer.pull(max_messages=5, wait=5)] == [running]
    assert client.cancel(pending) is True
    assert broker.storage.reads.get_message(pending) is None
    assert client.cancel(running) is False and status_of(broker, running) == "RUNNING"
    consumer.ack(succeeded=[running])
    assert client.cancel(running) is False and status_of(broker, running) == "SUCCESS"
    assert client.cancel(pending) is False


def test_batch_consumer_acks_mixed_outcomes_in_one_call(client, broker):
    ids = client.produce_many("batch.mixed", [{"n": n} for n in range(10)], retry=0)
    consumer = BatchConsumer("batch.mixed", client=client)
    got = consumer.pull(max_messages=100, wait=5)
    assert sorted(m.id for m in got) == ids
    result = consumer.ack(succeeded=ids[:7], failed={i: "bad row" for i in ids[7:]})
    assert sorted(result.applied) == ids and result.stale == []
    assert broker.storage.counts.count_by_status("batch.mixed") == {"batch.mixed": {"SUCCESS": 7, "FAIL": 3}}


def test_concurrent_duplicates_through_two_brokers_store_one_message(settings, broker):
    from tidemq_broker.server import BrokerServer

    other = BrokerServer(settings).start()
    clients = [Client(settings.__class__(**{**vars(settings), "brokers": (addr,)}))
               for addr in (broker.address, other.address)]
    try:
        results: list[int] = []
        barrier = threading.Barrier(8)

        def produce(c):
            barrier.wait()
            results.append(c.produce("dedup.t", {"who": id(c)}, unique_key="order-42"))

        threads = [threading.Thread(target=produce, args=(clients[i % 2],)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 8 and len(set(results)) == 1
        assert broker.storage.counts.count_by_status("dedup.t") == {"dedup.t": {"NEW": 1}}
    finally:
        for c in clients:
            c.close()
        other.stop(grace=1)


def test_paused_topic_accepts_but_does_not_deliver(client, broker):
    broker.storage.topics.save_topic(TopicSettings("paused.t", paused=True), clock.now())
    broker.topics.refresh()
    msg_id = client.produce("paused.t", {})
    consumer = BatchConsumer("paused.t", client=client)
    assert consumer.pull(max_messages=5, wait=0.5) == []
    broker.storage.topics.save_topic(TopicSettings("paused.t", paused=False), clock.now())
    broker.topics.refresh()
    assert [m.id for m in consumer.pull(max_messages=5, wait=5)] == [msg_id]


def test_topic_max_data_size_is_enforced_by_the_broker(client, broker):
    broker.storage.topics.save_topic(TopicSettings("small.t", max_data_bytes=64), clock.now())
    broker.topics.refresh()
    with pytest.raises(DataTooLargeError, match="limit is 64 bytes"):
        client.produce("small.t", "y" * 100)
    assert client.produce("small.t", "ok")


def test_idle_waiting_consumers_cost_the_broker_a_fixed_rate_of_queries(client, broker):
    statements = []
    listener = lambda *args: statements.append(time.monotonic())  # noqa: E731
    stop = threading.Event()

    def waiting_consumer(n):
        consumer = BatchConsumer(f"idle.t{n % 3}", client=client, name=f"idle-{n}")
        while not stop.is_set():
            consumer.pull(max_messages=10, wait=10)

    threads = [threading.Thread(target=waiting_consumer, args=(n,)) for n in range(12)]
    for t in threads:
        t.start()
    # Every pull asleep at the broker: the count below starts after their own lookups (a pull
    # registers before its lookups, so that no commit between them goes unnoticed).
    wait_until(lambda: sum(broker.hub.waiting(f"idle.t{k}", asleep=True) for k in range(3)) == 12, 15,
               what="12 sleeping pulls")
    # Every engine of the process: the broker's storage is the only one working meanwhile.
    event.listen(Engine, "before_cursor_execute", listener)
    try:
        window = 4.0
        time.sleep(window)
        rate = len(statements) / window
    finally:
        event.remove(Engine, "before_cursor_execute", listener)
        stop.set()
        client.produce_many("idle.t0", [{}] * 1)
        client.produce_many("idle.t1", [{}] * 1)
        client.produce_many("idle.t2", [{}] * 1)
        for t in threads:
            t.join(15)
    # The broker's shared probes: recent inserts every 20 ms (50/s) and the earliest due time
    # once a second, whatever the number of waiting pulls; 12 pulls each polling that often
    # would be 600/s, and each waiting pull itself issues nothing while it sleeps.
    assert rate < 58, f"{rate:.1f} statements/s from an idle broker with 12 waiting pulls"
