"""Long-poll pulls: lock what is due now, or sleep until something may be.

A waiting pull sleeps until the earliest of: its deadline, the next due time in its shard, a
commit by this broker's writer (or an ack) that makes something of its topic due sooner, a
change seen by the broker's shared probes, or a slow re-check (10 s). The probes run only while
topics are pulled, and their cost does not grow with the number of waiting pulls: a look at
recent inserts every 20 ms (one primary-key dive when nothing is new, ``inserts.InsertWatch``),
every 5 ms while looks keep finding rows and a pull sleeps here, and, on a thread of its own,
the earliest due time of each pulled topic every 0.5 to 2 s. A due message reaches a waiting
consumer within milliseconds of its commit through this broker, or within about one look's
interval of a commit elsewhere (another broker, a ``tidemq.enqueue`` transaction). With several
brokers, half the messages are committed by a broker other than the one their shard's pull
waits at: the quick looks took the claim p99 of 900 jobs/s on two brokers from 30–39 ms to
19–30 ms. Under a heavier load the pulls rarely sleep (each finds messages), and quick looks
only read what no sleeping pull waits for: at 1,940 jobs/s, looking quickly only while a pull
sleeps (and at once when one begins to) took the claim p50 from 17.4–17.7 to 15.9–16.3 ms.

A pull that may lease ahead (``ahead`` seconds, see ``long_poll``) takes what is due within that
window and wakes half a window before the next due time, so its consumer always holds a message
before the message's effect_time and starts it then, on its own clock.

A consumer pulls again as soon as a pull brought it something. When that pull took less than
it asked for (everything due in its shard) and nothing was notified for the topic since, the
next pull of the same shard starts as if it had been waiting all along: it reads the next due
time (which it would read after an empty lock anyway) and locks only if something is due by
then. On an idle system that lock found nothing after every delivery, and ran beside the
delivered message's ack, slowing it.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta
from typing import Callable, Iterable, Optional, Sequence

from tidemq import clock
from .errors import DatabaseOutOfReachError, StorageUnavailableError
from .handoff import HandOffClaims
from .hints import Arrival, LockHints
from .inserts import InsertWatch
from .storage import LeasedMessage, Probes
from .waiters import FOREVER as _FOREVER, Quiet, Taker, Waiter, holds

__all__ = ["PullHub", "Waiter", "Quiet"]

log = logging.getLogger(__name__)
_BUSY_FOR = 1.0  # seconds after a look found rows during which looks come at the busy interval
_MAX_QUIET = 10_000  # shards remembered at most; forgetting one costs only a lock that finds nothing


class PullHub(HandOffClaims):
    """Where waiting pulls sleep and commits wake them (or hand them messages, ``handoff.py``)."""

    def __init__(self, probes: Probes, probe_interval: float = 0.02, recheck: float = 10.0,
                 blocked_recheck: float = 0.5, earliest_every: int = 25, busy_interval: float = 0.005) -> None:
        self._probes = probes
        self._probe_interval = probe_interval
        self._busy_interval = min(busy_interval, probe_interval)
        self._found_at = float("-inf")  # monotonic time of the last look that found rows
        self.recheck = recheck
        self.blocked_recheck = blocked_recheck
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)  # a claim on a waiter ended
        self._waiters: dict[str, set[Waiter]] = {}
        self._inserts = InsertWatch(probes)
        self.hints = LockHints()  # where each topic's locks read (``hints.py``)
        self._earliest: dict[str, datetime] = {}
        self._earliest_every = earliest_every
        self._next_probe = 0.0  # monotonic time before which the earliest-due probe waits
        # A count per topic of what may have made its messages due, and the count each shard's
        # last lock began at when it found everything due (see the module's docstring).
        self._versions: dict[str, int] = {}
        self._epoch = 0  # moves on when anything of any topic may have changed
        self._quiet: dict[tuple[str, int, int, float], tuple[int, int]] = {}
        self._stopped = threading.Event()
        self._look_soon = threading.Event()  # a pull began to sleep while looks find rows
        self._threads = [threading.Thread(target=self._probe_forever, name="tidemq-pull-probe", daemon=True),
                         threading.Thread(target=self._audit_forever, name="tidemq-pull-audit", daemon=True)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def waiting(self, topic: str, asleep: bool = False) -> int:
        """How many pulls of ``topic`` are waiting now (``asleep``: only those done looking, asleep)."""
        with self._lock:
            return sum(1 for w in self._waiters.get(topic, ()) if not asleep or w.wake_at != _FOREVER)

    def stop(self) -> None:
        """Wake every waiter; pulls return what they have (nothing) at once."""
        self._stopped.set()
        self._look_soon.set()
        self._changed(None)
        self._wake(lambda w: True)

    def wake_all(self, topics: Optional[Sequence[str]] = None) -> None:
        """Wake every waiter to look again: messages of ``topics`` (None: of any) became NEW at
        times not known here (leases expired, something changed in bulk)."""
        self.hints.forget(topics)
        self._changed(topics)
        self._wake(lambda w: True)

    def version(self, topic: str) -> tuple[int, int]:
        """What has been notified for ``topic`` so far, to compare with a later call."""
        with self._lock:
            return self._epoch, self._versions.get(topic, 0)

    def locked(self, quiet: Quiet, version: tuple[int, int], taken: int, drained: bool = False) -> None:
        """A lock of ``quiet``'s shard that began at ``version`` took ``taken`` messages
        (``drained``: and it knows that was everything due, ``LeasedBatch.drained``)."""
        with self._lock:
            if taken < quiet.limit or drained:  # everything due by then: quiet until a change
                if len(self._quiet) >= _MAX_QUIET:
                    self._quiet.clear()
                self._quiet[quiet.shard] = version
            else:
                self._quiet.pop(quiet.shard, None)

    def still_quiet(self, quiet: Quiet) -> bool:
        """Whether the last lock of ``quiet``'s shard took everything due and nothing was
        notified for its topic since it began."""
        with self._lock:
            return self._quiet.get(quiet.shard) == (self._epoch, self._versions.get(quiet.topic, 0))

    def _changed(self, topics: Optional[Iterable[str]]) -> None:
        with self._lock:
            if topics is None:
                self._epoch += 1
            else:
                for topic in topics:
                    self._versions[topic] = self._versions.get(topic, 0) + 1

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def register(self, topic: str, lead: float = 0.0, shard: Optional[tuple[int, int]] = None,
                 taker: Optional[Taker] = None, quiet: Optional[Quiet] = None) -> Waiter:
        """A waiter for ``topic`` whose attempts take what is due within ``lead`` seconds, in
        ``shard`` (rank, total; None: the whole topic); ``taker``: commits may lease to it while
        it is open to hand-offs (``handoff.py``), in ``quiet``'s shard."""
        waiter = Waiter(topic, lead, shard, taker, quiet)
        with self._lock:
            self._waiters.setdefault(topic, set()).add(waiter)
        return waiter

    def unregister(self, waiter: Waiter) -> None:
        with self._lock:
            group = self._waiters.get(waiter.topic)
            if group is not None:
                group.discard(waiter)
                if not group:
                    del self._waiters[waiter.topic]

    def notify(self, topic: str, earliest: datetime, priorities: Optional[Iterable[int]] = None,
               ids: Optional[Sequence[int]] = None) -> None:
        """Messages of ``topic`` (of ``priorities``; None: not known) became NEW with the earliest
        effect_time ``earliest``, or a serial topic's head was freed. ``ids``: the messages, when
        known (they may name other topics' too). A waiter whose shard holds none of them is still
        woken, but begins with the next due time rather than a lock (see ``long_poll``): with
        two consumers, every message's commit cost the other one a lock that found nothing."""
        self.hints.lower(topic, earliest, priorities)
        with self._lock:
            self._versions[topic] = self._versions.get(topic, 0) + 1
            waiters = list(self._waiters.get(topic, ()))
            step = self._inserts.step
        for waiter in waiters:
            if earliest <= waiter.wake_at:
                if ids is None or waiter.shard is None or holds(waiter.shard, ids, step):
                    waiter.foreign = False
                elif waiter.foreign is None:
                    waiter.foreign = True
                waiter.event.set()

    def notify_freed(self, topic: str) -> None:
        """Messages of ``topic`` finished: wake only the pulls something running held back. A
        pull that sleeps because nothing is due has nothing to gain from a success (waking it
        cost two statements per ack, a round trip's worth of the broker's CPU when idle)."""
        with self._lock:
            waiters = [w for w in self._waiters.get(topic, ()) if w.held]
        for waiter in waiters:
            waiter.event.set()

    def notify_commit(self, arrived: dict[str, Arrival], ids: Sequence[int]) -> None:
        """Called by the writer after each commit of ``ids``: {topic: (earliest effect_time,
        priorities)} of what it stored."""
        self._inserts.committed_here(ids)
        for topic, (when, priorities) in arrived.items():
            self.notify(topic, when, priorities, ids)

    def sleep(self, waiter: Waiter, seconds: float) -> None:
        """Sleep up to ``seconds`` unless notified (or notified already since registering)."""
        if seconds > 0 and not self._stopped.is_set():
            waiter.wake_at = clock.after(clock.now(), seconds + waiter.lead)
            if time.monotonic() - self._found_at < _BUSY_FOR:
                self._look_soon.set()
            waiter.event.wait(seconds)
        waiter.event.clear()
        waiter.wake_at = _FOREVER
        waiter.held = False

    def id_step(self) -> int:
        """The server's id step as last read (``waiters.holds``)."""
        return self._inserts.step

    def _wake(self, which: Callable[[Waiter], bool]) -> None:
        with self._lock:
            waiters = [w for group in self._waiters.values() for w in group]
        for waiter in waiters:
            if which(waiter):
                waiter.event.set()

    def _probe_forever(self) -> None:
        # Changes that do not pass through this broker (inserts by other brokers and enqueue
        # transactions; retries, lease expiry and requeues by other brokers or the console) are
        # found by two shared probes, whatever the number of waiters: the inserts committed
        # since the last tick, every tick, and the earliest NEW effect_time of each waited-on
        # topic every few ticks (``_audit_forever``). A waiter is woken only when its topic got
        # something due sooner than before.
        # The watch also runs while no pull waits but topics are pulled (busy consumers pull again
        # at once): its lowerings keep their hints exact; a watch that fell behind would forget them.
        # Looks come quicker while they keep finding rows (within the last second) and a pull sleeps
        # here: other brokers are committing, and each look's interval is what their messages wait.
        # A pull busy locking will find them itself; the look costs the cores it waits for.
        warned = [float("-inf")]
        interval, last = self._probe_interval, time.monotonic()
        while True:
            if self._look_soon.wait(max(0.0, last + interval - time.monotonic())):
                self._look_soon.clear()  # a pull began to sleep: look a busy interval after the last
                self._stopped.wait(max(0.0, last + self._busy_interval - time.monotonic()))
            if self._stopped.is_set():
                break
            with self._lock:
                waited = bool(self._waiters)
            if waited or self.hints.pulled():
                self._guarded(self._look, warned)
            last = time.monotonic()
            busy = last - self._found_at < _BUSY_FOR and self._sleeping()
            interval = self._busy_interval if busy else self._probe_interval

    def _sleeping(self) -> bool:
        """Whether a pull sleeps here now (rather than locking)."""
        with self._lock:
            return any(w.wake_at is not _FOREVER for group in self._waiters.values() for w in group)

    def _look(self) -> None:
        inserted = self._inserts.look()
        if inserted is None:
            self.wake_all()
            return
        if inserted:
            self._found_at = time.monotonic()
        for topic, (when, priorities) in inserted.items():
            self.notify(topic, when, priorities)

    def _audit_forever(self) -> None:
        # The earliest-due probe audits the topics' lock hints (``hints.py``), for every topic
        # pulled lately, waited on or not: a busy consumer's locks need them most. Its period
        # grows with its own cost (it reads what the hints let the locks skip), and it has its
        # own thread: under a long read view it can take a second, and the insert watch must
        # not wait for it (a late look reads more, and wakes its pulls late).
        tick, warned = 0, [float("-inf")]
        while not self._stopped.wait(self._probe_interval):
            tick += 1
            if tick % self._earliest_every == 0 and time.monotonic() >= self._next_probe:
                with self._lock:
                    topics = sorted(self._waiters)
                began = time.monotonic()
                self._guarded(lambda: self._probe_earliest(topics), warned)
                self._next_probe = began + self.hints.next_probe(time.monotonic() - began)

    def _guarded(self, probe: Callable[[], None], warned: list[float]) -> None:
        try:
            probe()
        except DatabaseOutOfReachError:  # so are the pulls' locks: their consumers move to another broker
            self._wake(lambda w: True)
        except StorageUnavailableError:
            pass  # the database logs its outage once; waiting pulls still wake on their own timers
        except Exception:
            # A failing probe fails every tick: say so once a minute, not 50 times a second.
            if time.monotonic() - warned[0] > 60:
                warned[0] = time.monotonic()
                log.warning("pull probe failed (waiting pulls still wake on their own timers)", exc_info=True)

    def _probe_earliest(self, waited: list[str]) -> None:
        hinted = self.hints.active()
        topics = sorted(set(waited) | set(hinted))
        if not topics:
            return
        versions, probed_at = self.hints.versions(hinted), clock.now()
        found = self._probes.earliest_new(topics)
        stranded = self.hints.learn(versions, found, probed_at)
        self._wake_sooner({topic: by_priority for topic, by_priority in found.items() if topic in waited})
        if stranded:  # other shards' messages wait past the grace: every consumer may take them
            self._changed(stranded)
            self._wake(lambda w: w.topic in stranded)

    def _wake_sooner(self, found: dict[str, dict[int, datetime]]) -> None:
        """Wake the waiters of each topic whose earliest NEW message (``found``: {topic:
        {priority: time}}) is sooner than the previous probe found. With the priorities found:
        a notification of unknown priorities would make every lock read all ten ranges."""
        earliest = {topic: min(by_priority.values()) for topic, by_priority in found.items()}
        with self._lock:
            previous, self._earliest = self._earliest, earliest
        for topic, when in earliest.items():
            if topic not in previous or when < previous[topic]:
                self.notify(topic, when, found[topic])


def long_poll(hub: PullHub, deadline: float, attempt: Callable[[], list[LeasedMessage]],
              next_due: Callable[[], Optional[datetime]], topic: str, ahead: float = 0.0,
              blocked: Optional[float] = None, serial: bool = False,
              alive: Callable[[], bool] = lambda: True, quiet: Optional[Quiet] = None,
              taker: Optional[Taker] = None) -> list[LeasedMessage]:
    """Run ``attempt`` now and again whenever something may have become due, until ``deadline``
    (a ``time.monotonic()`` value). Returns the first non-empty batch, or [] at the deadline.

    ``ahead``: ``attempt`` takes what is due within that many seconds. The pull then wakes
    ``ahead / 2`` before the next due time: each attempt gathers about half a window of
    messages, and each reaches its consumer at least half a window before it is due.
    ``blocked``: the pause when messages were due yet none was taken (default: the hub's).
    ``serial``: a serial topic's pull, which a running head holds back (``next_due`` None).
    ``alive``: False once the caller gave up (a consumer cancels its pull when its rank changes);
    the pull then ends instead of waking on every commit of its topic until its deadline.
    ``quiet``: the shard this pull locks in (None: serial or flow-limited, every pull locks
    first). While the shard is still quiet (``PullHub.still_quiet``) the pull begins with the
    next due time instead of a lock, and locks only when something is due by then.
    ``taker``: from the moment it has nothing to lock until it locks again, a commit that
    makes messages of its shard due may lease them to it in its own transaction
    (``handoff.py``; only with ``quiet``); they are then its reply (``Handed``).
    """
    state = _Poll(quiet is not None and hub.still_quiet(quiet))
    taker = taker if quiet is not None else None
    shard = (quiet.rank, quiet.total) if quiet is not None and quiet.total > 1 else None
    while True:
        waiter = hub.register(topic, ahead / 2, shard, taker, quiet)  # before the attempt: no notification is missed
        try:
            found = _poll_once(hub, waiter, state, deadline, attempt, next_due, topic, ahead, blocked, serial, alive,
                               quiet)
        finally:
            handed = hub.close(waiter)  # a commit's hand-off to it, settled
            hub.unregister(waiter)
        if handed:
            return handed
        if found is not None:
            return found


class _Poll:
    """What one long-poll carries from one waiter to the next."""

    __slots__ = ("skip",)

    def __init__(self, skip: bool) -> None:
        self.skip = skip  # the shard is quiet: begin with the next due time, not a lock


def _poll_once(hub: PullHub, waiter: Waiter, state: _Poll, deadline: float, attempt: Callable[[], list[LeasedMessage]],
               next_due: Callable[[], Optional[datetime]], topic: str, ahead: float, blocked: Optional[float],
               serial: bool, alive: Callable[[], bool], quiet: Optional[Quiet]) -> Optional[list[LeasedMessage]]:
    """One waiter's turn of ``long_poll``: the batch to return, or None to go on."""
    attempted_at = clock.now()
    skip = state.skip
    if skip:
        found: list[LeasedMessage] = []  # the previous lock's wait goes on
    else:
        version = hub.version(topic)
        found = attempt()
        if quiet is not None:
            hub.locked(quiet, version, len(found), getattr(found, "drained", False))
    if not found:
        hub.open(waiter)  # nothing to lock now: commits may hand it messages from here on
    remaining = deadline - time.monotonic()
    if found or (remaining <= 0 and not skip) or hub.stopped or not alive():
        return found
    due = next_due()
    if skip and due is not None and due <= clock.after(attempted_at, ahead):
        state.skip = False
        return None  # due by now after all: lock (the read is what an empty lock reads next)
    if remaining <= 0:
        return found
    state.skip = False
    if due is None:
        pause = hub.recheck
        waiter.held = serial  # the head runs (or nothing waits): its ack wakes this pull
    elif due > clock.after(attempted_at, ahead):
        # Not within reach when we tried: sleep until it is (possibly not at all: it
        # came within reach between the attempt and this query).
        pause = (due - clock.now()) / timedelta(seconds=1) - ahead / 2
    else:
        # Due before we tried, yet not taken: serial head busy, a flow limit, raced.
        pause = hub.blocked_recheck if blocked is None else blocked
        waiter.held = True
    hub.sleep(waiter, min(pause, remaining, hub.recheck))
    # Woken only for other shards' messages: look at the next due time before locking.
    state.skip = quiet is not None and waiter.foreign is True
    return None
