"""The leases one consumer holds, from its pull until a broker has recorded their outcome.

A heartbeat thread extends every lease held in one call every ttr/3: prefetched, running, and
finished ones whose outcome the :class:`~tidemq.ack_sender.AckSender` is still sending. A handler
may therefore run far longer than its ttr while its worker lives. A lease found lost before its
handler started is reported, so the runner does not start it.

**Held, not started: a short lease.** With ``hold`` (shorter than ttr), a pull asks for leases of
``hold`` seconds, and the messages a worker holds but has not started (prefetched, or leased
ahead of their effect time) are extended by ``hold`` every hold/3; once a handler starts one, the
next of those beats extends it by ttr and it joins the ttr/3 rhythm. A worker killed with -9
thus gives back what it never started within ``hold`` (plus the brokers' expiry period), not
ttr; what it was running comes back within ttr, as before. A message is started only while its
lease has at least hold/2 left by this keeper's reckoning: a beat's extension counts from when
its call was sent (the broker's clock cannot be ahead of that), a pull's lease from when its
reply arrived, less :data:`REPLY_MARGIN` (a long poll may wait seconds before its lock, so its
sending says nothing; the lock commits just before the reply goes out). A worker whose beats
have been failing extends that one lease first, by ttr, and does not start it if the broker
refuses; while that call fails (the brokers or their database away) the message waits, still
beaten, and starts once a beat goes through.

The heartbeat also carries the handlers' progress reports (the latest per message; a report
brings the next heartbeat of its lease forward, to at most one a second) and brings back which
messages' cancel was requested: their runs' :class:`~tidemq.control.RunControl` is told. A
cancel signal of the topic (a broker marked running messages of it: ``Coordinator.watch_cancels``)
brings the heartbeat of every held lease forward at once, to at most one per
:data:`CANCEL_EVERY`: a handler that reports no progress learns of its cancel within tens of
milliseconds, not at its next ttr/3 beat.
"""

from __future__ import annotations

import enum
import logging
import math
import threading
import time
from typing import Callable, Optional, Sequence

from . import metrics
from .consumer import ConsumerSpec
from .control import RunControl
from .coordinator import Coordinator
from .drain import LAST_CALL, Drain
from .errors import RetriableError, StorageUnavailableError, TidemqError
from .link import BrokerLink, Delivery, LeaseRef, ProgressRef

__all__ = ["LeaseKeeper", "StartCheck", "SMALLEST", "HOLD", "REPLY_MARGIN", "UNCONFIRMED_RETRY"]

log = logging.getLogger(__name__)
# A call the brokers' database failed (a heartbeat, an ack batch) is sent again in halves, down to
# this many items: a long transaction is what connections killed every 100 ms never let finish,
# and a batch that grows while it fails would otherwise never get through (nor would the
# heartbeat of its leases).
SMALLEST = 50
#: Seconds between two heartbeats a handler's progress reports bring forward.
PROGRESS_EVERY = 1.0
#: Seconds between two heartbeats cancel signals bring forward.
CANCEL_EVERY = 0.1
#: Seconds before a failed beat of short leases is tried again (they have hold/2 left at least).
SHORT_RETRY = 0.1
#: Seconds between two looks of a handler thread at a held message whose lease is UNCONFIRMED.
UNCONFIRMED_RETRY = 0.2
#: The short lease a QUEUE runner asks for (``hold``): with the brokers' lease expiry every 0.5 s,
#: what a killed worker held but never started is due again within 2 s. Its cost: a beat of the
#: held messages every 0.5 s while a worker holds any.
HOLD = 1.5
#: Seconds a pull's reply may have taken from its lock's commit to this worker: a short lease
#: counts as granted that long before the reply arrived.
REPLY_MARGIN = 0.25


class StartCheck(enum.Enum):
    """Whether a held message may start now (:meth:`LeaseKeeper.before_start`)."""

    START = "start"  # its lease is this worker's, with time left
    LOST = "lost"  # a heartbeat found it gone (or it could not be checked without a call)
    # Its short lease may be running out and the call to extend it failed (the brokers or their
    # database away): it may still be this worker's, and the keeper goes on beating it.
    UNCONFIRMED = "unconfirmed"


class LeaseKeeper:
    """Heartbeats for one consumer; ``consumer()`` names it in calls."""

    def __init__(self, link: BrokerLink, spec: ConsumerSpec, consumer: Callable[[], str], drain: Drain,
                 hold: float = 0.0) -> None:
        self.link = link
        self.spec = spec
        self.hold_seconds = hold if 0 < hold < spec.ttr else 0.0  # the short lease of held messages (0: none)
        self._consumer = consumer
        self._drain = drain
        self._lock = threading.Lock()
        self._touched: dict[LeaseRef, float] = {}  # leases a handler lengthened with message.touch(ttr)
        self._held: set[LeaseRef] = set()  # prefetched or running
        self._reporting: set[LeaseRef] = set()  # finished: the outcome is on its way to a broker
        self._lost: set[LeaseRef] = set()  # leases a heartbeat found gone before the handler started
        self._controls: dict[LeaseRef, RunControl] = {}  # the runs of leases held
        self._cancel_seen: set[LeaseRef] = set()  # cancel requested before the run started
        self._progress: dict[LeaseRef, ProgressRef] = {}  # the latest report not yet sent, per lease
        self._progress_sent = 0.0  # monotonic time of the last heartbeat a report brought forward
        self._cancel_signalled = False  # a cancel signal heard since the last beat of every held lease
        self._cancel_sent = -math.inf  # monotonic time of the last heartbeat a cancel signal brought forward
        # Leases of ``hold`` seconds, each with the monotonic time it surely lasts until: held
        # ones, and started ones (a run's control made, or its outcome on its way) until a beat
        # extends them by ttr.
        self._short: dict[LeaseRef, float] = {}
        self._next_short = math.inf  # when the short leases are beaten next
        self._nudge = threading.Event()
        self._stop = threading.Event()
        self._unwatch: Callable[[], None] = lambda: None  # stops the watch of cancel signals
        self._thread = threading.Thread(target=self._loop, name=f"tidemq-heartbeat-{spec.topic}", daemon=True)
        self.stale = 0  # leases found lost before their handler started

    def start(self, coordinator: Optional[Coordinator] = None) -> None:
        """Start beating; with ``coordinator``, on its cancel signals of the topic too."""
        if coordinator is not None:
            try:
                self._unwatch = coordinator.watch_cancels(self.spec.topic, self.cancel_signalled)
            except Exception as exc:  # ZooKeeper away (kazoo's errors too): cancels wait for a beat
                log.warning("cannot watch the cancel signals of %s (%r): a cancel of a running message "
                            "is learned at its next heartbeat", self.spec.topic, exc)
        self._thread.start()

    def stop(self) -> None:
        """Stop beating (once every outcome was sent or given up)."""
        self._unwatch()
        self._stop.set()
        self._nudge.set()
        self._thread.join(self._drain.left() + LAST_CALL + 1.0)

    # -- the leases held ---------------------------------------------------------------------
    def hold(self, deliveries: Sequence[Delivery], received: Optional[float] = None) -> None:
        """Beat the leases of ``deliveries`` from now until their outcome is recorded.
        ``received``: the monotonic time the reply of the pull that leased them arrived; with
        ``hold``, they are on the short lease (see the module's docstring)."""
        leases = [LeaseRef(d.id, d.lease_token) for d in deliveries]
        nudge = False
        with self._lock:
            self._held.update(leases)
            if self.hold_seconds and received is not None:
                if not self._short:  # the loop may be asleep until the next ttr/3 beat
                    self._next_short, nudge = received + self.hold_seconds / 3, True
                self._short.update((lease, received - REPLY_MARGIN + self.hold_seconds) for lease in leases)
        if nudge:
            self._nudge.set()

    def reporting(self, leases: Sequence[LeaseRef]) -> None:
        """Their handlers are done and their outcomes on their way: keep beating them (by ttr)."""
        with self._lock:
            self._held.difference_update(leases)
            self._reporting.update(leases)

    def reported(self, leases: Sequence[LeaseRef]) -> None:
        """Their outcomes were recorded (or given up): stop beating them."""
        with self._lock:
            self._reporting.difference_update(leases)
            for lease in leases:
                self._touched.pop(lease, None)
                self._short.pop(lease, None)
                self._controls.pop(lease, None)
                self._cancel_seen.discard(lease)
                self._progress.pop(lease, None)

    def control(self, lease: LeaseRef) -> RunControl:
        """The control of the run of ``lease``, which starts now: told of a cancel request (at
        once, if a heartbeat saw one while the message waited), its progress sent by heartbeats."""
        control = RunControl(lease.id, lambda done, total, note: self.progress(lease, done, total, note))
        with self._lock:
            self._controls[lease] = control  # started: the next beat of short leases extends it by ttr
            seen = lease in self._cancel_seen
        if seen:
            control.request_cancel()
        return control

    def progress(self, lease: LeaseRef, done: float, total: Optional[float], note: str) -> None:
        """A handler's progress report: the latest one goes with the next heartbeat."""
        with self._lock:
            if lease not in self._held:
                return
            self._progress[lease] = ProgressRef(lease.id, lease.lease_token, done, total, note)
        metrics.progress_reported(self.spec.topic, done, total)
        self._nudge.set()

    def cancel_signalled(self) -> None:
        """A broker marked running messages of this topic: beat every held lease soon, to learn
        whether they are among them (called from the coordinator's thread: it must not wait)."""
        with self._lock:
            if not self._held:
                return  # nothing running or waiting here: nothing to learn
            self._cancel_signalled = True
        self._nudge.set()

    def before_start(self, delivery: Delivery, extend: bool = True) -> StartCheck:
        """LOST (and counted stale) when a heartbeat found the lease gone while it waited, or
        when its short lease may run out soon and the broker refused to extend it (without
        ``extend``, an event loop's caller that must not wait for a call: not started either; it
        is then no longer beaten, and delivered again once its lease runs out). UNCONFIRMED when
        that extension's call failed (the brokers or their database away): not to be started
        yet, and still beaten, so once they answer again it starts (see :meth:`forget`)."""
        lease = LeaseRef(delivery.id, delivery.lease_token)
        with self._lock:
            lost = lease in self._lost
            self._lost.discard(lease)
            until = self._short.get(lease)
        if not lost and until is not None and until - time.monotonic() < self.hold_seconds / 2:
            # The beats of short leases have been failing (or late): extend this one by ttr
            # before it starts; started on a lease that may have run out, it could run twice.
            called = self._beat([lease], self.spec.ttr) if extend else None
            with self._lock:
                lost = lease in self._lost
                self._lost.discard(lease)
                if called is False and not lost:
                    return StartCheck.UNCONFIRMED
                lost = lost or not called
                if lost:
                    self._held.discard(lease)
                    self._short.pop(lease, None)
        if lost:
            self.stale += 1
        return StartCheck.LOST if lost else StartCheck.START

    def forget(self, delivery: Delivery) -> None:
        """Stop beating a held message that will not be started (its worker stops while its
        lease is UNCONFIRMED): it is delivered again once its lease runs out."""
        lease = LeaseRef(delivery.id, delivery.lease_token)
        with self._lock:
            self._held.discard(lease)
            self._short.pop(lease, None)
            self._lost.discard(lease)

    def touch(self, lease: LeaseRef, ttr: float) -> bool:
        """``message.touch(ttr)``: extend now, and keep a longer ttr for later heartbeats so they
        do not shorten the lease the handler asked for."""
        extended = self.link.touch(lease.id, lease.lease_token, ttr)
        with self._lock:
            if extended and ttr > self.spec.ttr and lease in self._held:
                self._touched[lease] = ttr
            else:
                self._touched.pop(lease, None)
        return extended

    # -- heartbeats --------------------------------------------------------------------------
    def _loop(self) -> None:
        # Every ttr/3: a lease then always has two thirds of its life left when it is extended,
        # so one failed heartbeat (a broker failing over) does not lose it. Progress reports
        # bring the heartbeat of their leases forward, to at most one per PROGRESS_EVERY.
        # Short leases (``hold``) are beaten every hold/3 while there are any.
        period = self.spec.ttr / 3
        next_full = time.monotonic() + period
        while not self._stop.is_set():
            now = time.monotonic()
            with self._lock:
                pending = bool(self._progress)
                short = self._next_short if self._short else math.inf
                cancels = self._cancel_sent + CANCEL_EVERY if self._cancel_signalled else math.inf
            wake = min(next_full, short, self._progress_sent + PROGRESS_EVERY if pending else math.inf, cancels)
            if wake > now:
                self._nudge.wait(wake - now)
                self._nudge.clear()
                continue
            if now >= cancels:
                with self._lock:
                    self._cancel_signalled = False
                self._cancel_sent = now
            if now >= next_full:
                failed = self.beat()
                next_full = time.monotonic() + period
            else:
                with self._lock:
                    only = set(self._progress) | (set(self._short) if now >= short else set())
                    if now >= cancels:
                        only |= self._held
                failed = self.beat(only)
            if now >= short:
                # From this beat's start, not its end: a beat extends a short lease from the
                # moment it is sent, so under load (a beat of many leases taking 0.1-0.2 s) beats
                # timed from their end came so far apart that a held message falling due while
                # one was in flight had less than hold/2 left, and waited for a call of its own.
                with self._lock:
                    self._next_short = (time.monotonic() + SHORT_RETRY) if failed else (now + self.hold_seconds / 3)
            if pending:
                self._progress_sent = time.monotonic()

    def beat(self, only: Optional[set[LeaseRef]] = None) -> bool:
        """Extend every lease held now (or those of ``only``) in one call (one per ttr when a
        handler lengthened its lease with ``touch``; held messages not started by ``hold``), with
        the progress reports waiting; forget (and report) those found lost, tell the runs whose
        cancel was requested. Returns True when a call that carried short leases failed."""
        with self._lock:
            by_ttr: dict[float, list[LeaseRef]] = {}
            shorts: set[float] = set()  # the calls that carry short leases
            for lease in self._held | self._reporting:
                if only is None or lease in only:
                    waiting = lease in self._short and lease not in self._controls and lease not in self._reporting
                    ttr = self.hold_seconds if waiting else self._touched.get(lease, self.spec.ttr)
                    by_ttr.setdefault(ttr, []).append(lease)
                    if lease in self._short:
                        shorts.add(ttr)
            progress, self._progress = self._progress, {}
        failed = False
        for ttr, leases in by_ttr.items():
            if (not self._beat(leases, ttr, [progress[lease] for lease in leases if lease in progress])
                    and ttr in shorts):
                failed = True
        return failed

    def _beat(self, leases: list[LeaseRef], ttr: float, progress: Sequence[ProgressRef] = ()) -> Optional[bool]:
        """One heartbeat call; False when it failed (the brokers or their database away), None
        when a broker refused it: either way the leases stay as they were."""
        # One call always fits: at most threads + batch (2,024) leases plus the outcomes on their
        # way, and MAX_BATCH is 10,000.
        heartbeat = getattr(self.link, "heartbeat", None)
        sent = time.monotonic()
        try:
            if heartbeat is not None:
                reply = heartbeat(leases, ttr, self._consumer(), progress, timeout=self._drain.call_timeout())
                extended, flags = reply.extended, reply.cancel_requested
            else:  # a link without results: no progress sent, no cancel flags
                extended = self.link.extend(leases, ttr, self._consumer(), timeout=self._drain.call_timeout())
                flags = [False] * len(leases)
        except RetriableError as exc:  # the pool logs an outage once
            log.debug("heartbeat of %d lease(s) of %s failed (%s)", len(leases), self.spec.topic, exc)
            if isinstance(exc, StorageUnavailableError) and len(leases) > SMALLEST:
                half = len(leases) // 2  # each half once, now: see SMALLEST
                first = self._beat(leases[:half], ttr, progress)
                return self._beat(leases[half:], ttr, progress) and first
            return False
        except TidemqError as exc:
            log.info("heartbeat of %d lease(s) of %s refused (%s); next one in %.1f s",
                     len(leases), self.spec.topic, exc, self.spec.ttr / 3)
            return None
        lost = []
        stop: list[RunControl] = []
        with self._lock:
            for lease, flag in zip(leases, flags):
                if flag and lease in self._controls:
                    stop.append(self._controls[lease])
                elif flag and lease in self._held:
                    self._cancel_seen.add(lease)
            for lease, ok in zip(leases, extended):
                if ok and ttr == self.hold_seconds and lease in self._short:
                    self._short[lease] = sent + self.hold_seconds  # still waiting: short again
                    continue
                self._short.pop(lease, None)  # extended by ttr (started, or about to), or lost
                # Only a lease still waiting for (or in) its handler is reported here. One whose
                # outcome is on its way was either recorded meanwhile (so not extended) or lost,
                # which its ack will say.
                if not ok and lease in self._held:
                    self._held.discard(lease)
                    self._touched.pop(lease, None)
                    self._lost.add(lease)
                    lost.append(lease.id)
        for control in stop:
            control.request_cancel()
        for msg_id in lost:
            log.warning("lease of message %d of %s was lost (expired or taken over): its ack will be "
                        "refused as STALE", msg_id, self.spec.topic,
                        extra={"tidemq_message_id": msg_id, "tidemq_topic": self.spec.topic})
        return True
