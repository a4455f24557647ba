"""A cancel signal of a topic brings the heartbeat of the leases a worker holds forward, so a
handler that reports no progress learns of its cancel at once rather than at its next ttr/3
beat; a worker holding nothing of the topic makes no call."""

from __future__ import annotations

import threading
from datetime import datetime

from tests.servers import wait_until
from tidemq.consumer import ConsumerSpec
from tidemq.coordinators.local import LocalCoordinator
from tidemq.drain import Drain
from tidemq.lease_keeper import LeaseKeeper
from tidemq.link import Delivery, Heartbeat, LeaseRef
from tidemq.message import MessageType


class Link:
    """Answers heartbeats; a message in ``cancelled`` has its cancel requested."""

    def __init__(self) -> None:
        self.calls: list[list[LeaseRef]] = []
        self.cancelled: set[int] = set()
        self.lock = threading.Lock()

    def heartbeat(self, leases, ttr, consumer="", progress=(), timeout=None) -> Heartbeat:
        with self.lock:
            self.calls.append(list(leases))
        return Heartbeat([True] * len(leases), [lease.id in self.cancelled for lease in leases])


def delivery(id: int) -> Delivery:
    return Delivery(id, "t.cancel", "{}", datetime(2026, 1, 1), 3, 1, f"{id:032x}", 300.0)


def test_a_cancel_signal_beats_the_held_leases_and_tells_the_run_and_holding_nothing_calls_nothing():
    coordinator = LocalCoordinator("/test-cancel-signals")
    link = Link()
    spec = ConsumerSpec("t.cancel", MessageType.QUEUE, lambda message: None, ttr=300.0)
    keeper = LeaseKeeper(link, spec, lambda: "consumer-1", Drain())
    keeper.start(coordinator)
    try:
        coordinator.signal_cancel("t.cancel")  # nothing held: no call
        held = [delivery(1), delivery(2)]
        keeper.hold(held)
        controls = [keeper.control(LeaseRef(d.id, d.lease_token)) for d in held]
        coordinator.signal_cancel("t.other")  # another topic's signal: no call either
        # The regular beat is 100 s away (ttr 300): a call now is the signal's.
        link.cancelled.add(2)
        coordinator.signal_cancel("t.cancel")
        wait_until(lambda: controls[1].cancelled, 10, what="the run told of its cancel")
        assert not controls[0].cancelled
        with link.lock:
            calls = list(link.calls)
        # Every call carried both held leases: none came before they were held or for t.other.
        assert calls and all(sorted(lease.id for lease in call) == [1, 2] for call in calls)
    finally:
        keeper.stop()
