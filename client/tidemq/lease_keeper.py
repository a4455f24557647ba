"""The leases one consumer holds, from its pull until a broker has recorded their outcome.

A heartbeat thread extends every lease held in one call every ttr/3: prefetched, running, and
finished ones whose outcome is still on its way. An ack thread sends outcomes in batches and
keeps each until a broker records it: a broker or database outage delays an outcome, it never
drops it, and its lease is beaten meanwhile. A message that finished during an outage therefore
does not run a second time once the outage ends (the brokers' lease expiry, for its part, holds
leases that ran out while the database was away: ``tidemq_broker.maintenance.leases``).

Only a stopping worker gives up, at the end of its drain: an outcome no broker took by then is
dropped, its lease expires and its message runs again, so a worker whose brokers are gone still
exits in time. Retried failures are not logged one by one: the broker pool says once that calls
fail and once that they work again.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable, Iterator, Optional, Sequence

from .consumer import ConsumerSpec
from .errors import RetriableError, StorageUnavailableError, TidemqError
from .link import AckItem, AckOutcome, BrokerLink, Delivery, LeaseRef

__all__ = ["LeaseKeeper"]

log = logging.getLogger(__name__)
_ACK_BATCH = 500
_RETRY_FIRST, _RETRY_MOST = 0.2, 2.0  # seconds between attempts to record outcomes: doubling, capped
_LAST_CALL = 0.2  # seconds a call may take once the drain's deadline has passed
# A call the brokers' database failed is sent again in halves, down to this many items: a long
# transaction is what connections killed every 100 ms never let finish, and a batch that grows
# while it fails would otherwise never get through (nor would the heartbeat of its leases).
_SMALLEST = 50


class LeaseKeeper:
    """Heartbeats and acks for one consumer; ``consumer()`` names it in calls, ``recorded(n)``
    is called after each batch of ``n`` outcomes was sent (or given up)."""

    def __init__(self, link: BrokerLink, spec: ConsumerSpec, consumer: Callable[[], str],
                 recorded: Callable[[int], None]) -> None:
        self.link = link
        self.spec = spec
        self._consumer = consumer
        self._recorded = recorded
        self._lock = threading.Lock()
        self._touched: dict[LeaseRef, float] = {}  # leases a handler lengthened with message.touch(ttr)
        self._held: set[LeaseRef] = set()  # prefetched or running
        self._reporting: set[LeaseRef] = set()  # finished: the outcome is on its way to a broker
        self._lost: set[LeaseRef] = set()  # leases a heartbeat found gone before the handler started
        self._acks: "queue.SimpleQueue[Optional[AckItem]]" = queue.SimpleQueue()
        self._beat_stop = threading.Event()
        self._drain = threading.Condition()
        self._deadline: Optional[float] = None  # time.monotonic() at which a stopping worker gives up
        self._dropped = 0  # outcomes given up at the end of a drain
        self._threads: list[threading.Thread] = []
        self.succeeded = self.failed = self.stale = 0

    def start(self) -> None:
        topic = self.spec.topic
        self._threads = [threading.Thread(target=self._ack_loop, name=f"tidemq-ack-{topic}", daemon=True),
                         threading.Thread(target=self._heartbeat_loop, name=f"tidemq-heartbeat-{topic}", daemon=True)]
        for thread in self._threads:
            thread.start()

    def drain_until(self, deadline: float) -> None:
        """The worker is stopping: calls made from now on end by ``deadline``
        (``time.monotonic()``), and outcomes no broker took by then are given up."""
        with self._drain:
            self._deadline = deadline
            self._drain.notify_all()

    def finish(self) -> None:
        """Send the outcomes still queued, trying until the drain's deadline, then stop beating.
        Outcomes no broker took by then are dropped (their leases expire)."""
        deadline = self._deadline if self._deadline is not None else time.monotonic()
        self._acks.put(None)
        ack, heartbeat = self._threads
        ack.join(max(deadline - time.monotonic(), 0.0) + _LAST_CALL + 1.0)
        self._beat_stop.set()
        heartbeat.join(max(deadline - time.monotonic(), 0.0) + _LAST_CALL + 1.0)
        if self._dropped:
            log.warning("gave up reporting %d outcome(s) of %s at the end of the drain: no broker took them; "
                        "their leases will expire and the messages run again", self._dropped, self.spec.topic)

    def call_timeout(self) -> Optional[float]:
        """The timeout of a call made now: the link's own, or what is left of a drain."""
        deadline = self._deadline
        return None if deadline is None else max(deadline - time.monotonic(), _LAST_CALL)

    # -- leases ------------------------------------------------------------------------------
    def hold(self, deliveries: Sequence[Delivery]) -> None:
        """Beat the leases of ``deliveries`` from now until their outcome is recorded."""
        with self._lock:
            self._held.update(LeaseRef(d.id, d.lease_token) for d in deliveries)

    def lost_before_start(self, delivery: Delivery) -> bool:
        """True (and counted stale) when a heartbeat found the lease gone while it waited."""
        lease = LeaseRef(delivery.id, delivery.lease_token)
        with self._lock:
            lost = lease in self._lost
            self._lost.discard(lease)
        if lost:
            self.stale += 1
        return lost

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

    def report(self, item: AckItem) -> None:
        """Queue a handler's outcome for the ack thread."""
        self._acks.put(item)

    # -- heartbeats --------------------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        # Every ttr/3: a lease then always has two thirds of its life left when it is extended,
        # so one failed heartbeat (a broker failing over) does not lose it.
        while not self._beat_stop.wait(self.spec.ttr / 3):
            self.beat()

    def beat(self) -> None:
        """Extend every lease held now in one call (one per ttr when a handler lengthened its
        lease with ``touch``); forget (and report) those found lost."""
        with self._lock:
            by_ttr: dict[float, list[LeaseRef]] = {}
            for lease in self._held | self._reporting:
                by_ttr.setdefault(self._touched.get(lease, self.spec.ttr), []).append(lease)
        for ttr, leases in by_ttr.items():
            self._beat_leases(leases, ttr)

    def _beat_leases(self, leases: list[LeaseRef], ttr: float) -> None:
        # One call always fits: at most threads + batch (2,024) leases plus the outcomes on their
        # way, and MAX_BATCH is 10,000.
        try:
            extended = self.link.extend(leases, ttr, self._consumer(), timeout=self.call_timeout())
        except RetriableError as exc:  # the pool logs an outage once
            log.debug("heartbeat of %d lease(s) of %s failed (%s)", len(leases), self.spec.topic, exc)
            if isinstance(exc, StorageUnavailableError) and len(leases) > _SMALLEST:
                half = len(leases) // 2  # each half once, now: see _SMALLEST
                self._beat_leases(leases[:half], ttr)
                self._beat_leases(leases[half:], ttr)
            return
        except TidemqError as exc:
            log.info("heartbeat of %d lease(s) of %s refused (%s); next one in %.1f s",
                     len(leases), self.spec.topic, exc, self.spec.ttr / 3)
            return
        lost = []
        with self._lock:
            for lease, ok in zip(leases, extended):
                # Only a lease still waiting for (or in) its handler is reported here. One whose
                # outcome is on its way was either recorded meanwhile (so not extended) or lost,
                # which its ack will say.
                if not ok and lease in self._held:
                    self._held.discard(lease)
                    self._touched.pop(lease, None)
                    self._lost.add(lease)
                    lost.append(lease.id)
        for msg_id in lost:
            log.warning("lease of message %d of %s was lost (expired or taken over): its ack will be "
                        "refused as STALE", msg_id, self.spec.topic,
                        extra={"tidemq_message_id": msg_id, "tidemq_topic": self.spec.topic})

    # -- acking ------------------------------------------------------------------------------
    def _ack_loop(self) -> None:
        while True:
            first = self._acks.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < _ACK_BATCH:  # coalesce whatever is already waiting, never wait
                try:
                    item = self._acks.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._acks.put(None)
                    break
                batch.append(item)
            try:
                self._send(batch)
            finally:
                self._recorded(len(batch))

    def _send(self, batch: list[AckItem]) -> None:
        refs = [LeaseRef(item.id, item.lease_token) for item in batch]
        with self._lock:
            self._held.difference_update(refs)
            self._reporting.update(refs)
        try:
            for part, outcomes in self._record(batch):
                self._count(part, outcomes)
        finally:
            with self._lock:
                self._reporting.difference_update(refs)
                for lease in refs:
                    self._touched.pop(lease, None)

    def _count(self, items: list[AckItem], outcomes: Optional[list[AckOutcome]]) -> None:
        for item, outcome in zip(items, outcomes or ()):
            if outcome is AckOutcome.STALE:
                self.stale += 1
                log.warning("ack of message %d refused: the lease was lost (it was or will be run elsewhere)", item.id)
            elif item.success:
                self.succeeded += 1
            else:
                self.failed += 1

    def _record(self, batch: list[AckItem]) -> Iterator[tuple[list[AckItem], Optional[list[AckOutcome]]]]:
        """Send ``batch`` until a broker records it; yield each part sent with its outcomes (None
        when refused or given up). A part the brokers' database failed goes again in halves."""
        parts, pause = [batch], _RETRY_FIRST
        while parts:
            part = parts[0]
            try:
                outcomes = self.link.ack(self.spec.topic, self._consumer(), part, timeout=self.call_timeout())
            except RetriableError as exc:  # the pool logs an outage once
                log.debug("ack of %d message(s) of %s failed (%s); trying again", len(part), self.spec.topic, exc)
                if isinstance(exc, StorageUnavailableError) and len(part) > _SMALLEST:
                    parts[0:1] = [part[:len(part) // 2], part[len(part) // 2:]]
            except TidemqError as exc:  # refused as a whole (a bug of ours): retrying cannot help
                log.error("ack of %d message(s) of %s refused (%s): they will be delivered again",
                          len(part), self.spec.topic, exc)
                parts.pop(0)
                yield part, None
                continue
            else:
                parts.pop(0)
                pause = _RETRY_FIRST
                yield part, outcomes
                continue
            with self._drain:
                over = self._deadline is not None and time.monotonic() >= self._deadline
                if not over:
                    wait = pause if self._deadline is None else min(pause, self._deadline - time.monotonic())
                    self._drain.wait(max(wait, 0.0))
            if over:  # a stopping worker's drain ran out: what is left is given up
                for left in parts:
                    self._dropped += len(left)
                    yield left, None
                return
            pause = min(pause * 2, _RETRY_MOST)
