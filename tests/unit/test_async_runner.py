"""``async def`` handlers in the consumer runners, against StubBroker and the in-process
coordinator: concurrency on one event loop, retries, heartbeats, drain, broadcasts. No servers."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import signal
import threading
import time
import uuid

import pytest

from tests.servers import wait_until
from tidemq import ConfigurationError, Worker
from tidemq.consumer import ConsumerSpec, clear_registry, mq_consumer, registered_consumers
from tidemq.coordinators.local import LocalCoordinator
from tidemq.lifecycle import MessageStatus
from tidemq.message import MessageType
from tidemq.prefetch import Prefetch
from tidemq.stub import StubBroker

NEW, RUNNING, SUCCESS, FAIL = (MessageStatus.NEW.value, MessageStatus.RUNNING.value, MessageStatus.SUCCESS.value,
                               MessageStatus.FAIL.value)


class Gate:
    """Opened from the test's thread, awaited by handlers on the worker's loop."""

    def __init__(self) -> None:
        self._future: concurrent.futures.Future[None] = concurrent.futures.Future()

    def open(self) -> None:
        self._future.set_result(None)

    async def wait(self) -> None:
        await asyncio.wrap_future(self._future)


@pytest.fixture
def stub():
    return StubBroker()


@pytest.fixture
def coordinator():
    made = LocalCoordinator(f"/test-{uuid.uuid4().hex[:8]}")
    made.start()
    yield made
    made.stop()


@pytest.fixture
def workers(stub, coordinator):
    started = []

    def start(specs, instance: str = "w1", **options) -> Worker:
        options.setdefault("drain_timeout", 10)
        worker = Worker(specs, link=stub, coordinator=coordinator, instance=instance, **options).start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def test_concurrency_handlers_run_at_once_on_one_event_loop_thread_and_all_succeed(stub, workers):
    topic = "t.async"
    gate = Gate()
    running, peak, threads, done = [0], [0], set(), []

    async def handler(message) -> None:
        running[0] += 1  # one loop thread: no lock needed, which is the point
        peak[0] = max(peak[0], running[0])
        threads.add(threading.current_thread().name)
        await gate.wait()
        await asyncio.sleep(0)
        running[0] -= 1
        done.append(message.id)

    ids = [stub.produce(topic, n) for n in range(40)]
    workers([ConsumerSpec(topic, MessageType.QUEUE, handler, ttr=30, batch=4, concurrency=8)])
    # Eight handlers waiting at the gate at once, four more prefetched: the bound is concurrency + batch.
    wait_until(lambda: running[0] == 8, 10, what="eight handlers running at once")
    wait_until(lambda: len(stub.ids(topic, RUNNING)) == 12, 10, what="eight running and four prefetched")
    gate.open()
    wait_until(lambda: len(stub.ids(topic, SUCCESS)) == 40, 20, what="every message to succeed")
    assert sorted(done) == ids
    assert peak[0] == 8
    assert threads == {"tidemq-loop"}  # the worker's one loop, not a thread per handler


def test_a_failing_async_handler_is_retried_then_recorded_as_fail_with_its_error(stub, workers):
    topic = "t.async.retry"
    attempts: dict[int, list[int]] = {}

    async def handler(message) -> None:
        attempts.setdefault(message.id, []).append(message.attempt)
        if message.data["fail"] or message.attempt == 1:
            raise ValueError(f"attempt {message.attempt} failed")

    stub.set_topic(topic, retry_base=0.0)  # the backoff of a retry count: none
    recovers = stub.produce(topic, {"fail": False}, retry=1)
    dead = stub.produce(topic, {"fail": True}, retry=2)
    workers([ConsumerSpec(topic, MessageType.QUEUE, handler, ttr=30, batch=2, concurrency=2)])
    wait_until(lambda: stub.status(recovers) == SUCCESS and stub.status(dead) == FAIL, 10,
               what="one recovered, one dead")
    assert attempts[recovers] == [1, 2]
    assert attempts[dead] == [1, 2, 3]  # two retries, then FAIL
    assert stub.message(dead).error == "ValueError: attempt 3 failed"


def test_heartbeats_keep_a_long_async_handler_s_lease_and_atouch_lengthens_it(stub, workers):
    topic = "t.async.beat"
    gate = Gate()
    touched = []

    async def handler(message) -> None:
        touched.append(await message.atouch(120))  # off the loop, on an executor thread
        await gate.wait()

    msg_id = stub.produce(topic, 1)
    workers([ConsumerSpec(topic, MessageType.QUEUE, handler, ttr=0.6, batch=1, concurrency=1)])
    wait_until(lambda: stub.message(msg_id).extended >= 4, 10, what="four heartbeats")
    assert stub.expire_leases() == []  # four beats of 0.2 s: past its 0.6 s ttr, still held
    assert touched == [True]
    # Later beats keep the 120 s the handler asked for instead of shortening it back to 0.6 s.
    assert stub.message(msg_id).lease_expire - stub.clock() > 100
    gate.open()
    wait_until(lambda: stub.status(msg_id) == SUCCESS, 10, what="the message to succeed")
    assert stub.message(msg_id).attempt == 1


def test_sigterm_drains_async_handlers_their_acks_land_before_run_returns(stub, coordinator):
    if threading.current_thread() is not threading.main_thread():
        pytest.fail("Worker.run() sets signal handlers: this test must run in the main thread")
    topic = "t.async.drain"
    started, finished = threading.Event(), []
    worker: Worker

    async def handler(message) -> None:
        if len(started_ids) == 3:
            started.set()
        started_ids.append(message.id)
        while worker.runners:  # still running once the worker has begun to stop
            await asyncio.sleep(0.01)
        finished.append(message.id)

    started_ids: list[int] = []
    ids = [stub.produce(topic, n) for n in range(4)]
    worker = Worker([ConsumerSpec(topic, MessageType.QUEUE, handler, ttr=30, batch=1, concurrency=4)],
                    link=stub, coordinator=coordinator, instance="w1", drain_timeout=10)

    def terminate() -> None:
        if started.wait(10):
            os.kill(os.getpid(), signal.SIGTERM)

    timer = threading.Thread(target=terminate, daemon=True)
    timer.start()
    worker.run()
    timer.join(5)
    assert sorted(finished) == ids  # all four were running at the SIGTERM, and finished
    assert [stub.status(i) for i in ids] == [SUCCESS] * 4  # acked before run() returned
    assert coordinator.consumers(topic) == []


def test_a_drain_out_of_time_cancels_async_handlers_and_gives_their_messages_back(stub, workers):
    topic = "t.async.stuck"
    cancelled = []

    async def handler(message) -> None:
        try:
            await asyncio.Event().wait()  # never set: only cancellation ends it
        except asyncio.CancelledError:
            cancelled.append(message.id)
            raise

    msg_id = stub.produce(topic, 1)
    worker = workers([ConsumerSpec(topic, MessageType.QUEUE, handler, ttr=30, batch=1, concurrency=1)],
                     drain_timeout=0.3)
    wait_until(lambda: stub.status(msg_id) == RUNNING, 10, what="the handler to start")
    token = stub.message(msg_id).lease_token
    worker.stop()
    assert cancelled == [msg_id]
    assert stub.status(msg_id) == NEW  # released, not left RUNNING until its 30 s lease expires
    assert (token, 1) in stub.releases
    assert stub.message(msg_id).attempt == 0  # the given-back run does not count as an attempt


def test_an_async_serial_consumer_runs_one_at_a_time_in_order(stub, workers):
    topic = "t.async.serial"
    runs, running, peak = [], [0], [0]

    async def handler(message) -> None:
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        await asyncio.sleep(0.005)
        runs.append(message.id)
        running[0] -= 1

    ids = [stub.produce(topic, n) for n in range(6)]
    workers([ConsumerSpec(topic, MessageType.SERIAL_QUEUE, handler, ttr=30, batch=1, concurrency=1)])
    wait_until(lambda: len(stub.ids(topic, SUCCESS)) == 6, 10, what="every serial message")
    assert runs == ids and peak[0] == 1


def test_an_async_broadcast_handler_receives_every_broadcast_in_order(workers, coordinator):
    topic = "t.async.topic"
    got = []

    async def handler(message) -> None:
        await asyncio.sleep(0)
        got.append(message.data)

    worker = workers([ConsumerSpec(topic, MessageType.TOPIC, handler)])
    wait_until(lambda: coordinator.consumers(topic), 5, what="the TOPIC consumer registered")
    for n in range(20):
        coordinator.broadcast(topic, json.dumps({"data": n, "sent_at": int(time.time() * 1000)}).encode())
    wait_until(lambda: len(got) == 20, 10, what="twenty broadcasts")
    assert got == list(range(20))
    assert worker.runners[0].succeeded == 20


def test_a_def_broadcast_handler_beside_an_async_consumer_runs_on_its_own_thread(workers, coordinator):
    topic, threads = "t.mixed.topic", []

    def handler(message) -> None:  # a def handler: never on the event loop's thread
        threads.append(threading.current_thread().name)

    async def other(message) -> None:
        await asyncio.sleep(0)

    worker = workers([ConsumerSpec(topic, MessageType.TOPIC, handler),
                      ConsumerSpec("t.mixed.queue", MessageType.QUEUE, other, ttr=30, batch=4, concurrency=4)])
    wait_until(lambda: coordinator.consumers(topic), 5, what="the TOPIC consumer registered")
    for n in range(5):
        coordinator.broadcast(topic, json.dumps({"data": n, "sent_at": int(time.time() * 1000)}).encode())
    runner = next(r for r in worker.runners if r.spec.topic == topic)
    wait_until(lambda: runner.succeeded + runner.failed == 5, 10, what="five broadcasts handled")
    assert runner.succeeded == 5 and runner.failed == 0
    assert threads == [f"tidemq-broadcast-{topic}"] * 5


def test_mq_consumer_takes_concurrency_for_async_handlers_and_threads_for_def_handlers():
    clear_registry()
    try:
        @mq_consumer("t.decl", concurrency=50)
        async def fast(message) -> None:
            pass

        @mq_consumer("t.decl.default")
        async def plain(message) -> None:
            pass

        @mq_consumer("t.decl.serial", type="SERIAL_QUEUE")
        async def serial(message) -> None:
            pass

        with pytest.raises(ConfigurationError, match="concurrency=4, not threads"):
            mq_consumer("t.decl", threads=4)(fast)
        with pytest.raises(ConfigurationError, match="concurrency is for async def handlers"):
            mq_consumer("t.decl", concurrency=4)(lambda m: None)
        with pytest.raises(ConfigurationError, match="between 1 and 10000"):
            mq_consumer("t.decl", concurrency=0)
        specs = {s.topic: s for s in registered_consumers()}
        assert specs["t.decl"].is_async and specs["t.decl"].slots == 50 and specs["t.decl"].batch is None
        assert specs["t.decl.default"].slots == 16  # neither the decorator nor the worker said
        assert specs["t.decl.serial"].slots == 1
        # `tidemq worker --concurrency` fills in only what the decorator left open.
        worker = Worker(list(specs.values()), link=StubBroker(), coordinator=LocalCoordinator("/x"), concurrency=3)
        slots = {s.topic: s.slots for s in worker.specs}
        assert slots == {"t.decl": 50, "t.decl.default": 3, "t.decl.serial": 1}
        # ... and a larger --concurrency first pulls as many at a time as it runs (serial stays at one).
        wide = Worker(list(specs.values()), link=StubBroker(), coordinator=LocalCoordinator("/x"), concurrency=200)
        first = {s.topic: Prefetch(s.slots, s.batch, s.type is MessageType.SERIAL_QUEUE).window for s in wide.specs}
        assert first == {"t.decl": 50, "t.decl.default": 200, "t.decl.serial": 1}
        with pytest.raises(ConfigurationError, match="concurrency must be between 1 and 10000, got 0"):
            Worker([], link=StubBroker(), coordinator=LocalCoordinator("/x"), concurrency=0)
    finally:
        clear_registry()


def test_each_async_handler_s_log_lines_name_its_own_message_while_others_interleave(stub, workers):
    import logging

    from tidemq.logs import JsonFormatter

    topic = "t.async.logs"
    lines: list[dict] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:  # formatted in the task that logged
            lines.append(json.loads(JsonFormatter().format(record)))

    logger = logging.getLogger("tests.async.logs")
    collect = Collect()
    logger.addHandler(collect)
    logger.setLevel(logging.INFO)

    async def handler(message) -> None:
        logger.info("before %d", message.id)
        await asyncio.sleep(0.02)  # the other handlers log meanwhile
        logger.info("after %d", message.id)

    try:
        ids = [stub.produce(topic, n) for n in range(10)]
        workers([ConsumerSpec(topic, MessageType.QUEUE, handler, ttr=30, batch=10, concurrency=10)])
        wait_until(lambda: len(stub.ids(topic, SUCCESS)) == 10, 10, what="every message")
    finally:
        logger.removeHandler(collect)
    assert len(lines) == 20
    assert all(line["message_id"] == int(line["message"].split()[1]) and line["topic"] == topic for line in lines)
    assert [line["message"].split()[0] for line in lines[:10]] == ["before"] * 10  # they did interleave
    assert sorted({line["message_id"] for line in lines}) == ids


def test_one_worker_runs_threaded_and_async_consumers_side_by_side(stub, workers):
    ran: dict[str, list[int]] = {"def": [], "async": []}

    def threaded(message) -> None:
        ran["def"].append(message.id)

    async def coroutine(message) -> None:
        await asyncio.sleep(0)
        ran["async"].append(message.id)

    plain = [stub.produce("t.mixed.def", n) for n in range(10)]
    awaited = [stub.produce("t.mixed.async", n) for n in range(10)]
    workers([ConsumerSpec("t.mixed.def", MessageType.QUEUE, threaded, threads=2, ttr=30, batch=4),
             ConsumerSpec("t.mixed.async", MessageType.QUEUE, coroutine, ttr=30, batch=4, concurrency=4)])
    wait_until(lambda: len(stub.ids(status=SUCCESS)) == 20, 10, what="both consumers' messages")
    assert sorted(ran["def"]) == plain and sorted(ran["async"]) == awaited
