"""The pull size of a QUEUE runner: fixed when a consumer names ``batch``, else following the
handler's run time (tidemq.prefetch), and what a runner on the StubBroker actually asks for."""

from __future__ import annotations

import threading

import pytest

from tests.servers import wait_until
from tidemq import Worker
from tidemq.consumer import ConsumerSpec
from tidemq.coordinators.local import LocalCoordinator
from tidemq.message import MessageType
from tidemq.prefetch import FIRST_WINDOW, HOLD_AHEAD, MOST_WINDOW, Prefetch
from tidemq.stub import StubBroker


def test_a_named_batch_stays_what_it_was_declared():
    fixed = Prefetch(slots=4, batch=40)
    for _ in range(100):
        fixed.ran(0.0001)
    assert (fixed.window, fixed.capacity, fixed.min_pull) == (40, 44, 20)
    assert fixed.average_run is None


def test_an_adaptive_window_grows_for_short_runs_up_to_the_most():
    adaptive = Prefetch(slots=1, batch=None)
    assert adaptive.window == FIRST_WINDOW
    for _ in range(200):
        adaptive.ran(0.00005)
    assert adaptive.window == MOST_WINDOW and adaptive.capacity == MOST_WINDOW + 1


def test_an_adaptive_window_holds_about_half_a_second_of_work():
    adaptive = Prefetch(slots=4, batch=None)
    for _ in range(500):
        adaptive.ran(0.02)
    assert adaptive.average_run == pytest.approx(0.02)
    assert adaptive.window == int(4 * HOLD_AHEAD / 0.02)  # 100: four slots, 20 ms each


def test_long_runs_shrink_the_window_to_one_and_it_recovers_when_runs_get_short():
    adaptive = Prefetch(slots=2, batch=None)
    for _ in range(100):
        adaptive.ran(5.0)
    assert (adaptive.window, adaptive.capacity, adaptive.min_pull) == (1, 3, 1)
    for _ in range(400):
        adaptive.ran(0.001)
    assert adaptive.window == MOST_WINDOW


def test_serial_is_one_at_a_time_whatever_it_was_given():
    serial = Prefetch(slots=8, batch=None, serial=True)
    for _ in range(100):
        serial.ran(0.00001)
    assert (serial.window, serial.capacity, serial.min_pull) == (1, 1, 1)


class _Recording(StubBroker):
    """A StubBroker that remembers how many messages each pull asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[int] = []

    def pull(self, topic, consumer, **kwargs):  # type: ignore[no-untyped-def]
        self.asked.append(kwargs.get("max_messages", 100))
        return super().pull(topic, consumer, **kwargs)


def _run(stub: StubBroker, spec: ConsumerSpec, done: callable) -> None:
    coordinator = LocalCoordinator("/prefetch")
    coordinator.start()
    worker = Worker([spec], link=stub, coordinator=coordinator, instance="w1", drain_timeout=10).start()
    try:
        wait_until(done, 30, what="the consumer to finish its messages")
    finally:
        worker.stop()
        coordinator.stop()


def test_a_consumer_with_no_options_pulls_hundreds_for_a_no_op_handler():
    stub = _Recording()
    stub.produce_many("t.fast", list(range(3000)))
    spec = ConsumerSpec("t.fast", MessageType.QUEUE, lambda message: None)  # every option at its default
    _run(stub, spec, lambda: len(stub.ids("t.fast", "SUCCESS")) == 3000)
    assert stub.asked[0] == FIRST_WINDOW
    assert max(stub.asked) > 10 * FIRST_WINDOW  # a fixed default of 16 would have asked 16 every time


def test_a_consumer_with_no_options_holds_half_a_second_of_work_for_a_slow_handler():
    stub = _Recording()
    stub.produce_many("t.slow", list(range(40)))
    release = threading.Event()
    held: list[int] = []
    ran: set[int] = set()

    def slow(message) -> None:
        release.wait(0.3)  # long against the quarter second of work a pull may hold
        ran.add(message.id)

    spec = ConsumerSpec("t.slow", MessageType.QUEUE, slow, threads=2)

    def watch() -> bool:
        done = len(stub.ids("t.slow", "SUCCESS"))
        if done >= 24:  # the first pull's 18 have run: every later pull was sized by their times
            # Leased and not yet run: a message whose handler returned stays RUNNING until its
            # ack is recorded, and its slot is free meanwhile (it does not count against the bound).
            held.append(len(set(stub.ids("t.slow", "RUNNING")) - ran))
        return done == 40

    _run(stub, spec, watch)
    release.set()
    # 0.3 s a run on two slots: a window of three, so two running and at most three waiting
    # (a fixed default would have held 18 leased whatever the handler took).
    window = int(2 * HOLD_AHEAD / 0.3)
    assert stub.asked[0] == FIRST_WINDOW and max(stub.asked[1:]) <= window
    assert held and max(held) <= 2 + window
