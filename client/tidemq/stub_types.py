"""What :class:`tidemq.stub.StubBroker` takes and hands out: topic settings, copies of stored
messages for tests to read, records of pull calls, and the deliveries a pull returns."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Optional

from . import lifecycle
from .clock import truncate_ms
from .lifecycle import MessageStatus
from .link import Delivery
from .tables import MESSAGE as M

__all__ = ["StubTopic", "StubMessage", "PullRecord", "stored_time", "delivery_of"]


@dataclass
class StubTopic:
    """A topic's settings, with the broker's defaults (``retry_base``, ``retry_max``: the
    backoff :func:`tidemq.lifecycle.next_delay` reads). ``paused``: pulls take nothing."""

    retry_count: int = lifecycle.DEFAULT_RETRY_COUNT
    retry_base: float = lifecycle.DEFAULT_RETRY_BASE
    retry_max: float = lifecycle.DEFAULT_RETRY_MAX
    ttr: float = lifecycle.DEFAULT_TTR
    max_deliveries: int = lifecycle.DEFAULT_MAX_DELIVERIES
    paused: bool = False


@dataclass(frozen=True)
class StubMessage:
    """A copy of a stored message; times in seconds since the epoch (0.0: none). ``extended``
    counts the heartbeats and touches that extended its lease; ``error`` is its last failure's
    text as the consumer sent it (the trace holds it flattened)."""

    id: int
    topic: str
    data: str
    status: MessageStatus
    effect_time: float
    order_time: float
    retry_remaining: int
    retry_schedule: Optional[list[float]]
    attempt: int
    priority: int
    lease_token: str
    lease_expire: float
    ttr: float
    consumer: str
    trace_context: str
    trace: str
    version: int
    leased_at: float  # when its last lease was taken
    extended: int = 0
    error: str = ""

    @classmethod
    def of(cls, row: dict[str, Any], extended: int = 0, error: str = "") -> "StubMessage":
        """A copy of the message held as ``row`` ({column of tidemq.tables.MESSAGE: value})."""
        return cls(id=row[M.id], topic=row[M.topic], data=row[M.data], status=MessageStatus(row[M.status]),
                   effect_time=_seconds(row[M.effect_time]), order_time=_seconds(row[M.order_time]),
                   retry_remaining=row[M.retry_remaining], retry_schedule=row[M.retry_schedule],
                   attempt=row[M.attempt], priority=row[M.priority], lease_token=row[M.lease_token] or "",
                   lease_expire=_seconds(row[M.lease_expire]), ttr=row[M.ttr] or 0.0, consumer=row[M.consumer] or "",
                   trace_context=row[M.trace_context] or "", trace=row[M.trace], version=row[M.version],
                   leased_at=_seconds(row[M.start_time]), extended=extended, error=error)


@dataclass
class PullRecord:
    """One pull call. ``running_before``: RUNNING messages of the topic when it was made.
    ``outcome``: "waiting" while it long-polls, then "leased", "empty" or "cancelled"."""

    consumer: str
    rank: int
    total: int
    serial: bool
    lease_token: str
    running_before: int
    outcome: str = "waiting"
    ids: tuple[int, ...] = ()


def stored_time(moment: float | datetime) -> datetime:
    """Seconds since the epoch, or an aware datetime, as the broker stores a time (naive UTC,
    milliseconds)."""
    if not isinstance(moment, datetime):
        moment = datetime.fromtimestamp(moment, timezone.utc)
    return truncate_ms(moment.astimezone(timezone.utc).replace(tzinfo=None))


def _seconds(moment: Optional[datetime]) -> float:
    return moment.replace(tzinfo=timezone.utc).timestamp() if moment is not None else 0.0


def delivery_of(row: dict[str, Any], depends_on: tuple[int, ...] = (), workflow_id: Optional[int] = None) -> Delivery:
    """The leased message held as ``row``, as a pull hands it out (naming the messages it
    waited on, ``depends_on``, and its workflow, ``workflow_id``)."""
    return Delivery(id=row[M.id], topic=row[M.topic], data=row[M.data],
                    effect_time=row[M.effect_time].replace(tzinfo=timezone.utc), retry_remaining=row[M.retry_remaining],
                    attempt=row[M.attempt], lease_token=row[M.lease_token], ttr=float(row[M.ttr]),
                    trace_context=row[M.trace_context] or "", depends_on=depends_on, workflow_id=workflow_id)
