"""The pulls that wait in a broker (``pulls.PullHub``): one ``Waiter`` each, the shard it locks
in (``Quiet``), and which shard a message belongs to."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Callable, NamedTuple, Optional, Sequence

from .records import LeasedMessage, LockRequest

__all__ = ["Quiet", "Waiter", "Taker", "FOREVER", "holds"]

FOREVER = datetime.max

#: What a waiting pull lets a commit lease for it (``handoff.py``): its lock request at the time
#: given, or None when it takes nothing now (its topic paused, its caller gone).
Taker = Callable[[datetime], Optional[LockRequest]]


class Quiet(NamedTuple):
    """Which pulls may continue a previous one's wait: one shard of a topic (QUEUE, no flow
    limits), pulled with the same ``ahead`` window. ``limit``: what this pull's lock takes at
    most. It is not part of the shard: a lock that took fewer than it asked for took everything
    due, whatever size the next pull asks for (a worker asks for what its prefetch has room for,
    which changes with nearly every pull)."""

    topic: str
    rank: int
    total: int
    ahead: float
    limit: int

    @property
    def shard(self) -> tuple[str, int, int, float]:
        return self.topic, self.rank, self.total, self.ahead


class Waiter:
    """One sleeping pull.

    ``wake_at``: when it wakes by itself, plus its lead. Anything due by then must wake it, or
    it would reach the consumer less than the lead before its effect_time (or late).
    ``held``: it sleeps although messages may be due, held back by something a finished message
    frees (a serial topic's running head, a flow limit), so an ack wakes it.
    ``shard``: the (rank, total) its locks read (None: the whole topic). ``foreign``: it was woken
    only by messages of other shards (None: not by a notification naming messages).

    Hand-offs (``handoff.py``): ``taker`` (None: it takes none) and ``quiet`` (its shard), set at
    registration; ``open`` while a commit may claim it (it has nothing to lock); ``claimed``: the hand-off of the
    transaction that may lease messages for it, until that transaction ends; ``handed``: what it
    leased, the pull's reply; ``claimed_at``: the hub's (epoch, topic version) at the claim.
    """

    __slots__ = ("topic", "lead", "wake_at", "event", "held", "shard", "foreign", "taker", "quiet", "open",
                 "claimed", "handed", "claimed_at")

    def __init__(self, topic: str, lead: float = 0.0, shard: Optional[tuple[int, int]] = None,
                 taker: Optional[Taker] = None, quiet: Optional[Quiet] = None) -> None:
        self.topic = topic
        self.lead = lead
        self.wake_at = FOREVER  # until it sets a time, any notification wakes it
        self.event = threading.Event()
        self.held = False
        self.shard = shard
        self.foreign: Optional[bool] = None
        self.taker = taker
        self.quiet = quiet
        self.open = False
        self.claimed: Optional[object] = None
        self.handed: Optional[list[LeasedMessage]] = None
        self.claimed_at = (0, 0)


def holds(shard: tuple[int, int], ids: Sequence[int], step: int) -> bool:
    """Whether any of ``ids`` is in QUEUE shard ``shard`` (rank, total) by the storage's rule,
    ``MOD(id DIV step, total) = rank``. With a ``step`` not (yet) current, a message may be
    judged another shard's: its pull then reads the next due time first, which finds it."""
    rank, total = shard
    return any((id // step) % total == rank for id in ids)
