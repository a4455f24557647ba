"""Result waiters: a Results call sleeps here until a message it waits for is final.

A waiter wakes at once when this broker records the end of a message it waits for (an ack, a
lease expiry, a cancel), and within one probe interval when another broker does: while anyone
waits, one shared probe reads which waited ids are final, in one statement per thousand ids
(``Probes.finished``), every ``probe_interval`` seconds (50 ms), every ``busy_interval`` (5 ms)
while its probes keep finding ends that no waiter here had been woken for (within the last
second: waiters here, acks through another broker, as behind a load balancer), or less often
when the probe itself takes long (many ids waited on): it sleeps at least twenty times its own
duration, so it never takes more than a twentieth of a core. The probe's cost does not grow
with the number of waiters of an id, and nothing runs while nobody waits. It leaves out what
the waiters read themselves: ids whose waiters this broker already woke, and, for one interval,
the messages of a waiter that ended an idle time (it read them as it registered).
A waiter also reads again by itself every ``recheck`` seconds (the probe failing while the
database is away must not leave it asleep until its deadline). When the probe finds the
database out of this broker's reach (``storages/reach.py``), it wakes every waiter at once:
their reads fail the same way, and their callers move to a broker that reaches it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterable, Sequence

from tidemq.lifecycle import FINAL_STATUSES

from .errors import DatabaseOutOfReachError, RetriableError
from .storage import MessageResult, Probes

__all__ = ["ResultHub", "is_final"]

log = logging.getLogger(__name__)
#: The probe sleeps at least this many times as long as it took (5% of a core at most).
_DUTY = 20
_BUSY_FOR = 1.0  # seconds after a probe found ends during which probes come at the busy interval
_FINAL = frozenset(status.value for status in FINAL_STATUSES)


def is_final(ids: Sequence[int], found: Sequence[MessageResult]) -> bool:
    """Whether a wait for ``ids`` is over: one of them is final, or is not stored (gone)."""
    return len(found) < len(set(ids)) or any(state.status in _FINAL for state in found)


class ResultHub:
    """Where Results calls wait, keyed by message id."""

    def __init__(self, probes: Probes, probe_interval: float = 0.05, recheck: float = 60.0,
                 busy_interval: float = 0.005) -> None:
        self._probes = probes
        self._probe_interval = probe_interval
        self._busy_interval = min(busy_interval, probe_interval)
        self._found_at = float("-inf")  # monotonic time of the last probe that found ends
        self._recheck = recheck
        self._lock = threading.Lock()
        self._someone_waits = threading.Condition(self._lock)
        self._waiters: dict[int, set[threading.Event]] = {}
        self._woken: set[int] = set()  # waited ids whose every waiter was woken: they read again themselves
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._probe_forever, name="tidemq-result-probe", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Wake every waiter: Results calls answer with what they have."""
        with self._lock:
            self._stopped.set()
            self._someone_waits.notify_all()
        self._wake_all()

    def _wake_all(self) -> None:
        with self._lock:
            for events in self._waiters.values():
                for event in events:
                    event.set()

    def notify(self, ids: Iterable[int]) -> int:
        """Messages ``ids`` may have ended (this broker recorded it): wake their waiters; returns
        how many were not awake already."""
        woke = 0
        with self._lock:
            for id in ids:
                events = self._waiters.get(id)
                if events:
                    for event in events:
                        if not event.is_set():
                            event.set()
                            woke += 1
                    self._woken.add(id)
        return woke

    def wait(self, ids: Sequence[int], deadline: float,
             read: Callable[[Sequence[int]], list[MessageResult]]) -> list[MessageResult]:
        """Read ``ids`` (``read``) until one of them is final or gone, or until ``deadline`` (a
        ``time.monotonic()`` value); return the last read."""
        while True:
            event = self._register(ids)  # before the read, so no notification is missed
            try:
                found = read(ids)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stopped.is_set() or is_final(ids, found):
                    return found
                event.wait(min(remaining, self._recheck))
            finally:
                self._unregister(ids, event)

    def _register(self, ids: Sequence[int]) -> threading.Event:
        event = threading.Event()
        with self._lock:
            for id in set(ids):
                self._waiters.setdefault(id, set()).add(event)
                self._woken.discard(id)
            self._someone_waits.notify_all()
        return event

    def _unregister(self, ids: Sequence[int], event: threading.Event) -> None:
        with self._lock:
            for id in set(ids):
                events = self._waiters.get(id)
                if events is not None:
                    events.discard(event)
                    if not events:
                        del self._waiters[id]
                        self._woken.discard(id)

    def _probe_forever(self) -> None:
        while not self._stopped.is_set():
            with self._lock:
                idle = not self._waiters
                while not self._waiters and not self._stopped.is_set():
                    self._someone_waits.wait()
            if idle:
                # The waiter that ended the idle time read its messages as it registered: a probe
                # now would read them again. It comes one interval later, if anyone still waits.
                self._stopped.wait(self._interval())
                continue
            with self._lock:
                # An id whose every waiter is awake already (this broker recorded its end) is
                # read again by those waiters: asking for it would only find what they will.
                waited = list(self._waiters.keys() - self._woken)
            began = time.monotonic()
            try:
                # Only ends no one here had heard of (acks through another broker) make the
                # next probes come sooner: those this broker recorded woke their waiters at once.
                if waited and self.notify(self._probes.finished(waited)):
                    self._found_at = time.monotonic()
            except DatabaseOutOfReachError as exc:
                # Another broker may reach it: each waiter's read fails now, and its Results call
                # goes back UNAVAILABLE, which its caller's pool moves to another broker.
                log.debug("result probe failed: %s", exc)
                self._wake_all()
            except RetriableError as exc:  # the database away: waiters re-read on their recheck
                log.debug("result probe failed: %s", exc)
            except Exception:
                log.warning("result probe failed", exc_info=True)
            # At most 1/_DUTY of a core: a probe of thousands of waited ids takes milliseconds,
            # and at a fixed pace its cost would grow with the number of ids waited on.
            self._stopped.wait(max(self._interval(), (time.monotonic() - began) * _DUTY))

    def _interval(self) -> float:
        """The busy interval within a second of a probe that found ends, else the idle one."""
        return self._busy_interval if time.monotonic() - self._found_at < _BUSY_FOR else self._probe_interval
