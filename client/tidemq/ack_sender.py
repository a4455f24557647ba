"""The outcomes one consumer's handlers reached, on their way to a broker.

An ack thread sends outcomes in batches and keeps each until a broker records it: a broker or
database outage delays an outcome, it never drops it, and the :class:`~tidemq.lease_keeper.LeaseKeeper`
beats its lease meanwhile. A message that finished during an outage therefore does not run a
second time once the outage ends (the brokers' lease expiry, for its part, holds leases that ran
out while the database was away: ``tidemq_broker.maintenance.leases``).

Only a stopping worker gives up, at the end of its drain: an outcome no broker took by then is
dropped, its lease expires and its message runs again, so a worker whose brokers are gone still
exits in time. Retried failures are not logged one by one: the broker pool says once that calls
fail and once that they work again.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable, Iterator, Optional

from .consumer import ConsumerSpec
from .drain import LAST_CALL, Drain
from .errors import RetriableError, StorageUnavailableError, TidemqError
from .lease_keeper import SMALLEST, LeaseKeeper
from .link import AckItem, AckOutcome, BrokerLink, LeaseRef

__all__ = ["AckSender"]

log = logging.getLogger(__name__)
_ACK_BATCH = 500
#: Seconds between attempts to record outcomes after the first retry, which goes at once (one lost
#: database connection, a KILL or a broker's restart, is over by then): doubling, capped.
_RETRY_FIRST, _RETRY_MOST = 0.2, 2.0


class AckSender:
    """Sends one consumer's outcomes; ``consumer()`` names it in calls, ``recorded(n)`` is called
    after each batch of ``n`` outcomes was sent (or given up). Counts what the brokers answered."""

    def __init__(self, link: BrokerLink, spec: ConsumerSpec, consumer: Callable[[], str], keeper: LeaseKeeper,
                 drain: Drain, recorded: Callable[[int], None]) -> None:
        self.link = link
        self.spec = spec
        self._consumer = consumer
        self._keeper = keeper
        self._drain = drain
        self._recorded = recorded
        self._acks: "queue.SimpleQueue[Optional[AckItem]]" = queue.SimpleQueue()
        self._dropped = 0  # outcomes given up at the end of a drain
        self._thread = threading.Thread(target=self._loop, name=f"tidemq-ack-{spec.topic}", daemon=True)
        self.succeeded = self.failed = self.stale = 0

    def start(self) -> None:
        self._thread.start()

    def report(self, item: AckItem) -> None:
        """Queue a handler's outcome."""
        self._acks.put(item)

    def finish(self) -> None:
        """Send the outcomes still queued, trying until the drain's deadline; those no broker took
        by then are dropped (their leases expire)."""
        self._acks.put(None)
        self._thread.join(self._drain.left() + LAST_CALL + 1.0)
        if self._dropped:
            log.warning("gave up reporting %d outcome(s) of %s at the end of the drain: no broker took them; "
                        "their leases will expire and the messages run again", self._dropped, self.spec.topic)

    def _loop(self) -> None:
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
        self._keeper.reporting(refs)
        try:
            for part, outcomes in self._record(batch):
                self._count(part, outcomes)
        finally:
            self._keeper.reported(refs)

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
        parts, pause = [batch], 0.0
        while parts:
            part = parts[0]
            try:
                outcomes = self.link.ack(self.spec.topic, self._consumer(), part, timeout=self._drain.call_timeout())
            except RetriableError as exc:  # the pool logs an outage once
                log.debug("ack of %d message(s) of %s failed (%s); trying again", len(part), self.spec.topic, exc)
                if isinstance(exc, StorageUnavailableError) and len(part) > SMALLEST:
                    parts[0:1] = [part[:len(part) // 2], part[len(part) // 2:]]
            except TidemqError as exc:  # refused as a whole (a bug of ours): retrying cannot help
                log.error("ack of %d message(s) of %s refused (%s): they will be delivered again",
                          len(part), self.spec.topic, exc)
                parts.pop(0)
                yield part, None
                continue
            else:
                parts.pop(0)
                pause = 0.0
                yield part, outcomes
                continue
            if self._drain.pause(pause):  # a stopping worker's drain ran out: what is left is given up
                for left in parts:
                    self._dropped += len(left)
                    yield left, None
                return
            pause = min(max(pause * 2, _RETRY_FIRST), _RETRY_MOST)
