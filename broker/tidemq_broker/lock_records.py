"""The values of one lock: what it reads (``Shard`` with its ``LockHint``), what it asks for
(``LockRequest``, with the topic's ``FlowLimits``) and what it returns (``LeasedBatch`` of
``LeasedMessage``); and the ``HandOff`` through which a commit leases to waiting pulls. Part of
``records``, which names them all; apart only to keep each module to one concept."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Iterable, Optional, Protocol, Sequence

__all__ = ["LockHint", "Shard", "FlowLimits", "LockRequest", "LeasedMessage", "LeasedBatch", "HandOff"]


@dataclass(frozen=True)
class LockHint:
    """What the broker knows of a topic that lets a lock read less (``tidemq_broker.hints``).

    ``floor``: no NEW message of the topic is due before it. ``priorities``: the priorities its
    NEW messages have (None: any). ``stranded`` > 0: also take other shards' messages due for
    longer than that many seconds, once the shard's own are taken. ``floors``: ``(priority,
    time)`` pairs, each above ``floor``: no NEW message of the shard's own with that priority is
    due before that time (the shard's cursor: where its previous locks left off). ``version``:
    the broker's count of what it had heard of the topic when it gave the hint (for
    ``LockHints.reached``); the storage ignores it. The default reads everything.
    """

    floor: Optional[datetime] = None
    priorities: Optional[frozenset[int]] = None
    stranded: float = 0.0
    floors: tuple[tuple[int, datetime], ...] = ()
    version: int = field(default=0, compare=False)

    def floor_of(self, priority: int) -> Optional[datetime]:
        """Where the shard's own range of ``priority`` starts (None: at the start)."""
        for p, when in self.floors:
            if p == priority:
                return when
        return self.floor


@dataclass(frozen=True)
class Shard:
    """The messages of ``topic`` one consumer's locks read: QUEUE shard ``rank`` of ``total``
    (``MOD(id DIV step, total) = rank``, see ``Probes.id_step``), where ``hint`` says they can be."""

    topic: str
    rank: int = 0
    total: int = 1
    hint: LockHint = LockHint()


@dataclass(frozen=True)
class FlowLimits:
    """A topic's flow control, enforced by the lock across every broker; None: no such limit.

    ``max_running``: RUNNING messages of the topic at once; ``rate_per_second``: leases (starts)
    per second; ``max_running_per_key``: RUNNING messages per producer key (``flow_key``)."""

    max_running: Optional[int] = None
    rate_per_second: Optional[float] = None
    max_running_per_key: Optional[int] = None

    @property
    def any(self) -> bool:
        return self.max_running is not None or self.rate_per_second is not None \
            or self.max_running_per_key is not None


@dataclass(frozen=True)
class LockRequest:
    """One lock of a pull: which messages (``shard``, at most ``limit``, due by ``now + ahead``)
    and the lease they get (``ttr`` seconds from their due time at the latest, held by
    ``consumer`` under ``lease_token``, or a fresh token when None; ``broker`` goes to the trace).

    ``limits``: the topic's flow limits as the caller last read them (None: it has none); the
    stored limits decide. A serial lock reads ``shard.topic`` only: the head of the topic."""

    shard: Shard
    consumer: str
    ttr: int
    now: datetime
    limit: int = 1
    ahead: float = 0.0
    lease_token: Optional[str] = None
    broker: str = ""
    limits: Optional[FlowLimits] = None
    hold: float = 0.0  # the lease until a handler starts, when shorter than ttr (``lifecycle.lease``)

    @property
    def topic(self) -> str:
        return self.shard.topic


@dataclass(frozen=True)
class LeasedMessage:
    """A message as a pull hands it out: what a consumer needs, without the trace.
    ``depends_on``: the messages it waited on (ascending ids), read only for a workflow's;
    ``workflow_id``: the workflow it is a step of (None: none)."""

    id: int
    topic: str
    data: str
    status: str
    effect_time: datetime
    retry_remaining: int
    attempt: int
    ttr: Optional[int]
    lease_token: str
    consumer: Optional[str]
    trace_context: Optional[str] = None
    priority: int = 0
    depends_on: tuple[int, ...] = ()
    workflow_id: Optional[int] = None


class LeasedBatch(list):  # type: ignore[type-arg]  # list[LeasedMessage]
    """What ``lock_batch`` leased, in delivery order, and where the lock left the shard.

    ``reached``: {priority: time} for each priority whose own range the lock read: no NEW
    message of the shard's own with that priority was due before that time when the lock read
    (none left behind by it). None: the lock cannot say (a flow-limited lock). The broker moves
    the shard's cursor there (``LockHints.reached``), so the next lock starts where this one
    left off instead of at the topic's floor.

    ``drained``: the lock read every message of the shard due by then (no range came back full)
    and leased all it read, so the shard has nothing else due until something changes, even when
    the batch is full (a pull of one message that took one). The next pull may then wait
    instead of locking again (``PullHub.locked``).
    """

    def __init__(self, leased: Iterable[LeasedMessage] = (),
                 reached: Optional[dict[int, datetime]] = None, drained: bool = False) -> None:
        super().__init__(leased)
        self.reached = reached
        self.drained = drained


class HandOff(Protocol):
    """Pulls waiting at this broker to which a transaction that makes messages due now leases
    them itself (``tidemq_broker.handoff``). The storage calls ``begin`` at the start of each run
    of the transaction (a rolled-back run's leases are void), ``takers`` once per topic with the
    messages it made due now, leases each pair it got inside the transaction and calls
    ``committed`` right after its COMMIT."""

    def begin(self) -> None:
        """A run of the transaction starts."""

    def takers(self, topic: str, due: Sequence[tuple[int, int, datetime]]) -> list[tuple[LockRequest, list[int]]]:
        """Which of ``due`` ((id, priority, effect_time) of messages of ``topic`` due now) go to
        which waiting pull: its lock request and the ids, in the lock's order."""

    def leased(self, request: LockRequest, messages: list[LeasedMessage]) -> None:
        """What the lease of ``request`` took, as ``lock_batch`` returns it."""

    def committed(self) -> None:
        """The transaction committed: the pulls may have what was leased to them."""
