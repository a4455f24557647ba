"""StubBroker keeps the broker rules the runner tests rely on (leases, shards, serial, acks)."""

from __future__ import annotations

import inspect
import threading

import pytest

from tests.servers import wait_until
from tidemq import Client, Settings
from tidemq.errors import PullCancelledError
from tidemq.link import AckItem, AckOutcome, BrokerLink, LeaseRef, PullHandle
from tidemq.stub import StubBroker


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("make", [StubBroker, lambda: Client(Settings(brokers=("127.0.0.1:1",)))])
def test_the_stub_and_the_client_take_every_broker_link_call_as_declared(make):
    link = make()
    assert isinstance(link, BrokerLink)
    for name in ("pull", "ack", "release", "extend", "touch"):
        declared = inspect.signature(getattr(BrokerLink, name)).parameters
        actual = inspect.signature(getattr(link, name)).parameters
        for param in list(declared.values())[1:]:  # after self
            assert param.name in actual, f"{type(link).__name__}.{name} lacks {param.name}"
            got = actual[param.name]
            assert (got.kind, got.default) == (param.kind, param.default), f"{type(link).__name__}.{name}({param.name})"


def test_queue_pull_leases_only_its_shard_in_due_order():
    stub = StubBroker()
    ids = [stub.produce("t", n) for n in range(6)]
    got = stub.pull("t", "c", rank=1, total=2, wait=0, ttr=5)
    assert [d.id for d in got] == [i for i in ids if i % 2 == 1]
    assert {d.attempt for d in got} == {1} and len({d.lease_token for d in got}) == 1
    assert stub.ids("t", "RUNNING") == [d.id for d in got]


def test_serial_pull_holds_one_running_message_per_topic_in_order():
    stub = StubBroker()
    first, second = stub.produce("s", 1), stub.produce("s", 2)
    [head] = stub.pull("s", "c", serial=True, max_messages=5, wait=0)
    assert head.id == first
    assert stub.pull("s", "c", serial=True, wait=0) == []  # the head is RUNNING
    assert stub.ack("s", "c", [AckItem(head.id, head.lease_token, True)]) == [AckOutcome.APPLIED]
    assert [d.id for d in stub.pull("s", "c", serial=True, wait=0)] == [second]


def test_ack_after_the_lease_expired_is_stale_and_failures_retry_after_the_topics_backoff_then_fail():
    clock = FakeClock()
    stub = StubBroker(clock=clock)
    stub.set_topic("t", retry_base=4.0, retry_max=100.0)
    msg_id = stub.produce("t", {}, retry=1)
    [d] = stub.pull("t", "c", wait=0, ttr=10)
    clock.now += 5
    assert stub.expire_leases() == []
    clock.now += 6
    assert stub.expire_leases() == [msg_id]
    assert stub.ack("t", "c", [AckItem(d.id, d.lease_token, True)]) == [AckOutcome.STALE]
    [again] = stub.pull("t", "c", wait=0)
    assert again.attempt == 2
    stub.ack("t", "c", [AckItem(again.id, again.lease_token, False, "boom")])
    stored = stub.message(msg_id)
    assert stored.status == "NEW" and stored.retry_remaining == 0
    # lifecycle.next_delay: the second attempt failed, so 4 s * 2 with jitter in [50 %, 100 %].
    assert 4.0 <= stored.effect_time - clock.now <= 8.0
    assert stub.pull("t", "c", wait=0) == []
    clock.now = stored.effect_time
    [last] = stub.pull("t", "c", wait=0)
    stub.ack("t", "c", [AckItem(last.id, last.lease_token, False, "boom")])
    assert stub.status(msg_id) == "FAIL" and stub.message(msg_id).error == "boom"
    assert [event for event, i in stub.history if i == msg_id] == \
        ["PRODUCED", "LOCKED", "LEASE_EXPIRED", "STALE", "LOCKED", "RETRY", "LOCKED", "FAIL"]
    assert [line.split(" ")[1] for line in stored.trace.splitlines()] == \
        ["PRODUCED", "LOCKED", "LEASE_EXPIRED", "LOCKED", "RETRY"]


def test_extend_touch_and_release_act_only_on_the_held_lease():
    clock = FakeClock()
    stub = StubBroker(clock=clock)
    a, b = stub.produce("t"), stub.produce("t")
    got = stub.pull("t", "c", wait=0, ttr=10, lease_token="ab" * 16)
    clock.now += 8
    assert stub.extend([LeaseRef(a, "ab" * 16), LeaseRef(b, "cd" * 16)], 10) == [True, False]
    assert stub.touch(b, "ab" * 16, 10)
    clock.now += 8
    assert stub.expire_leases() == []  # both were pushed to now + 10 at the 8 s mark
    assert stub.message(a).extended == 1 and stub.message(b).extended == 1
    assert stub.release("ab" * 16) == 2
    assert stub.releases == [("ab" * 16, 2)]
    assert [stub.status(d.id) for d in got] == ["NEW", "NEW"] and stub.message(a).attempt == 0


def test_a_waiting_pull_wakes_on_produce_and_on_cancel():
    stub = StubBroker()
    got: list = []
    waiter = threading.Thread(target=lambda: got.extend(stub.pull("t", "c", wait=10)))
    waiter.start()
    wait_until(lambda: stub.pulls and stub.pulls[0].outcome == "waiting", 5, what="the pull to wait")
    msg_id = stub.produce("t")
    waiter.join(5)
    assert [d.id for d in got] == [msg_id] and stub.pulls[0].outcome == "leased"

    handle = PullHandle()
    errors: list = []

    def pull() -> None:
        try:
            stub.pull("t", "c", wait=10, track=handle)
        except PullCancelledError as exc:
            errors.append(exc)

    waiter = threading.Thread(target=pull)
    waiter.start()
    wait_until(lambda: stub.pulls[-1].outcome == "waiting" and len(stub.pulls) == 2, 5, what="the second pull")
    handle.cancel()
    waiter.join(5)
    assert len(errors) == 1 and stub.pulls[-1].outcome == "cancelled"


def test_a_handle_cancelled_before_the_call_cancels_it_at_once():
    stub = StubBroker()
    stub.produce("t")
    handle = PullHandle()
    handle.cancel()
    with pytest.raises(PullCancelledError):
        stub.pull("t", "c", wait=10, track=handle)
    assert stub.ids("t", "NEW") == [1]
