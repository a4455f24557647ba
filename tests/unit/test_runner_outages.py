"""The consumer runner while its brokers cannot serve (StubBroker.failing: as when their database
is away): outcomes are kept and sent once a broker answers, their leases are beaten meanwhile,
a stopping worker gives up at the end of its drain, and a lost ZooKeeper connection does not
stop consumption. No servers."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Optional

import pytest

from tests.servers import wait_until
from tidemq import Worker
from tidemq.consumer import ConsumerSpec
from tidemq.errors import BrokerUnavailableError
from tidemq.coordinators.local import LocalCoordinator
from tidemq.link import LeaseRef
from tidemq.message import MessageType
from tidemq.stub import StubBroker

TTR = 1.5  # heartbeats every 0.5 s


@pytest.fixture
def stub():
    return StubBroker()


@pytest.fixture
def coordinator():
    made = LocalCoordinator(f"/test-{uuid.uuid4().hex[:8]}")
    made.start()
    yield made
    made.stop()


def test_outcomes_finished_during_an_outage_are_recorded_after_it_and_run_once(stub, coordinator, caplog):
    topic = "t.outage"
    gate = threading.Event()
    runs: list[tuple[int, int]] = []

    def handler(message) -> None:
        gate.wait(20)
        runs.append((message.id, message.attempt))

    ids = [stub.produce(topic, n) for n in range(3)]
    caplog.set_level(logging.DEBUG)
    worker = Worker([ConsumerSpec(topic, MessageType.QUEUE, handler, threads=3, ttr=TTR, batch=3)], link=stub,
                    coordinator=coordinator, instance="w1", drain_timeout=10).start()
    try:
        wait_until(lambda: len(stub.ids(topic, "RUNNING")) == 3, 5, what="three handlers running")
        stub.failing = {"ack"}  # the outcomes cannot be recorded; heartbeats still reach a broker
        gate.set()
        wait_until(lambda: stub.calls["ack"] >= 3, 10, what="the acks tried and failed")
        finished = {LeaseRef(i, stub.message(i).lease_token) for i in ids}
        beats = len(stub.extend_calls)
        wait_until(lambda: len(stub.extend_calls) >= beats + 3, 10, what="three more heartbeats")
        # The finished messages' leases are still beaten, well past their 1.5 s ttr.
        assert all(finished <= set(call) for call in stub.extend_calls[beats:])
        assert stub.expire_leases() == [] and stub.ids(topic, "SUCCESS") == []
        stub.failing = set(StubBroker.CALLS)  # then nothing at all answers for a while
        tries = stub.calls["ack"]
        wait_until(lambda: stub.calls["ack"] > tries + 1, 10, what="the acks tried again")
        stub.failing = set()
        wait_until(lambda: len(stub.ids(topic, "SUCCESS")) == 3, 10, what="the kept outcomes recorded")
        assert sorted(runs) == [(i, 1) for i in ids]  # each ran once
        assert worker.runners[0].succeeded == 3 and worker.runners[0].stale == 0
    finally:
        worker.stop()
    # Retried failures are not logged one by one (the broker pool logs an outage once).
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("tidemq")]
    assert not loud, [r.getMessage() for r in loud]


def test_a_worker_whose_brokers_are_gone_leaves_its_leases_and_exits_within_its_drain(stub, coordinator, caplog):
    topic = "t.gone"
    gate = threading.Event()
    ids = [stub.produce(topic, n) for n in range(4)]
    worker = Worker([ConsumerSpec(topic, MessageType.QUEUE, lambda m: gate.wait(20), threads=2, ttr=TTR, batch=2)],
                    link=stub, coordinator=coordinator, instance="w1", drain_timeout=1.0).start()
    wait_until(lambda: len(stub.ids(topic, "RUNNING")) == 4, 5, what="two running, two prefetched")
    stub.failing = set(StubBroker.CALLS)
    gate.set()
    caplog.set_level(logging.WARNING)
    started = time.monotonic()
    worker.stop()
    took = time.monotonic() - started
    # A functional bound, not a speed figure: the drain (1 s) plus one short last call, never the
    # link's 10 s call timeout or an ack retried without end.
    assert took < 5.0, f"stop took {took:.1f} s with a 1 s drain"
    assert sorted(stub.ids(topic, "RUNNING")) == ids  # left to their leases: they run again once expired
    assert any("gave up reporting" in r.getMessage() for r in caplog.records)


def test_consumption_goes_on_while_the_coordinator_is_disconnected(stub, coordinator):
    topic = "t.zk"
    ran: list[int] = []
    worker = Worker([ConsumerSpec(topic, MessageType.QUEUE, lambda m: ran.append(m.id), threads=2, ttr=TTR, batch=4)],
                    link=stub, coordinator=coordinator, instance="w1", drain_timeout=5).start()
    try:
        first = [stub.produce(topic, n) for n in range(5)]
        wait_until(lambda: len(ran) == 5, 5, what="consuming while connected")
        # What a ZooKeeper outage looks like to the runner: the session is suspended and nothing
        # about the ranks can be learnt; it keeps its last known rank and total meanwhile.
        coordinator.suspend()
        later = [stub.produce(topic, n) for n in range(5)]
        wait_until(lambda: len(ran) == 10, 5, what="consuming while suspended")
        assert sorted(ran) == sorted(first + later)
        assert stub.pulls[-1].rank == 0 and stub.pulls[-1].total == 1
    finally:
        worker.stop()


class _ReleaseNeverAnswered(StubBroker):
    """Every broker gone for good (a whole stack stopped): a Release retries until its timeout."""

    def __init__(self) -> None:
        super().__init__()
        self.release_timeouts: list[Optional[float]] = []

    def release(self, lease_token: str, consumer: str = "", timeout: Optional[float] = None) -> int:
        self.release_timeouts.append(timeout)
        time.sleep(timeout if timeout is not None else 10.0)
        raise BrokerUnavailableError(f"no broker answered Release within {timeout} s")


def test_a_stopping_worker_does_not_spend_its_drain_giving_back_a_pull(coordinator):
    topic = "t.stack"
    stub = _ReleaseNeverAnswered()
    worker = Worker([ConsumerSpec(topic, MessageType.QUEUE, lambda m: None, threads=2, ttr=TTR)],
                    link=stub, coordinator=coordinator, instance="w1", drain_timeout=30.0).start()
    wait_until(lambda: stub.calls["pull"] >= 1, 5, what="a pull waiting")
    started = time.monotonic()
    worker.stop()  # cancels the waiting pull, whose lease token is then given back
    took = time.monotonic() - started
    assert stub.release_timeouts, "the abandoned pull was not given back"
    # The give-back is bounded on its own: its messages only wait for their lease otherwise.
    assert all(t is not None and t <= 2.0 for t in stub.release_timeouts), stub.release_timeouts
    assert took < 15.0, f"stop took {took:.1f} s: the 30 s drain was spent on a give-back"
