"""Hand-offs: a commit that makes messages due leases them, in its own transaction, to the pulls
waiting for them at this broker.

An idle consumer's pull waits in its broker (``pulls.long_poll``). A message committed for it
used to travel: the commit, a wake-up, the pull's own lock (a transaction of three statements
and a commit), the reply. Now the transaction that makes it due (the group commit of Produce
calls, ``writer.py``; the ack whose SUCCESS releases a step, ``Acking.ack``) also leases it to
the waiting pull, under that pull's lease (consumer, ttr, lease token, ahead window), and the
pull replies as soon as that transaction has committed: one commit on the way instead of two.

Which pulls and which messages:

- only a pull of one QUEUE shard without flow limits (``Quiet``); serial topics and flow
  limits are decided by the lock itself, under the topic's row lock;
- only from the moment it has nothing to lock (its lock found nothing, or its shard was quiet)
  until it locks again, and not once something else was notified for it;
- only messages due within its ``ahead`` window, in the lock's order (priority, effect time,
  id), at most its pull size: those of its shard first, then, with room left, those of shards
  no pull here waits for (their owner waits at another broker or is busy: handing them to an
  idle consumer here spares the owner's broker a wake-up and a lock); the rest is left NEW and
  the pulls woken as before.

**Claims.** Before a transaction leases for a pull it claims it (``HandOffClaims.claim``), and
the pull does not end, even at its deadline, until the transaction has handed it its messages
(``hand``, right after the COMMIT, before the connection goes back to its pool) or let it go
(``unclaim``: nothing for it, rolled back, or failed). A transaction that runs again (a
deadlock, a connection lost before the COMMIT) keeps its claims and leases afresh
(``HandOff.begin``). A pull whose caller left meanwhile releases what it was handed, as after
its own lock; a caller that abandons a pull gives back what its lease token holds (a worker
does so on every cancelled pull). A COMMIT whose outcome is unknown (its connection lost) hands
nothing: what it may have leased waits for its lease to run out.

A busy broker has no sleeping pulls: its commits pay one look at the waiters of their topics.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime
from typing import TYPE_CHECKING, Iterable, Optional, Sequence

from tidemq import clock
from .records import LeasedMessage, LockRequest
from .waiters import Waiter, holds

if TYPE_CHECKING:
    from .waiters import Quiet

__all__ = ["HandOff", "HandOffClaims", "Handed"]

log = logging.getLogger(__name__)
_SETTLE_MOST = 60.0  # seconds a claimed pull waits for its claim's transaction, at most


class Handed(list):  # type: ignore[type-arg]  # list[LeasedMessage]
    """What a commit leased to a waiting pull: the pull's reply."""


class HandOffClaims:
    """The hub's side (``pulls.PullHub``): which sleeping pulls a transaction may lease to."""

    _lock: threading.Lock
    _settled: threading.Condition
    _waiters: dict[str, set[Waiter]]
    _quiet: dict[tuple[str, int, int, float], tuple[int, int]]
    _epoch: int
    _versions: dict[str, int]

    def open(self, waiter: Waiter) -> None:
        """``waiter`` has nothing to lock now: commits may claim it (when it takes hand-offs)."""
        if waiter.taker is not None:
            with self._lock:
                waiter.open = True

    def close(self, waiter: Waiter) -> Optional[Handed]:
        """No more claims of ``waiter``; wait for the one in progress to end. Returns what was
        handed to it."""
        if waiter.taker is None:
            return None
        with self._lock:
            waiter.open = False
            if not self._settled.wait_for(lambda: waiter.claimed is None, _SETTLE_MOST):
                log.error("a commit's hand-off to a pull of %s did not end within %.0f s", waiter.topic, _SETTLE_MOST)
                waiter.claimed = None
            return waiter.handed

    def claimable(self, topics: Iterable[str]) -> bool:
        """Whether a pull of any of ``topics`` waits here open to hand-offs now: a group commit
        under load, when every pull is busy locking, pays nothing more than this look."""
        with self._lock:
            return any(w.open for topic in topics for w in self._waiters.get(topic, ()))

    def claim(self, topic: str, owner: object) -> list[Waiter]:
        """The sleeping pulls of ``topic`` that take hand-offs, claimed for ``owner`` (with those
        it claimed before): none of them ends until ``hand`` or ``unclaim``."""
        with self._lock:
            found = []
            for waiter in self._waiters.get(topic, ()):
                if waiter.claimed is owner or (waiter.open and waiter.claimed is None and not waiter.event.is_set()):
                    if waiter.claimed is None:
                        waiter.claimed = owner
                        waiter.claimed_at = (self._epoch, self._versions.get(topic, 0))
                    found.append(waiter)
            return found

    def hand(self, owner: object, handed: dict[Waiter, tuple[list[LeasedMessage], bool]]) -> None:
        """``owner``'s transaction committed: each waiter in ``handed`` that it claimed gets its
        messages, its reply, and is free again."""
        with self._lock:
            for waiter, (messages, _) in handed.items():
                if waiter.claimed is owner and messages:
                    waiter.claimed = None
                    waiter.handed = Handed(messages)
                    waiter.event.set()
            self._settled.notify_all()

    def unclaim(self, owner: object, waiters: Iterable[Waiter]) -> None:
        """``owner``'s transaction ended: the waiters it claimed and handed nothing are free again."""
        with self._lock:
            for waiter in waiters:
                if waiter.claimed is owner:
                    waiter.claimed = None
            self._settled.notify_all()

    def still_quiet_after(self, quiet: "Quiet", claimed_at: tuple[int, int]) -> None:
        """A transaction leased to a pull of ``quiet``'s shard every message of that shard it
        made due, and has notified its topic. A shard quiet when the pull was claimed (at
        ``claimed_at``), whose topic only that transaction notified since, stays quiet: the
        pull's next call waits instead of locking (``PullHub.still_quiet``)."""
        epoch, version = claimed_at
        with self._lock:
            if self._quiet.get(quiet.shard) == (epoch, version) \
                    and (self._epoch, self._versions.get(quiet.topic, 0)) == (epoch, version + 1):
                self._quiet[quiet.shard] = (epoch, version + 1)

    def id_step(self) -> int:
        """The server's id step as last read (``waiters.holds``)."""
        raise NotImplementedError


class HandOff:
    """One transaction's hand-offs (``records.HandOff``): the pulls it claimed and what it leased
    to each. The storage calls ``committed`` right after the COMMIT; the caller calls
    ``finish`` after the transaction, committed or not, and after its notifications."""

    def __init__(self, hub: HandOffClaims, now: datetime) -> None:
        self._hub = hub
        self._now = now
        self._claimed: set[Waiter] = set()
        self._requests: dict[int, tuple[LockRequest, Waiter, int, bool]] = {}
        self._leased: dict[Waiter, tuple[list[LeasedMessage], bool]] = {}
        self._handed = False

    def begin(self) -> None:
        self._requests.clear()
        self._leased.clear()

    def takers(self, topic: str, due: Sequence[tuple[int, int, datetime]]) -> list[tuple[LockRequest, list[int]]]:
        waiters = self._hub.claim(topic, self)
        self._claimed.update(waiters)
        if not waiters:
            return []
        order = sorted(due, key=lambda d: (-d[1], d[2], d[0]))
        step, taken = self._hub.id_step(), set()
        plans: list[tuple[LockRequest, Waiter, list[int], bool, list[int]]] = []
        for waiter in waiters:
            assert waiter.taker is not None  # only such waiters are claimable
            request = waiter.taker(self._now)
            if request is None:
                continue
            due_by = clock.after(self._now, request.ahead)
            reach = [id for id, _, when in order if when <= due_by]
            mine = [id for id in reach
                    if id not in taken and (waiter.shard is None or holds(waiter.shard, (id,), step))]
            chosen = mine[:request.limit]
            taken.update(chosen)
            plans.append((request, waiter, chosen, len(chosen) == len(mine), reach))
        # A message of a shard whose pull does not wait here (it waits at another broker, or is
        # busy) goes to a pull here that has room: it starts now instead of after the other
        # broker's wake-up and lock. The shard rule stays what every lock reads; this only
        # spares an idle consumer's wait (its owner's next lock finds it taken, and moves on).
        here = {waiter.shard for _, waiter, _, _, _ in plans if waiter.shard is not None}
        found = []
        for request, waiter, chosen, every, reach in plans:
            room = request.limit - len(chosen)
            if room > 0 and waiter.shard is not None:
                extra = [id for id in reach if id not in taken and not any(holds(s, (id,), step) for s in here)][:room]
                if extra:
                    taken.update(extra)
                    picked = set(chosen).union(extra)
                    chosen = [id for id in reach if id in picked]  # in the lock's order
            if chosen:
                self._requests[id(request)] = (request, waiter, len(chosen), every)
                found.append((request, chosen))
        return found

    def leased(self, request: LockRequest, messages: list[LeasedMessage]) -> None:
        _, waiter, chosen, every = self._requests[id(request)]
        # Every message of its shard this transaction made due is its now (none held by
        # another transaction, none left over its pull size).
        self._leased[waiter] = (list(messages), every and len(messages) == chosen)

    def committed(self) -> None:
        """The transaction committed: its pulls reply at once."""
        self._handed = True
        self._hub.hand(self, self._leased)

    def finish(self, committed: bool) -> None:
        """The transaction ended (``committed`` or not): every claimed pull is free again, with
        what was leased to it if it committed; shards it emptied stay quiet."""
        if committed and not self._handed:
            self.committed()
        self._hub.unclaim(self, self._claimed)
        if committed:
            for waiter, (messages, whole) in self._leased.items():
                if messages and whole and waiter.quiet is not None:
                    self._hub.still_quiet_after(waiter.quiet, waiter.claimed_at)

    def leased_ids(self) -> set[int]:
        """The messages leased to pulls by the last run of the transaction."""
        return {m.id for messages, _ in self._leased.values() for m in messages}


def open_hand_off(hub: Optional[HandOffClaims], topics: Iterable[str], now: datetime) -> Optional[HandOff]:
    """A hand-off for a transaction about to make messages of ``topics`` due, or None when no
    pull of theirs waits open at ``hub`` (or there is no hub). An ack that may release steps
    makes its ``HandOff`` whatever the pulls do: the consumer's next pull often arrives with
    the ack, and the ack's transaction looks for it only once it has released something."""
    return HandOff(hub, now) if hub is not None and hub.claimable(topics) else None


def handed_out(released: dict[str, dict[int, int]], handoff: Optional[HandOff]) -> dict[str, dict[int, int]]:
    """``released`` ({topic: {id: priority}}) without what ``handoff`` leased: no pull needs waking
    (here or at another broker) for a message already on its way to one."""
    taken = handoff.leased_ids() if handoff is not None else set()
    if not taken:
        return released
    left = {topic: {id: p for id, p in ids.items() if id not in taken} for topic, ids in released.items()}
    return {topic: ids for topic, ids in left.items() if ids}
