"""What a broker tells each lock about its topic, so the lock reads only what can be due.

A lease reads the lock index ``(topic, NEW, priority, effect_time)``, one range per priority.
Every message consumed leaves its entry there delete-marked until InnoDB purges it, and purge
waits for the oldest open read view (a ``mysqldump --single-transaction``, a report, a forgotten
console tab). A non-locking read steps over those entries page by page: at the start of a range
(every message consumed since the read view opened), and past its end, since InnoDB only stops
at the next live entry. After 10 minutes at 600 messages/s that is thousands of pages per range,
and the lock reads ten ranges (one per priority) for its own shard. Three hints, kept per topic
by this broker, make each lock read only what can be due:

- **floor**: no NEW message of the topic is due before it; each range starts there, past the
  consumed messages' entries.
- **priorities**: the priorities the topic's pending messages have; the other ranges are not
  read (an empty range costs the walk to the next live entry, past every consumed one).
- **stranded**: whether another shard's messages have waited past the grace
  (``STRANDED_AFTER``); only then does a lock read the other shards' ranges too.

They must never hide a NEW message for long:

- The pull hub's **probe** reads the earliest NEW effect_time of every priority of every topic
  pulled lately, without any hint (``Storage.earliest_new``): that is the audit. The floor becomes
  the earliest found (or the probe's own time when nothing is pending), less ``MARGIN``; the
  priorities become those found. A message made NEW in a way this broker did not see (another
  broker's retry, release or lease expiry, the console's requeue, a commit the insert watch had
  given up on) is found by the next probe. The probe reads what the locks skip, so its period
  grows with its cost (``DUTY`` of the time), from ``PROBE_EVERY`` to ``PROBE_AT_LEAST`` seconds.
- Everything this broker sees make a message NEW **lowers** the floor at once and adds its
  priority: its own group commits, inserts the insert watch found (other brokers,
  ``tidemq.enqueue``). Where the effect time or priority is not known (retries of its acks,
  releases, lease expiries, a look of the insert watch that could not read every insert), the
  hint is **forgotten** until the next probe: the locks read every range from the start.
- A probe that began before a lowering must not raise over it: each lowering moves the topic's
  version on, and a probe across lowerings keeps its result only widened by them (the earliest
  time and every priority they named); across anything not known it keeps nothing.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Iterable, NamedTuple, Optional, Sequence

from tidemq import clock

from .storage import LockHint

__all__ = ["LockHints", "Arrival", "arrivals", "MARGIN", "STRANDED_AFTER", "PROBE_EVERY", "DUTY", "PROBE_AT_LEAST"]

#: Seconds the floor stays below what the probe found: it covers other brokers' clocks (a retry
#: they schedule for their "now" lands this much before ours at most) at the cost of reading a
#: second's worth of consumed entries.
MARGIN = 1.0
#: A QUEUE message due this many seconds and still not taken by its shard's consumer may be taken
#: by any consumer of the topic: its consumer stopped pulling (killed, hung), and ZooKeeper takes
#: a session timeout to say so. A live consumer takes its own within milliseconds, and fills its
#: batch with its own first, so under load the shards stay apart.
STRANDED_AFTER = 1.0
#: The probe runs every this many seconds ...
PROBE_EVERY = 0.5
#: ... or, when it takes long, so that it takes about this share of the time: under a long read
#: view it reads what the locks skip, and its cost grows with the read view's age ...
DUTY = 0.05
#: ... but at least this often: stranded messages and messages made NEW elsewhere wait for it.
PROBE_AT_LEAST = 2.0
_ACTIVE = 30.0  # seconds a topic stays probed after its last pull


class Arrival(NamedTuple):
    """What became NEW in one topic: the earliest effect time and the priorities."""

    earliest: datetime
    priorities: frozenset[int]


def arrivals(rows: Iterable[tuple[str, int, datetime]]) -> dict[str, Arrival]:
    """{topic: Arrival} of ``(topic, priority, effect_time)`` rows."""
    earliest: dict[str, datetime] = {}
    priorities: dict[str, set[int]] = {}
    for topic, priority, when in rows:
        if topic not in earliest or when < earliest[topic]:
            earliest[topic] = when
        priorities.setdefault(topic, set()).add(priority)
    return {topic: Arrival(when, frozenset(priorities[topic])) for topic, when in earliest.items()}


class _Topic:
    __slots__ = ("floor", "priorities", "stranded", "version", "pulled", "lowered", "lowered_priorities")

    def __init__(self) -> None:
        self.floor: Optional[datetime] = None
        self.priorities: Optional[frozenset[int]] = None
        self.stranded = True  # until a probe says otherwise
        self.version = 0
        self.pulled = time.monotonic()
        # What was lowered since the running probe began (``versions``): the earliest time and
        # the priorities, None when something not known happened (a forget, a retry).
        self.lowered: Optional[datetime] = None
        self.lowered_priorities: Optional[frozenset[int]] = frozenset()


class LockHints:
    """Per-topic lock hints of one broker; thread-safe."""

    def __init__(self, stranded_after: float = STRANDED_AFTER) -> None:
        self._lock = threading.Lock()
        self._topics: dict[str, _Topic] = {}
        self.stranded_after = stranded_after

    def get(self, topic: str) -> LockHint:
        """The hint for a lock of ``topic`` (and marks the topic as pulled)."""
        with self._lock:
            state = self._topics.get(topic)
            if state is None:
                state = self._topics[topic] = _Topic()
            state.pulled = time.monotonic()
            return LockHint(state.floor, state.priorities, self.stranded_after if state.stranded else 0.0)

    def active(self) -> list[str]:
        """The topics pulled in the last 30 s: those the probe keeps hints for."""
        now = time.monotonic()
        with self._lock:
            for topic in [t for t, s in self._topics.items() if now - s.pulled > _ACTIVE]:
                del self._topics[topic]
            return sorted(self._topics)

    def lower(self, topic: str, when: datetime, priorities: Optional[Iterable[int]] = ()) -> None:
        """Messages of ``topic`` with ``priorities`` (None: not known) became NEW, the earliest
        due at ``when``."""
        with self._lock:
            state = self._topics.get(topic)
            if state is None:
                return
            state.version += 1
            if state.floor is not None and when < state.floor:
                state.floor = when
            if state.lowered is None or when < state.lowered:
                state.lowered = when
            if priorities is None:
                state.priorities = state.lowered_priorities = None
            else:
                if state.priorities is not None:
                    state.priorities = state.priorities | frozenset(priorities)
                if state.lowered_priorities is not None:
                    state.lowered_priorities = state.lowered_priorities | frozenset(priorities)

    def forget(self, topics: Optional[Sequence[str]] = None) -> None:
        """Messages of ``topics`` (None: of any topic) became NEW at times and priorities not
        known here: their locks read every range from the start until the next probe."""
        with self._lock:
            for topic in (list(self._topics) if topics is None else topics):
                state = self._topics.get(topic)
                if state is not None:
                    state.version += 1
                    state.floor, state.priorities, state.stranded = None, None, True
                    state.lowered_priorities = None

    def versions(self, topics: Sequence[str]) -> dict[str, int]:
        """Each topic's version, read as a probe begins (see ``learn``). Not a plain read: it
        also starts the record of what is lowered from now on, so there is one probe at a time
        (the pull hub's probe thread)."""
        with self._lock:
            for topic in topics:
                state = self._topics.get(topic)
                if state is not None:
                    state.lowered, state.lowered_priorities = None, frozenset()
            return {t: self._topics[t].version for t in topics if t in self._topics}

    def learn(self, versions: dict[str, int], earliest: dict[str, dict[int, datetime]],
              probed_at: datetime) -> set[str]:
        """The probe that began at ``probed_at``, after ``versions`` were read, found ``earliest``
        ({topic: {priority: earliest NEW effect_time}}, topics without NEW messages absent). A
        topic whose version moved meanwhile only widens its hint: something made a message NEW
        that the probe may not have seen, so the floor is not raised, no priority dropped and the
        stranded flag not cleared, but a stranded message the probe saw is still there to take.
        Returns the topics whose messages became stranded."""
        stale = clock.after(probed_at, -self.stranded_after)
        became: set[str] = set()
        with self._lock:
            for topic, version in versions.items():
                state = self._topics.get(topic)
                if state is None:
                    continue
                found = earliest.get(topic, {})
                first = min(found.values(), default=None)
                stranded = first is not None and first <= stale
                if stranded and not state.stranded:
                    became.add(topic)
                low = probed_at if first is None or first > probed_at else first
                if state.version != version:
                    # Under steady production a commit lands during nearly every probe: taking
                    # nothing from such a probe left a dead consumer's shard unseen for as long
                    # as production went on, and a hint once forgotten was never learnt again:
                    # every lock read all ten ranges from the start of the index. When all
                    # that happened meanwhile is known (lowerings with their priorities), the
                    # probe's answer widened by it is as exact as a probe across no change.
                    state.stranded = state.stranded or stranded
                    if state.lowered_priorities is None:
                        continue  # something not known: only the next probe can tell
                    floor = clock.after(low, -MARGIN)
                    state.floor = floor if state.lowered is None or floor < state.lowered else state.lowered
                    state.priorities = frozenset(found) | state.lowered_priorities
                    continue
                state.floor = clock.after(low, -MARGIN)
                state.priorities = frozenset(found)
                state.stranded = stranded
        return became

    @staticmethod
    def next_probe(duration: float) -> float:
        """Seconds until the next probe, after one that took ``duration`` seconds."""
        return min(PROBE_AT_LEAST, max(PROBE_EVERY, duration / DUTY))
