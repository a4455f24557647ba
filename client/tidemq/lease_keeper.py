"""The leases one consumer holds, from its pull until a broker has recorded their outcome.

A heartbeat thread extends every lease held in one call every ttr/3: prefetched, running, and
finished ones whose outcome the :class:`~tidemq.ack_sender.AckSender` is still sending. A handler
may therefore run far longer than its ttr while its worker lives; a worker killed with -9 stops
beating, and its messages come back within ttr plus one period. A lease found lost before its
handler started is reported, so the runner does not start it.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Sequence

from .consumer import ConsumerSpec
from .drain import LAST_CALL, Drain
from .errors import RetriableError, StorageUnavailableError, TidemqError
from .link import BrokerLink, Delivery, LeaseRef

__all__ = ["LeaseKeeper", "SMALLEST"]

log = logging.getLogger(__name__)
# A call the brokers' database failed (a heartbeat, an ack batch) is sent again in halves, down to
# this many items: a long transaction is what connections killed every 100 ms never let finish,
# and a batch that grows while it fails would otherwise never get through (nor would the
# heartbeat of its leases).
SMALLEST = 50


class LeaseKeeper:
    """Heartbeats for one consumer; ``consumer()`` names it in calls."""

    def __init__(self, link: BrokerLink, spec: ConsumerSpec, consumer: Callable[[], str], drain: Drain) -> None:
        self.link = link
        self.spec = spec
        self._consumer = consumer
        self._drain = drain
        self._lock = threading.Lock()
        self._touched: dict[LeaseRef, float] = {}  # leases a handler lengthened with message.touch(ttr)
        self._held: set[LeaseRef] = set()  # prefetched or running
        self._reporting: set[LeaseRef] = set()  # finished: the outcome is on its way to a broker
        self._lost: set[LeaseRef] = set()  # leases a heartbeat found gone before the handler started
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"tidemq-heartbeat-{spec.topic}", daemon=True)
        self.stale = 0  # leases found lost before their handler started

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop beating (once every outcome was sent or given up)."""
        self._stop.set()
        self._thread.join(self._drain.left() + LAST_CALL + 1.0)

    # -- the leases held ---------------------------------------------------------------------
    def hold(self, deliveries: Sequence[Delivery]) -> None:
        """Beat the leases of ``deliveries`` from now until their outcome is recorded."""
        with self._lock:
            self._held.update(LeaseRef(d.id, d.lease_token) for d in deliveries)

    def reporting(self, leases: Sequence[LeaseRef]) -> None:
        """Their handlers are done and their outcomes on their way: keep beating them."""
        with self._lock:
            self._held.difference_update(leases)
            self._reporting.update(leases)

    def reported(self, leases: Sequence[LeaseRef]) -> None:
        """Their outcomes were recorded (or given up): stop beating them."""
        with self._lock:
            self._reporting.difference_update(leases)
            for lease in leases:
                self._touched.pop(lease, None)

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

    # -- heartbeats --------------------------------------------------------------------------
    def _loop(self) -> None:
        # Every ttr/3: a lease then always has two thirds of its life left when it is extended,
        # so one failed heartbeat (a broker failing over) does not lose it.
        while not self._stop.wait(self.spec.ttr / 3):
            self.beat()

    def beat(self) -> None:
        """Extend every lease held now in one call (one per ttr when a handler lengthened its
        lease with ``touch``); forget (and report) those found lost."""
        with self._lock:
            by_ttr: dict[float, list[LeaseRef]] = {}
            for lease in self._held | self._reporting:
                by_ttr.setdefault(self._touched.get(lease, self.spec.ttr), []).append(lease)
        for ttr, leases in by_ttr.items():
            self._beat(leases, ttr)

    def _beat(self, leases: list[LeaseRef], ttr: float) -> None:
        # One call always fits: at most threads + batch (2,024) leases plus the outcomes on their
        # way, and MAX_BATCH is 10,000.
        try:
            extended = self.link.extend(leases, ttr, self._consumer(), timeout=self._drain.call_timeout())
        except RetriableError as exc:  # the pool logs an outage once
            log.debug("heartbeat of %d lease(s) of %s failed (%s)", len(leases), self.spec.topic, exc)
            if isinstance(exc, StorageUnavailableError) and len(leases) > SMALLEST:
                half = len(leases) // 2  # each half once, now: see SMALLEST
                self._beat(leases[:half], ttr)
                self._beat(leases[half:], ttr)
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
