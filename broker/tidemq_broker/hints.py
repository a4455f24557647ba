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
- **cursors**: per shard (rank, total) and priority, where the shard's previous lock left its
  own range (``LeasedBatch.reached``): the next lock starts there. The floor is the topic's,
  below its earliest pending message of any shard less a margin, and the entries between are
  what a lock pays for most: they sit on pages written a moment ago, where a non-locking read
  fetches each entry's row to learn whether it is visible.

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
- Cursors follow the same rules: every lowering lowers them, a forget drops them, a lock that
  ran across lowerings is capped by them (the last ``_LOG`` are remembered), and the probe
  lowers every cursor above the earliest NEW message it finds of each priority (its audit of
  what this broker could not see), as a lowering, so that no lock running meanwhile raises it
  back.
"""

from __future__ import annotations

import threading
import time
from collections import deque
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
#: Lowerings remembered per topic: a lock across more leaves its shard's cursor where it was. A
#: busy topic is lowered by every group commit and every look of the insert watch (a hundred
#: and more a second), and a lock under a long read view can take a second.
_LOG = 1024
_MAX_SHARDS = 64  # cursors per topic


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
    __slots__ = ("floor", "priorities", "stranded", "version", "pulled", "lowered", "lowered_priorities", "cursors",
                 "log")

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
        # Each shard's cursor, {(rank, total): {priority: time}}, and the last lowerings as
        # (version, earliest time or None for a forget, priorities or None for any).
        self.cursors: dict[tuple[int, int], dict[int, datetime]] = {}
        self.log: deque[tuple[int, Optional[datetime], Optional[frozenset[int]]]] = deque(maxlen=_LOG)

    def moved(self, when: Optional[datetime], priorities: Optional[frozenset[int]]) -> None:
        """Something of ``priorities`` (None: any) became NEW from ``when`` on (None: at times
        not known): the version moves on, and no cursor stays above it."""
        self.version += 1
        self.log.append((self.version, when, priorities))
        if when is None:
            self.cursors.clear()
            return
        for cursor in self.cursors.values():
            for priority in (cursor if priorities is None else priorities):
                if priority in cursor and when < cursor[priority]:
                    cursor[priority] = when


class LockHints:
    """Per-topic lock hints of one broker; thread-safe."""

    def __init__(self, stranded_after: float = STRANDED_AFTER) -> None:
        self._lock = threading.Lock()
        self._topics: dict[str, _Topic] = {}
        self.stranded_after = stranded_after

    def get(self, topic: str, shard: tuple[int, int] = (0, 1)) -> LockHint:
        """The hint for a lock of ``shard`` (rank, total) of ``topic`` (and marks the topic as
        pulled): the topic's floor and priorities, and where the shard's own ranges start."""
        with self._lock:
            state = self._topics.get(topic)
            if state is None:
                state = self._topics[topic] = _Topic()
            state.pulled = time.monotonic()
            floor = state.floor
            floors = tuple(sorted((priority, when) for priority, when in state.cursors.get(shard, {}).items()
                                  if floor is None or when > floor))
            return LockHint(floor, state.priorities, self.stranded_after if state.stranded else 0.0, floors,
                            state.version)

    def reached(self, topic: str, shard: tuple[int, int], hint: LockHint, reached: dict[int, datetime]) -> None:
        """A lock of ``shard`` of ``topic``, given ``hint``, left its own ranges at ``reached``
        ({priority: time}, ``LeasedBatch.reached``): move the shard's cursor there. What became
        NEW since the hint was given (the lock may not have seen it) keeps the cursor below it;
        across a forget, or more lowerings than are remembered, the cursor stays."""
        with self._lock:
            state = self._topics.get(topic)
            if state is None or not reached:
                return
            caps: dict[Optional[int], datetime] = {}  # the key None: every priority
            if state.version != hint.version:
                if not state.log or state.log[0][0] > hint.version + 1:
                    return  # more lowerings than are remembered
                for version, when, priorities in reversed(state.log):  # newest first, only those since
                    if version <= hint.version:
                        break
                    if when is None:
                        return  # a forget
                    for priority in (priorities if priorities is not None else (None,)):
                        if priority not in caps or when < caps[priority]:
                            caps[priority] = when
            cursor = state.cursors.get(shard)
            if cursor is None:
                if len(state.cursors) >= _MAX_SHARDS:  # ranks of old totals
                    state.cursors.clear()
                cursor = state.cursors[shard] = {}
            for priority, when in reached.items():
                for cap in (caps.get(priority), caps.get(None)):
                    if cap is not None and cap < when:
                        when = cap
                if priority not in cursor or when > cursor[priority]:
                    cursor[priority] = when

    def active(self) -> list[str]:
        """The topics pulled in the last 30 s: those the probe keeps hints for."""
        now = time.monotonic()
        with self._lock:
            for topic in [t for t, s in self._topics.items() if now - s.pulled > _ACTIVE]:
                del self._topics[topic]
            return sorted(self._topics)

    def pulled(self) -> bool:
        """Whether any topic was pulled in the last 30 s (``active`` would name one)."""
        now = time.monotonic()
        with self._lock:
            return any(now - state.pulled <= _ACTIVE for state in self._topics.values())

    def lower(self, topic: str, when: datetime, priorities: Optional[Iterable[int]] = ()) -> None:
        """Messages of ``topic`` with ``priorities`` (None: not known) became NEW, the earliest
        due at ``when``."""
        with self._lock:
            state = self._topics.get(topic)
            if state is None:
                return
            state.moved(when, None if priorities is None else frozenset(priorities))
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
                    state.moved(None, None)
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
                moved = state.version != version
                for priority, when in found.items():
                    # The audit of the cursors: a NEW message below one may be the shard's own,
                    # made NEW where this broker did not see it (another broker's retry, a
                    # lease expiry, the console): that shard's next lock starts there. As a
                    # lowering, so that a lock running now cannot raise the cursor over it.
                    if any(when < cursor.get(priority, when) for cursor in state.cursors.values()):
                        state.moved(when, frozenset((priority,)))
                first = min(found.values(), default=None)
                stranded = first is not None and first <= stale
                if stranded and not state.stranded:
                    became.add(topic)
                low = probed_at if first is None or first > probed_at else first
                if moved:
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
