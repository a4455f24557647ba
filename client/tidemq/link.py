"""What consumers exchange with brokers, as tidemq types (no protobuf past this line).

:class:`BrokerLink` is the set of calls a consumer makes. :class:`tidemq.client.Client` speaks
them over gRPC and :class:`tidemq.stub.StubBroker` in memory; the consumer runners only see
these types.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Callable, NamedTuple, Optional, Protocol, Sequence, runtime_checkable

__all__ = ["Delivery", "AckItem", "AckOutcome", "LeaseRef", "ProgressRef", "Heartbeat", "PullHandle", "BrokerLink"]


class Delivery(NamedTuple):
    """A leased message as a pull hands it out. ``data`` is the JSON text as stored.

    This and the other values a worker makes per message (:class:`AckItem`, :class:`LeaseRef`)
    are named tuples: as frozen dataclasses their construction, hash and comparison ran in
    Python, a twentieth of a worker's time per message."""

    id: int
    topic: str
    data: str
    effect_time: datetime
    retry_remaining: int
    attempt: int
    lease_token: str
    ttr: float
    trace_context: str = ""  # the producer's W3C traceparent ("": none), see tidemq.tracing
    depends_on: tuple[int, ...] = ()  # the messages it waited on, ascending ids (see tidemq.inputs)
    broker: str = ""  # the address of the broker that leased it ("": not known); its inputs are read there
    workflow_id: Optional[int] = None  # the workflow it is a step of (None: none)


class AckItem(NamedTuple):
    """One outcome reported by a consumer: success, or a failure with its error text, or (with
    ``cancelled``) a handler that stopped because its cancel was requested. ``result`` is JSON
    text: the handler's return value on success, the error (type, message, traceback) on a
    failure; None: nothing to store."""

    id: int
    lease_token: str
    success: bool
    error: str = ""
    result: Optional[str] = None
    cancelled: bool = False
    #: The message is a workflow's step (its delivery said so): the broker takes the ack's exact
    #: path for it at once instead of trying the fast one first. Only a hint: the broker checks.
    workflow: bool = False
    #: The workflow its delivery named: the broker records a step's success by one UPDATE that
    #: the row's workflow id guards, with no locking read first. A hint too: a wrong id costs a
    #: rolled-back statement, never a wrong outcome.
    workflow_id: Optional[int] = None


class AckOutcome(str, enum.Enum):
    """APPLIED: the outcome was recorded. STALE: refused, the lease was lost."""

    APPLIED = "APPLIED"
    STALE = "STALE"


class LeaseRef(NamedTuple):
    """One lease to extend: the message and the token it was leased under."""

    id: int
    lease_token: str


@dataclass(frozen=True)
class ProgressRef:
    """A handler's latest progress on one lease, sent with the next heartbeat."""

    id: int
    lease_token: str
    done: float
    total: Optional[float] = None
    note: str = ""


@dataclass(frozen=True)
class Heartbeat:
    """A heartbeat's answer, one bool per lease in order: whether it is still held
    (``extended``) and whether its message's cancel was requested."""

    extended: list[bool]
    cancel_requested: list[bool]


class PullHandle:
    """Cancels one long-poll from another thread (the consumer's rank changed, it is stopping).

    The caller makes a handle, passes it to :meth:`BrokerLink.pull` as ``track`` and may call
    :meth:`cancel` at any time, even before the pull is sent or after it returned. The link
    binds (:meth:`bind`) how to abandon the attempt in flight; a cancelled pull raises
    :class:`tidemq.errors.PullCancelledError` unless its reply had already arrived.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self._abort: Optional[Callable[[], None]] = None

    @property
    def cancelled(self) -> bool:
        """True once :meth:`cancel` was called."""
        with self._lock:
            return self._cancelled

    def cancel(self) -> None:
        """Abandon the pull: the attempt in flight now, or the next one as soon as it is bound."""
        with self._lock:
            self._cancelled = True
            abort = self._abort
        if abort is not None:
            abort()

    def bind(self, abort: Optional[Callable[[], None]]) -> None:
        """For links: ``abort`` abandons the attempt in flight (None when it ended).

        Binding to a handle already cancelled aborts at once, so a cancel that raced the send
        is never lost.
        """
        with self._lock:
            self._abort = abort
            cancelled = self._cancelled
        if abort is not None and cancelled:
            abort()


@runtime_checkable
class BrokerLink(Protocol):
    """The calls a consumer makes to the brokers. Every call may raise a
    :class:`tidemq.errors.TidemqError`; a :class:`~tidemq.errors.RetriableError` means the
    call may be made again. ``timeout`` (seconds; None: the link's default) bounds a call a
    stopping consumer makes within its drain."""

    def pull(self, topic: str, consumer: str, *, rank: int = 0, total: int = 1, serial: bool = False,
             max_messages: int = 100, wait: float = 5.0, ttr: float = 0.0, lease_token: str = "",
             track: Optional[PullHandle] = None, ahead: float = 0.0, hold: float = 0.0) -> list[Delivery]:
        """Lease up to ``max_messages`` due messages of shard ``MOD(id, total) = rank`` (serial:
        only the topic's head, when nothing of it is RUNNING), long-polling up to ``wait`` s.

        ``ahead`` > 0 also leases messages due within that many seconds; the caller must not
        start one before its ``effect_time`` (its lease covers the wait). ``hold``, when shorter
        than ``ttr``, is the lease instead: the caller extends a message by ``hold`` until it
        starts it, by ``ttr`` from then on, and must not start one whose lease may have run out.

        ``ttr`` is the lease length (0: the topic's default). ``lease_token`` (32 lowercase hex
        characters, empty: the broker picks) names the lease in advance, so whatever an abandoned
        pull locked can be given back with :meth:`release`. ``track`` lets another thread cancel
        the pull, which then raises :class:`~tidemq.errors.PullCancelledError`.
        """
        ...

    def ack(self, topic: str, consumer: str, items: Sequence[AckItem],
            timeout: Optional[float] = None) -> list[AckOutcome]:
        """Record outcomes in one transaction; one AckOutcome per item, in order."""
        ...

    def release(self, lease_token: str, consumer: str = "", timeout: Optional[float] = None) -> int:
        """Put the messages still leased under ``lease_token`` back to NEW; returns how many."""
        ...

    def extend(self, leases: Sequence[LeaseRef], ttr: float, consumer: str = "",
               timeout: Optional[float] = None) -> list[bool]:
        """Heartbeat: make each lease end ``ttr`` seconds from now; False where it was lost."""
        ...

    def touch(self, msg_id: int, lease_token: str, ttr: float) -> bool:
        """Extend one lease by ``ttr`` seconds from now; False when it was already lost."""
        ...
