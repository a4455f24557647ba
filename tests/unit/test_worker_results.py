"""The worker's side of results, against StubBroker and the in-process coordinator: a handler's
return value and its error reach the handle, progress travels with heartbeats, and a cancel
request stops a sync handler (message.cancelled, checkpoint) and an async one (its task)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest

from tests.servers import wait_until
from tidemq import Worker
from tidemq.consumer import ConsumerSpec
from tidemq.coordinators.local import LocalCoordinator
from tidemq.errors import InvalidResultError, MessageCancelledError, RemoteError
from tidemq.lifecycle import MessageStatus
from tidemq.message import MessageType
from tidemq.stub import StubBroker


@pytest.fixture
def stub():
    return StubBroker()


@pytest.fixture
def start(stub):
    coordinator = LocalCoordinator(f"/test-{uuid.uuid4().hex[:8]}")
    coordinator.start()
    started = []

    def run(topic, handler, ttr=3, **options) -> Worker:
        spec = ConsumerSpec(topic, MessageType.QUEUE, handler, ttr=ttr, batch=1, concurrency=2, **options)
        worker = Worker([spec], link=stub, coordinator=coordinator, drain_timeout=5).start()
        started.append(worker)
        return worker

    yield run
    for worker in started:
        worker.stop()
    coordinator.stop()


class BoomError(Exception):
    pass


def test_a_return_value_is_the_result_and_a_failure_reraises_typed_with_its_traceback(stub, start):
    def handler(message):
        if message.data == "bad":
            raise BoomError("no rows for " + message.data)
        return {"rows": message.data * 2}

    start("w.r", handler)
    ok = stub.produce("w.r", 21, result=True)
    bad = stub.produce("w.r", "bad", retry=0, result=True)
    assert ok.result(timeout=10) == {"rows": 42}
    with pytest.raises(RemoteError) as info:
        bad.result(timeout=10)
    assert info.value.type == "tests.unit.test_worker_results.BoomError"
    assert info.value.message == "no rows for bad" and "raise BoomError" in info.value.traceback
    assert bad.status() is MessageStatus.FAIL


@pytest.mark.parametrize("value, cause", [({1, 2}, "JSON-serialisable"), ("x" * 300, "the limit is 100 bytes")])
def test_a_return_value_that_is_not_json_or_too_large_fails_the_attempt_naming_the_cause(stub, start, monkeypatch,
                                                                                        value, cause):
    monkeypatch.setenv("TIDEMQ_MAX_RESULT_BYTES", "100")
    start("w.bad", lambda message: value)
    handle = stub.produce("w.bad", 1, retry=0, result=True)
    with pytest.raises(RemoteError) as info:
        handle.result(timeout=10)
    expected = "tidemq.errors.ResultTooLargeError" if "limit" in cause else "tidemq.errors.InvalidResultError"
    assert info.value.type == expected and cause in info.value.message
    assert stub.message(handle.id).status == "FAIL"


def test_progress_reaches_the_handle_and_a_sync_handler_stops_at_its_checkpoint(stub, start):
    started, seen_cancel = threading.Event(), []

    def handler(message):
        message.progress(1, 4, note="first")
        started.set()
        while not message.cancelled:
            threading.Event().wait(0.01)
        seen_cancel.append(True)
        message.checkpoint()  # raises MessageCancelledError
        return "not reached"

    start("w.c", handler, ttr=3)
    handle = stub.produce("w.c", 1, result=True)
    assert started.wait(10)
    wait_until(lambda: handle.progress() is not None, 10, what="the progress report to arrive")
    progress = handle.progress()
    assert (progress.done, progress.total, progress.note, progress.ratio) == (1, 4, "first", 0.25)
    assert handle.cancel(running=True) is True
    with pytest.raises(MessageCancelledError):
        handle.result(timeout=10)
    assert seen_cancel == [True] and handle.status() is MessageStatus.CANCELLED
    assert [event for event, id in stub.history if id == handle.id][-2:] == ["CANCEL_REQUESTED", "CANCELLED"]


def test_a_cancel_cancels_an_async_handlers_task(stub, start):
    reached = threading.Event()

    async def handler(message):
        reached.set()
        await asyncio.sleep(60)
        return "not reached"

    start("w.a", handler, ttr=3)
    handle = stub.produce("w.a", 1, result=True)
    assert reached.wait(10)
    handle.cancel(running=True)
    with pytest.raises(MessageCancelledError):
        handle.result(timeout=15)
    assert stub.status(handle.id) is MessageStatus.CANCELLED


def test_a_handler_that_completes_despite_a_cancel_request_wins_the_race(stub, start):
    release = threading.Event()
    reached = threading.Event()

    def handler(message):
        reached.set()
        release.wait(10)
        return "done anyway"

    start("w.race", handler, ttr=3)
    handle = stub.produce("w.race", 1, result=True)
    assert reached.wait(10)
    handle.cancel(running=True)
    release.set()
    assert handle.result(timeout=10) == "done anyway"
    assert handle.status() is MessageStatus.SUCCESS


def test_invalid_result_error_is_a_validation_error():
    assert issubclass(InvalidResultError, ValueError)


def test_a_message_whose_cancel_comes_while_it_waits_for_a_handler_slot_never_starts(stub):
    release, started = threading.Event(), []

    def handler(message):
        started.append(message.data)
        if message.data == "first":
            release.wait(20)
        return message.data

    coordinator = LocalCoordinator(f"/test-{uuid.uuid4().hex[:8]}")
    coordinator.start()
    spec = ConsumerSpec("w.wait", MessageType.QUEUE, handler, ttr=3, batch=1, concurrency=1, threads=1)
    worker = Worker([spec], link=stub, coordinator=coordinator, drain_timeout=5).start()
    try:
        first = stub.produce("w.wait", "first", result=True)
        wait_until(lambda: started == ["first"], 10, what="the first handler to start")
        second = stub.produce("w.wait", "second", result=True)
        wait_until(lambda: stub.status(second.id) is MessageStatus.RUNNING, 10, what="the second to be prefetched")
        beats = len(stub.extend_calls)
        assert second.cancel(running=True) is True
        # The next heartbeat (ttr/3) tells the worker; then the slot frees.
        wait_until(lambda: any(second.id in (lease.id for lease in call) for call in stub.extend_calls[beats:]), 10,
                   what="a heartbeat of the waiting message after the cancel")
        release.set()
        assert first.result(timeout=10) == "first"
        with pytest.raises(MessageCancelledError):
            second.result(timeout=10)
        assert started == ["first"]
    finally:
        worker.stop()
        coordinator.stop()


def test_a_stub_given_the_workers_coordinator_signals_a_cancel_so_a_silent_handler_stops_before_its_heartbeat():
    coordinator = LocalCoordinator(f"/test-{uuid.uuid4().hex[:8]}")
    coordinator.start()
    stub = StubBroker(coordinator=coordinator)
    running = threading.Event()

    def handler(message):
        running.set()
        while not message.cancelled:  # reports nothing: only a heartbeat tells it
            threading.Event().wait(0.01)
        message.checkpoint()

    # ttr 300: the regular heartbeat is 100 s away, past the result's timeout.
    spec = ConsumerSpec("w.signal", MessageType.QUEUE, handler, ttr=300, batch=1, concurrency=1)
    worker = Worker([spec], link=stub, coordinator=coordinator, drain_timeout=5).start()
    try:
        handle = stub.produce("w.signal", 1, result=True)
        assert running.wait(10)
        # Its short lease of a held message extended by ttr: no beat is due for 100 s.
        wait_until(lambda: stub.message(handle.id).lease_expire > time.time() + 200, 10,
                   what="the lease extended by ttr")
        beats = len(stub.extend_calls)
        assert handle.cancel(running=True) is True
        with pytest.raises(MessageCancelledError):
            handle.result(timeout=20)
        assert handle.status() is MessageStatus.CANCELLED
        assert len(stub.extend_calls) == beats + 1  # the one beat the signal brought forward
    finally:
        worker.stop()
        coordinator.stop()
