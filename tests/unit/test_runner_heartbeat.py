"""Automatic lease heartbeats: one batched Extend per runner every ttr/3 for every lease it holds
(running and prefetched); a lease found lost is reported and its message is not started."""

from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest

from tests.servers import wait_until
from tidemq import Worker
from tidemq.consumer import ConsumerSpec
from tidemq.coordinators.local import LocalCoordinator
from tidemq.errors import PermissionDeniedError, StorageUnavailableError
from tidemq.lease_keeper import HOLD
from tidemq.link import LeaseRef
from tidemq.message import MessageType
from tidemq.stub import StubBroker

TTR = 1.5  # heartbeats every 0.5 s


@pytest.fixture
def stub():
    return StubBroker()


@pytest.fixture
def start(stub):
    coordinator = LocalCoordinator(f"/test-{uuid.uuid4().hex[:8]}")
    coordinator.start()
    started = []

    def run(spec: ConsumerSpec) -> Worker:
        worker = Worker([spec], link=stub, coordinator=coordinator, instance="w1", drain_timeout=10).start()
        started.append(worker)
        return worker

    yield run
    for worker in started:
        worker.stop()
    coordinator.stop()


def held_leases(stub: StubBroker, topic: str) -> set[LeaseRef]:
    return {LeaseRef(i, stub.message(i).lease_token) for i in stub.ids(topic, "RUNNING")}


def test_one_extend_per_beat_keeps_running_and_prefetched_leases_alive_past_their_ttr(stub, start):
    topic = "t.beat"
    gate = threading.Event()
    touched: list[bool] = []

    def handler(message) -> None:
        touched.append(message.touch())  # the explicit touch still works beside the heartbeats
        gate.wait(20)

    ids = [stub.produce(topic, n) for n in range(4)]
    worker = start(ConsumerSpec(topic, MessageType.QUEUE, handler, threads=2, ttr=TTR, batch=2))
    wait_until(lambda: len(stub.ids(topic, "RUNNING")) == 4, 5, what="two running and two prefetched")
    held = held_leases(stub, topic)
    wait_until(lambda: stub.extend_calls and set(stub.extend_calls[-1]) == held, 5, what="a beat with all four")
    first = len(stub.extend_calls) - 1
    wait_until(lambda: min(stub.message(i).extended for i in ids) >= 5, 10, what="five heartbeats each")
    # 5 beats x 0.5 s is past the 1.5 s ttr: without them every lease would have expired by now.
    assert stub.expire_leases() == []
    beats = stub.extend_calls[first:]
    assert len(beats) >= 4 and all(set(beat) == held for beat in beats)  # one call per beat, all four
    gate.set()
    wait_until(lambda: len(stub.ids(topic, "SUCCESS")) == 4, 10, what="every message to succeed")
    assert {stub.message(i).attempt for i in ids} == {1}
    assert touched == [True, True, True, True] and stub.calls["touch"] == 4
    wait_until(lambda: worker.runners[0].succeeded == 4, 5, what="the runner to count the acks")
    assert worker.runners[0].stale == 0


def test_a_lost_lease_is_reported_its_ack_refused_and_a_prefetched_one_not_started(stub, start, caplog):
    topic = "t.lost"
    gate = threading.Event()
    runs: list[tuple[int, int]] = []

    def handler(message) -> None:
        runs.append((message.id, message.attempt))
        if message.attempt == 1:
            gate.wait(20)

    running, prefetched = stub.produce(topic, 1), stub.produce(topic, 2)
    caplog.set_level(logging.WARNING, logger="tidemq.lease_keeper")
    worker = start(ConsumerSpec(topic, MessageType.QUEUE, handler, threads=1, ttr=TTR, batch=1))
    wait_until(lambda: runs == [(running, 1)] and len(stub.ids(topic, "RUNNING")) == 2, 5,
               what="one running, one prefetched")
    assert stub.expire_leases([running, prefetched]) == [running, prefetched]  # as if the worker had stalled

    def reported() -> set[int]:
        return {r.args[0] for r in caplog.records if "lease of message" in r.getMessage()}

    wait_until(lambda: reported() == {running, prefetched}, 5, what="the next heartbeat to report both lost")
    gate.set()
    wait_until(lambda: len(stub.ids(topic, "SUCCESS")) == 2, 10, what="both delivered again and done")
    assert ("STALE", running) in stub.history  # the old holder's ack was refused, not applied
    # The prefetched message never ran under its lost lease; each ran again as attempt 2.
    assert sorted(runs) == sorted([(running, 1), (running, 2), (prefetched, 2)])
    wait_until(lambda: worker.runners[0].stale == 2, 5, what="the runner to count both")


def test_heartbeats_never_shorten_a_lease_the_handler_lengthened_with_touch(stub, start):
    topic = "t.touch"
    gate = threading.Event()
    touched_at: list[float] = []

    def handler(message) -> None:
        touched_at.append(stub.clock())
        assert message.touch(300)
        gate.wait(20)

    [msg_id] = [stub.produce(topic, 1)]
    start(ConsumerSpec(topic, MessageType.QUEUE, handler, threads=1, ttr=TTR, batch=1))
    wait_until(lambda: touched_at, 5, what="the handler to touch its lease")
    beats = len(stub.extend_calls)
    wait_until(lambda: len(stub.extend_calls) >= beats + 3, 10, what="three heartbeats after the touch")
    try:
        # Each beat extended the long lease by the touched 300 s, not back to the spec's 1.5 s.
        assert stub.message(msg_id).lease_expire >= touched_at[0] + 300
        assert stub.status(msg_id) == "RUNNING"
    finally:
        gate.set()
    wait_until(lambda: stub.status(msg_id) == "SUCCESS", 10, what="the message to succeed")


def test_held_messages_keep_a_short_lease_by_frequent_beats_and_a_started_one_gets_its_ttr(stub, start):
    # ttr 30 s: messages the runner holds but has not started are leased for HOLD seconds and
    # beaten every HOLD/3; the one it runs is extended by its ttr at the first beat after it starts.
    topic = "t.hold"
    gate = threading.Event()

    def handler(message) -> None:
        gate.wait(20)

    ids = [stub.produce(topic, n) for n in range(3)]
    worker = start(ConsumerSpec(topic, MessageType.QUEUE, handler, threads=1, ttr=30, batch=3))
    wait_until(lambda: len(stub.ids(topic, "RUNNING")) == 3, 5, what="one running and two held")

    def left(msg_id: int) -> float:
        return stub.message(msg_id).lease_expire - time.time()

    wait_until(lambda: sum(left(i) > 20 for i in ids) == 1, 5, what="the running one on its ttr")
    [running] = [i for i in ids if left(i) > 20]
    held = [i for i in ids if i != running]
    assert all(left(i) <= 2.5 for i in held)  # HOLD (1.5 s), a beat rounds it up to whole seconds
    # Three beats of the held ones take about 1.5 s: without them their leases would have run out.
    wait_until(lambda: min(stub.message(i).extended for i in held) >= 3, 10, what="three short beats each")
    assert stub.expire_leases() == []
    assert all(left(i) <= 2.5 for i in held) and left(running) > 20
    gate.set()
    wait_until(lambda: len(stub.ids(topic, "SUCCESS")) == 3, 10, what="every message to succeed")
    assert {stub.message(i).attempt for i in ids} == {1}
    assert worker.runners[0].stale == 0


class _Held:
    """A worker (1 thread, ttr 30 s) running one message of ``topic`` behind ``gate`` and holding
    a second one, ``held``, on its short lease; heartbeats fail while ``failing`` is set, and the
    ids of the ttr extensions that failed (a start's own extension) are in ``tried``."""

    def __init__(self, stub: StubBroker, start, topic: str) -> None:
        self.gate, self.failing = threading.Event(), threading.Event()
        self.runs: list[int] = []
        self.tried: list[int] = []
        self.ids = [stub.produce(topic, n) for n in range(2)]
        heartbeat = stub.heartbeat

        def flaky_heartbeat(leases, ttr, *args, **kwargs):
            if self.failing.is_set():
                self.tried.extend(lease.id for lease in leases if ttr == 30)
                raise StorageUnavailableError("the brokers' database is away")
            return heartbeat(leases, ttr, *args, **kwargs)

        def handler(message) -> None:
            self.runs.append(message.id)
            self.gate.wait(20)

        stub.heartbeat = flaky_heartbeat
        self.worker = start(ConsumerSpec(topic, MessageType.QUEUE, handler, threads=1, ttr=30, batch=2))
        wait_until(lambda: len(self.runs) == 1 and len(stub.ids(topic, "RUNNING")) == 2, 5,
                   what="one running, one held")
        # The running one has its ttr once a beat after its start went through.
        wait_until(lambda: stub.message(self.runs[0]).lease_expire - time.time() > 20, 5,
                   what="the running one on its ttr")
        [self.held] = [i for i in self.ids if i not in self.runs]


def test_a_held_message_whose_short_lease_may_have_run_out_is_extended_before_it_starts_or_not_started(stub, start):
    # Beats that keep failing leave a held message's short lease near its end: the runner then
    # extends it by ttr itself before starting it, and does not start it if that fails too.
    topic = "t.hold.late"
    h = _Held(stub, start, topic)
    h.failing.set()
    # The broker's expiry, once the short lease ran out while beats fail: NEW again, under no lease.
    wait_until(lambda: stub.expire_leases() == [h.held], 10, what="the held one's short lease to run out")
    h.failing.clear()
    h.gate.set()
    # The next beat, or the runner's own extension before it starts the message, finds the lease
    # gone: the old delivery is not run, and the message runs once, delivered again.
    wait_until(lambda: len(stub.ids(topic, "SUCCESS")) == 2, 10, what="both to succeed")
    assert sorted(h.runs) == sorted(h.ids) and len(h.runs) == 2  # each ran once
    assert h.worker.runners[0].stale >= 1


def test_a_held_message_whose_extension_cannot_be_made_waits_for_the_brokers_and_then_runs_here_once(stub, start):
    # The brokers' database away while a held message's short lease runs low: the extension
    # before its start fails, so it does not start; nor is it dropped (it then waited, after the
    # database's return, for its lease to expire: the outage grace, up to a ttr). The keeper goes
    # on beating it, and once a beat goes through it runs here, once.
    topic = "t.hold.unconfirmed"
    h = _Held(stub, start, topic)
    h.failing.set()
    # The keeper reckons a short lease from its beat's sending, no later than the stub's clock.
    wait_until(lambda: stub.message(h.held).lease_expire - time.time() < HOLD / 2 - 0.1, 5,
               what="the held one's short lease to run low")
    h.gate.set()  # its handler slot comes free while the extension cannot be made
    wait_until(lambda: h.tried.count(h.held) >= 2, 5, what="its extension tried and tried again")
    assert h.runs == [i for i in h.ids if i != h.held]  # not started meanwhile
    assert stub.message(h.held).status == "RUNNING"  # the broker's outage grace keeps its lease
    h.failing.clear()
    wait_until(lambda: len(stub.ids(topic, "SUCCESS")) == 2, 10, what="the held one to run once the beats go through")
    assert h.runs[1] == h.held and len(h.runs) == 2
    assert stub.message(h.held).attempt == 1 and h.worker.runners[0].stale == 0


@pytest.mark.parametrize("kind", ["threads", "async"])
def test_a_message_a_long_poll_waited_for_starts_at_once_on_its_short_lease(stub, start, kind):
    # A pull may wait seconds in the broker before its lock: the short lease counts from the
    # reply's arrival, not from the pull's sending, so the message starts at once, with no
    # extension first, and runs once (an async runner used to drop it as running out, again and
    # again, until its deliveries ran out).
    topic = f"t.hold.poll.{kind}"
    ran: list[tuple[int, int]] = []

    def record(message) -> None:
        ran.append((message.id, len(stub.extend_calls)))

    async def async_handler(message) -> None:
        record(message)

    handler = async_handler if kind == "async" else record
    worker = start(ConsumerSpec(topic, MessageType.QUEUE, handler, threads=1, ttr=30, batch=4))
    wait_until(lambda: stub.pulls and stub.pulls[-1].outcome == "waiting", 5, what="a pull waiting")
    waiting_since = time.monotonic()
    wait_until(lambda: time.monotonic() - waiting_since > HOLD + 0.5, 5, what="the pull to wait past the short lease")
    before = len(stub.extend_calls)
    msg_id = stub.produce(topic, 1)
    wait_until(lambda: stub.message(msg_id).status == "SUCCESS", 10, what="the message to succeed")
    assert ran == [(msg_id, before)]  # once, and started before any extension
    assert stub.message(msg_id).attempt == 1 and worker.runners[0].stale == 0


@pytest.mark.parametrize("call", ["ack", "pull"])
def test_a_call_that_fails_once_is_tried_again_at_once(stub, start, monkeypatch, call):
    # One lost database connection (a KILL, a broker's restart) fails one call; the next goes
    # through. Its first retry does not wait: with the pause before every later retry made 30 s
    # here, the message still runs and is recorded within seconds.
    import tidemq.ack_sender
    import tidemq.queue_runner

    monkeypatch.setattr(tidemq.ack_sender, "_RETRY_FIRST", 30.0)
    monkeypatch.setattr(tidemq.queue_runner, "_PULL_RETRY_FIRST", 30.0)
    topic = f"t.once.{call}"
    real, failed = getattr(stub, call), []

    def fails_once(*args, **kwargs):
        if not failed:
            failed.append(call)
            raise StorageUnavailableError("the database is unavailable: (2013, 'Lost connection')")
        return real(*args, **kwargs)

    monkeypatch.setattr(stub, call, fails_once)
    msg_id = stub.produce(topic, 1)
    worker = start(ConsumerSpec(topic, MessageType.QUEUE, lambda message: None, threads=1, ttr=30))
    wait_until(lambda: stub.ids(topic, "SUCCESS") == [msg_id], 10, what="the message recorded")
    assert failed == [call] and stub.message(msg_id).attempt == 1
    wait_until(lambda: worker.runners[0].succeeded == 1, 5, what="the runner to count the ack")


def test_a_refused_pull_is_not_tried_again_at_once(stub, start, monkeypatch):
    # A refusal (a bug of ours, not an outage) would be refused again: unlike a failure, it is
    # not tried again at once, but after the fetch loop's first pause (made 0.3 s here).
    import tidemq.queue_runner

    monkeypatch.setattr(tidemq.queue_runner, "_PULL_RETRY_FIRST", 0.3)
    topic = "t.refused.pull"
    real, calls = stub.pull, []

    def refused_once(*args, **kwargs):
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise PermissionDeniedError("pull of t.refused.pull is not allowed")
        return real(*args, **kwargs)

    monkeypatch.setattr(stub, "pull", refused_once)
    msg_id = stub.produce(topic, 1)
    start(ConsumerSpec(topic, MessageType.QUEUE, lambda message: None, threads=1, ttr=30))
    wait_until(lambda: stub.ids(topic, "SUCCESS") == [msg_id], 10, what="the message recorded")
    assert calls[1] - calls[0] >= 0.3
