"""ReleaseSignals: the topics of released steps reach the coordinator from a thread of their own,
a topic is watched once however many pulls ask, and an outage is logged once, not per signal."""

from __future__ import annotations

import logging
import threading

from tests.servers import wait_until
from tidemq.errors import CoordinationError
from tidemq_broker.release_signals import UNTIMED, ReleaseSignals


class FakeCoordinator:
    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.signalled: list[str] = []
        self.watches: dict[str, object] = {}
        self.lock = threading.Lock()

    def signal(self, topic, sender=""):
        with self.lock:
            if self.failures:
                self.failures -= 1
                raise CoordinationError("ZooKeeper away")
            self.signalled.append((topic, sender))

    def watch_signal(self, topic, callback):
        self.watches[topic] = callback
        return lambda: self.watches.pop(topic, None)

    def watch_brokers(self, callback):
        self.brokers = callback


def test_released_topics_are_signalled_and_watched_topics_wake_their_pulls():
    coordinator, woken = FakeCoordinator(), []
    signals = ReleaseSignals(coordinator, lambda topic, untimed: woken.append((topic, untimed)), "b1")
    signals.start()
    try:
        signals.watch("t.a")
        signals.watch("t.a")  # a second pull of the topic: still one watch
        assert list(coordinator.watches) == ["t.a"]
        coordinator.watches["t.a"]("b2")  # another broker's signal
        assert woken == [("t.a", False)]
        coordinator.watches["t.a"]("b1")  # its own: its ack woke its pulls already
        assert woken == [("t.a", False)]
        coordinator.watches["t.a"](None)  # a sender not known: it may be another's
        assert woken == [("t.a", False)] * 2
        coordinator.watches["t.a"](UNTIMED)  # the console's: due at times not known
        assert woken == [("t.a", False)] * 2 + [("t.a", True)]
        coordinator.watches["t.a"](UNTIMED + "b2")  # another broker's lease expiry
        assert woken == [("t.a", False)] * 2 + [("t.a", True)] * 2
        coordinator.watches["t.a"](UNTIMED + "b1")  # its own: it woke its pulls already
        assert woken == [("t.a", False)] * 2 + [("t.a", True)] * 2
        signals.released({"t.a": 1, "t.b": 2})
        wait_until(lambda: sorted(coordinator.signalled) == [("t.a", "b1"), ("t.b", "b1")], 10,
                   what="both topics signalled, naming the broker")
        signals.reopened(["t.c"])  # expired leases: NEW again at old effect times
        wait_until(lambda: ("t.c", UNTIMED + "b1") in coordinator.signalled, 10,
                   what="the topic signalled as UNTIMED, naming the broker")
    finally:
        signals.stop()
    assert coordinator.watches == {}  # stopped with the broker


def test_an_outage_is_logged_once_and_its_end_once(caplog):
    coordinator = FakeCoordinator(failures=3)
    signals = ReleaseSignals(coordinator, lambda topic, untimed: None)
    signals.start()
    try:
        with caplog.at_level(logging.INFO, logger="tidemq_broker.release_signals"):
            for n in range(4):  # three fail, the fourth gets through
                signals.released([f"t.{n}"])
                wait_until(lambda: (3 - coordinator.failures) + len(coordinator.signalled) > n, 10,
                           what=f"signal {n} tried")
    finally:
        signals.stop()
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if m.startswith("cannot signal released steps")]) == 1
    assert len([m for m in messages if m.startswith("signalling released steps")]) == 1
    assert coordinator.signalled == [("t.3", "")]


def test_a_broker_that_knows_it_is_alone_signals_nothing():
    coordinator = FakeCoordinator()
    signals = ReleaseSignals(coordinator, lambda topic, untimed: None, "b1")
    signals.start()
    try:
        signals.released(["t.unknown"])  # the list of brokers not heard yet: signal
        wait_until(lambda: coordinator.signalled == [("t.unknown", "b1")], 10, what="a signal")
        coordinator.brokers(["b1"])
        signals.released(["t.alone"])
        signals.reopened(["t.alone"])
        coordinator.brokers(["b1", "b2"])  # another broker came: its pulls must hear releases
        signals.released(["t.two"])
        wait_until(lambda: ("t.two", "b1") in coordinator.signalled, 10, what="the signal with two brokers")
        assert not [sent for sent in coordinator.signalled if sent[0] == "t.alone"]
    finally:
        signals.stop()
