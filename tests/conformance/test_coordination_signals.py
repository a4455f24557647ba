"""The coordination conformance suite's signals, on every implementation: release signals
(brokers to brokers) and cancel signals (brokers to workers), each heard by its own topic's
watchers only, and a stopped watch hearing nothing."""

from __future__ import annotations

import threading
from collections import Counter

from tests.servers import wait_until


def test_a_signal_reaches_the_watchers_of_its_topic_only_and_a_stopped_watch_hears_nothing(coordinators):
    sender, reader = coordinators(), coordinators()
    counts = {"t.sig": 0, "t.other": 0}
    senders: list = []
    lock = threading.Lock()

    def counter(topic):
        def heard(sender):
            with lock:
                counts[topic] += 1
                senders.append(sender)
        return heard

    stop = reader.watch_signal("t.sig", counter("t.sig"))
    reader.watch_signal("t.other", counter("t.other"))
    sender.signal("t.never.watched")  # signalling a topic nobody watches is fine
    wait_until(lambda: counts["t.sig"] >= 1 and counts["t.other"] >= 1, 10, what="the watches' first calls")
    with lock:
        before = dict(counts)
    sender.signal("t.sig", "s1")
    wait_until(lambda: counts["t.sig"] > before["t.sig"], 10, what="the signal of t.sig")
    # The sender is named, or not known (None): never another one; one signal alone is named.
    assert set(senders) <= {None, "s1"}
    assert senders[-1] == "s1"
    sender.signal("t.sig")  # a second one on the node the first created
    wait_until(lambda: counts["t.sig"] > before["t.sig"] + 1, 10, what="a second signal")
    _a_stopped_watch_hears_nothing(stop, lambda: counts["t.sig"], lambda: sender.signal("t.sig"),
                                   lambda: sender.signal("t.other"), lambda: counts["t.other"] > before["t.other"])


def _a_stopped_watch_hears_nothing(stop, count, signal, signal_other, other_heard):
    """After ``stop()``, ``signal()`` is unheard (``count()`` stays), while ``signal_other()``,
    sent after it to another watch, is heard (``other_heard()``)."""
    stop()
    stopped_at = count()
    signal()
    signal_other()
    wait_until(other_heard, 10, what="the signal sent after the stopped watch's")
    assert count() == stopped_at


def test_a_cancel_signal_reaches_its_topics_watchers_and_is_not_a_release_signal(coordinators):
    sender, reader = coordinators(), coordinators()
    heard = Counter()
    lock = threading.Lock()

    def count(what):
        def call(*_):
            with lock:
                heard[what] += 1
        return call

    stop = reader.watch_cancels("t.cx", count("cancel t.cx"))
    reader.watch_cancels("t.cy", count("cancel t.cy"))
    reader.watch_signal("t.cx", count("release t.cx"))
    sender.signal_cancel("t.never.watched")  # signalling a topic nobody watches is fine
    wait_until(lambda: len(heard) == 3, 10, what="the watches' first calls")
    with lock:
        before = Counter(heard)
    sender.signal_cancel("t.cx")
    wait_until(lambda: heard["cancel t.cx"] > before["cancel t.cx"], 10, what="the cancel signal of t.cx")
    sender.signal("t.cx")  # a release signal of the same topic reaches the release watch only
    wait_until(lambda: heard["release t.cx"] > before["release t.cx"], 10, what="the release signal of t.cx")
    with lock:
        released = heard["release t.cx"]
    sender.signal_cancel("t.cx")  # a second cancel signal, on the node the first created
    wait_until(lambda: heard["cancel t.cx"] > before["cancel t.cx"] + 1, 10, what="a second cancel signal")
    _a_stopped_watch_hears_nothing(stop, lambda: heard["cancel t.cx"], lambda: sender.signal_cancel("t.cx"),
                                   lambda: sender.signal_cancel("t.cy"),
                                   lambda: heard["cancel t.cy"] > before["cancel t.cy"])
    assert heard["release t.cx"] == released  # no cancel signal reached the release watch
