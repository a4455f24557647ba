"""Where each topic's lock may start reading: a per-topic low-water mark of pending effect times.

A lease reads the lock index ``(topic, NEW, priority, effect_time)`` from the first entry of
each priority's range. Every message consumed leaves its entry there delete-marked until InnoDB
purges it, and purge waits for the oldest open read view: while a ``mysqldump
--single-transaction`` or a report runs for minutes, every lock would walk every message
consumed since it began (about 6,000 index pages after 10 minutes at 600 messages/s). Starting
the range at a time no NEW message of the topic is due before, the floor, makes each lock read
only what is due now and the entries of the last second or so, whatever the read view's age.

The floor must never pass over a NEW message for long. It is kept per topic in this broker:

- **Raised** once a second by the pull hub's probe of the earliest NEW effect_time of every
  topic pulled lately (an unbounded read, ``Storage.earliest_new``): the floor becomes that time
  (or the probe's own time when nothing is pending), less ``MARGIN``. The probe is the audit: a
  message made NEW in a way this broker did not see (another broker's retry, release or lease
  expiry, the console's requeue, a late commit the insert watch had given up on) is found by it
  within a second, as it was found before floors existed.
- **Lowered** at once by everything this broker sees make a message NEW: its own group commits,
  inserts the insert watch found (other brokers, ``tidemq.enqueue``), its acks' retries; and
  **forgotten** (no floor until the next probe) where the effect times are not known: releases,
  lease expiries, a look of the insert watch that could not read every insert.
- A probe that began before a lowering must not raise over it: each lowering moves the topic's
  version on, and a probe's result is kept only if the version did not move while it ran.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Optional, Sequence

from tidemq import clock

__all__ = ["Floors", "MARGIN"]

#: Seconds the floor stays below what the probe found: it covers other brokers' clocks (a retry
#: they schedule for their "now" lands this much before ours at most) at the cost of walking a
#: second's worth of consumed entries.
MARGIN = 1.0
_ACTIVE = 30.0  # seconds a topic stays probed after its last pull


class Floors:
    """Per-topic floors of one broker; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._low: dict[str, datetime] = {}
        self._version: dict[str, int] = {}
        self._pulled: dict[str, float] = {}

    def get(self, topic: str) -> Optional[datetime]:
        """The time no NEW message of ``topic`` is due before, or None (read from the start)."""
        self._pulled[topic] = time.monotonic()
        return self._low.get(topic)

    def active(self) -> list[str]:
        """The topics pulled in the last 30 s: those the probe keeps floors for."""
        now = time.monotonic()
        with self._lock:
            for topic in [t for t, at in self._pulled.items() if now - at > _ACTIVE]:
                del self._pulled[topic]
                self._low.pop(topic, None)
            return sorted(self._pulled)

    def lower(self, topic: str, when: datetime) -> None:
        """A message of ``topic`` due at ``when`` became NEW."""
        with self._lock:
            self._version[topic] = self._version.get(topic, 0) + 1
            low = self._low.get(topic)
            if low is not None and when < low:
                self._low[topic] = when

    def forget(self, topics: Optional[Sequence[str]] = None) -> None:
        """Messages of ``topics`` (None: of any topic) became NEW at times not known here."""
        with self._lock:
            for topic in (list(self._pulled) if topics is None else topics):
                self._version[topic] = self._version.get(topic, 0) + 1
                self._low.pop(topic, None)

    def versions(self, topics: Sequence[str]) -> dict[str, int]:
        """Each topic's version, read before a probe: see ``learn``."""
        with self._lock:
            return {topic: self._version.get(topic, 0) for topic in topics}

    def learn(self, versions: dict[str, int], earliest: dict[str, datetime], probed_at: datetime) -> None:
        """The probe that began at ``probed_at``, after ``versions`` were read, found ``earliest``
        (topics without NEW messages absent). A topic whose version moved meanwhile keeps its
        floor: something made a message NEW that the probe may not have seen."""
        with self._lock:
            for topic, version in versions.items():
                if self._version.get(topic, 0) == version and topic in self._pulled:
                    found = earliest.get(topic)
                    low = probed_at if found is None or found > probed_at else found
                    self._low[topic] = clock.after(low, -MARGIN)
