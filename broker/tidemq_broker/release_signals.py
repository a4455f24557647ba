"""Releases told to the other brokers: a step released by an ack here is due at once, and the
pulls that wait for it may be waiting on another broker.

A broker hears of rows committed elsewhere through its insert watch (``inserts.py``), which
reads new ids. A release does not make a new id: the ack's transaction moves an existing row
from WAITING to NEW. Without a word from the broker that recorded it, another broker's pulls
would find the step only by their earliest-due probe, about half a second later, and a chain
whose steps alternate between brokers would advance two steps a second.

So the broker whose ack released steps signals their topics through the coordinator
(``Coordinator.signal``: one ZooKeeper node per topic whose data it sets), from a thread of its
own, so the Ack call does not wait for ZooKeeper; the topics released while a signal is on its
way go together in the next round. Each broker watches the signal of every topic it has served
a pull for, and wakes that topic's waiting pulls when it fires, unless the signal was its own
(its ack woke them already; waking them again cost each a lock that found nothing). A broker
that knows it is the only one (the coordinator's list of brokers) signals nothing: a signal is
a ZooKeeper write, and a read by every watch it fires. A lost signal (ZooKeeper away) costs only
the delay the earliest-due probe still bounds.

The console signals the same nodes (it runs no pull hub), naming :data:`UNTIMED` as its sender:
what it announces may be due long ago (an operator's edit to NEW keeps the message's effect
time), below the floor the brokers' lock hints start each range at. A broker that hears it
forgets the topic's hint before waking the pulls, so their locks read from the start until the
next probe; a released step is due from its release on, and needs no such thing. The
maintenance leader's lease expiry, and a worker's release of leases it did not use, signal the
same way (:meth:`ReleaseSignals.reopened`): their messages are NEW again at their old effect
times. Such a signal names the broker after the mark (``*host:port``), so that it skips its own
like any other: it woke its pulls already.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Iterable, Optional

from tidemq.coordinator import Coordinator

from .topic_signals import SignalSender

__all__ = ["ReleaseSignals", "UNTIMED"]

log = logging.getLogger(__name__)

#: The sender a signal names when what it announces may be due at any earlier time (the console's,
#: a lease expiry's, a worker's release of leases it did not use); a broker's follows it by its name.
UNTIMED = "*"


class ReleaseSignals:
    """Signals the topics of released steps, and wakes this broker's pulls on others' signals.

    ``wake(topic, untimed)`` wakes the pulls waiting on ``topic`` (``untimed``: the signal named
    :data:`UNTIMED`); ``name`` names this broker in its signals ("": none, and every signal wakes).
    """

    def __init__(self, coordinator: Coordinator, wake: Callable[[str, bool], None], name: str = "") -> None:
        self._coordinator = coordinator
        self._wake = wake
        self._name = name
        self._lock = threading.Lock()
        self._watched: dict[str, Callable[[], None]] = {}
        self._stopped = False
        self._others: Optional[bool] = None  # other brokers registered (None: not known, signal)
        # Said once per outage: the other brokers' probes still find the steps.
        self._sender = SignalSender(lambda topic: coordinator.signal(topic, name), "tidemq-release-signals", log,
                                    "cannot signal released steps to the other brokers (%s); they find them "
                                    "by their probe until this works again",
                                    "signalling released steps to the other brokers works again")
        self._untimed = SignalSender(lambda topic: coordinator.signal(topic, UNTIMED + name),
                                     "tidemq-reopen-signals", log,
                                     "cannot signal expired or released leases to the other brokers (%s); they "
                                     "find their messages by their probe until this works again",
                                     "signalling expired or released leases to the other brokers works again")

    def start(self) -> None:
        if self._name:
            try:
                self._coordinator.watch_brokers(self._brokers_changed)
            except Exception as exc:  # ZooKeeper away: not known, so every release is signalled
                log.debug("cannot watch the brokers: %r", exc)
        self._sender.start()
        self._untimed.start()

    def _brokers_changed(self, brokers: list[str]) -> None:
        self._others = any(broker != self._name for broker in brokers)

    def stop(self) -> None:
        self._sender.stop()
        self._untimed.stop()
        with self._lock:
            self._stopped = True
            watched, self._watched = self._watched, {}
        for stop_watch in watched.values():
            stop_watch()

    def released(self, topics: Iterable[str]) -> None:
        """Steps of ``topics`` were released by a commit of this broker: tell the others."""
        if self._others is False:
            return  # there are none
        self._sender.send(topics)

    def reopened(self, topics: Iterable[str]) -> None:
        """Messages of ``topics`` are NEW again at their old effect times (leases this broker
        expired, or a worker released unused): tell the others, as :data:`UNTIMED` and this broker."""
        if self._others is False:
            return
        self._untimed.send(topics)

    def watch(self, topic: str) -> None:
        """Wake this broker's pulls of ``topic`` on every signal of it from now on (once per
        topic; a pull calls it each time, so it must be cheap once watched)."""
        if topic in self._watched:
            return
        with self._lock:
            if topic in self._watched or self._stopped:
                return
            self._watched[topic] = lambda: None  # claimed: a second pull does not watch again
        try:
            stop_watch = self._coordinator.watch_signal(topic, lambda sender: self._heard(topic, sender))
        except Exception as exc:  # ZooKeeper away (kazoo's errors too): the next pull tries again
            log.debug("cannot watch the release signal of %s: %r", topic, exc)
            with self._lock:
                self._watched.pop(topic, None)
            return
        with self._lock:
            if self._stopped:
                stop_watch()
            else:
                self._watched[topic] = stop_watch

    def _heard(self, topic: str, sender: Optional[str]) -> None:
        untimed = sender is not None and sender.startswith(UNTIMED)
        origin = sender[len(UNTIMED):] if sender is not None and untimed else sender  # "": the console
        if not self._name or origin != self._name:
            self._wake(topic, untimed)
