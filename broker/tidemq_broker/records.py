"""The values the storage takes and returns (``tidemq_broker.storage`` names the operations).

Plain data: every storage implementation (SQL, memory) and every caller shares these, so none of
them depends on an implementation's own types. All times are naive UTC datetimes (see
``tidemq.clock``); all durations are seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Mapping, NamedTuple, Optional

from tidemq.lifecycle import DEFAULT_MAX_DELIVERIES, DEFAULT_RETENTION_DAYS

from .lock_records import FlowLimits, HandOff, LeasedBatch, LeasedMessage, LockHint, LockRequest, Shard

__all__ = [
    "NewRow", "RequestRef", "RecentInserts", "LockHint", "Shard", "LockRequest", "StoredMessage", "LeasedMessage",
    "LeasedBatch", "HandOff",
    "TopicSettings", "FlowLimits", "MessageFilter", "MessageEdit", "Backlog", "OutageGrace", "Schedule",
    "Principal", "SessionUser", "AdminUser", "MessagePage", "TopicBacklog", "TopicCounts", "SCAN_WINDOW",
    "COUNTED_FROM", "hours_ago", "add_released", "WorkflowStep", "WorkflowRecord",
]


@dataclass(frozen=True)
class NewRow:
    """A validated message ready to insert."""

    topic: str
    data: str
    effect_time: datetime
    retry_remaining: int
    retry_schedule: Optional[list[float]] = None
    unique_key: Optional[str] = None
    trace_context: Optional[str] = None  # the producer's W3C traceparent (``tidemq.tracing``)
    priority: int = 0  # higher first among due messages
    flow_key: Optional[str] = None  # counted by the topic's max_running_per_key


@dataclass(frozen=True)
class WorkflowStep:
    """A validated message ready to insert with its dependencies: ``depends_on``, ids of stored
    messages; ``after``, positions of other steps of the same submission (a DAG's edges before
    the ids exist). A step with neither is a plain NEW message of the submission. ``wait_mode``:
    see ``tidemq.dependencies.WaitMode``."""

    row: NewRow
    depends_on: tuple[int, ...] = ()
    after: tuple[int, ...] = ()
    wait_mode: int = 0  # tidemq.dependencies.WaitMode: what its dependencies' failures do to it


@dataclass(frozen=True)
class WorkflowRecord:
    """A workflow's row (``tidemq_workflow``): its failure policy, its state
    (``tidemq.dependencies.WorkflowState``), its steps (``steps_total``; ``steps_left`` not
    ended yet; ``steps_failed`` ended FAIL or CANCELLED), when it was submitted and ended."""

    id: int
    policy: str
    state: str
    steps_total: int
    steps_left: int
    steps_failed: int
    created_at: datetime
    finished_at: Optional[datetime]


class RecentInserts(NamedTuple):
    """What ``Storage.recent_inserts`` read: the rows by topic and priority, as ``(topic,
    priority, earliest effect_time, ascending ids)``, and the highest id in the table then."""

    groups: list[tuple[str, int, datetime, list[int]]]
    top: int


@dataclass(frozen=True)
class RequestRef:
    """Rows ``start`` to ``start + count`` of an insert are one Produce call named ``request_id``."""

    request_id: str
    start: int
    count: int


@dataclass
class StoredMessage:
    """A message row as stored."""

    id: int
    topic: str
    data: str
    status: str
    effect_time: datetime
    order_time: datetime
    retry_remaining: int
    retry_schedule: Optional[list[float]]
    attempt: int
    ttr: Optional[int]
    lease_token: Optional[str]
    lease_expire: Optional[datetime]
    consumer: Optional[str]
    unique_key: Optional[str]
    version: int
    trace: str
    add_time: datetime
    update_time: datetime
    start_time: Optional[datetime]
    finish_time: Optional[datetime]
    trace_context: Optional[str] = None
    priority: int = 0
    flow_key: Optional[str] = None
    result: Optional[str] = None
    progress: Optional[str] = None
    cancel_requested: bool = False
    deps_left: int = 0
    workflow_id: Optional[int] = None
    wait_mode: int = 0
    deps_failed: int = 0


@dataclass(frozen=True)
class MessageResult:
    """What a result waiter reads of a message: its status, its result (the handler's return
    value on SUCCESS, its error after a failure; JSON text), its latest progress (JSON) and
    whether a cancel of it was requested."""

    id: int
    topic: str
    status: str
    result: Optional[str]
    progress: Optional[str]
    effect_time: datetime
    finish_time: Optional[datetime]
    cancel_requested: bool = False


@dataclass
class TopicSettings:
    """Per-topic settings (the topic table); defaults apply to topics never configured."""

    name: str
    retry_count: int = 3
    retry_base: float = 10.0
    retry_max: float = 3600.0
    ttr: int = 60
    retention_days: int = DEFAULT_RETENTION_DAYS
    max_data_bytes: Optional[int] = None
    paused: bool = False
    archive: bool = False
    alarm_backlog: Optional[int] = None
    alarm_failure_rate: Optional[float] = None
    alarm_due_age: Optional[int] = None
    description: str = ""
    max_deliveries: int = DEFAULT_MAX_DELIVERIES
    max_running: Optional[int] = None
    rate_per_second: Optional[float] = None
    max_running_per_key: Optional[int] = None
    result_retention_seconds: Optional[int] = None

    @property
    def limits(self) -> Optional["FlowLimits"]:
        """The topic's flow limits, or None when it has none (its lock then takes no topic lock)."""
        limits = FlowLimits(self.max_running, self.rate_per_second, self.max_running_per_key)
        return limits if limits.any else None


@dataclass
class MessageFilter:
    """Criteria for listing messages (console, requeue by filter); None means any."""

    topic: Optional[str] = None
    status: Optional[str] = None
    id: Optional[int] = None
    unique_key: Optional[str] = None
    effect_from: Optional[datetime] = None
    effect_to: Optional[datetime] = None
    added_from: Optional[datetime] = None
    added_to: Optional[datetime] = None
    text: Optional[str] = None


@dataclass(frozen=True)
class MessageEdit:
    """New values for a message's editable fields (an operator's edit); None leaves a field as it is."""

    data: Optional[str] = None
    status: Optional[str] = None
    retry_remaining: Optional[int] = None
    effect_time: Optional[datetime] = None


@dataclass(frozen=True)
class Backlog:
    """One topic's pending work at a moment: NEW messages due and not yet due, RUNNING ones, and
    the effect_time of the oldest due NEW message (None when none is due)."""

    topic: str
    due: int
    scheduled: int
    running: int
    oldest_due: Optional[datetime]


@dataclass(frozen=True)
class OutageGrace:
    """Leases that ran out while the database could not be reached, from ``since`` (the last
    lease expiry that reached it) to ``back`` (the first one after the outage). Their holders
    could not extend them meanwhile, however alive, so each is held until ``back`` plus its own
    ttr: time for a heartbeat, or for an outcome the holder kept, to arrive."""

    since: datetime
    back: datetime


@dataclass(frozen=True)
class Schedule:
    """A periodic message (``tidemq_broker.schedules`` checks and ticks it).

    ``cron`` has 5 fields, or 6 with seconds first, read in ``timezone`` (an IANA name).
    ``data`` is JSON text; ``retry`` None means the topic's default. ``missed``: what a tick
    missed in an outage becomes, ``once`` (the latest one is produced) or ``skip``. Ticks after
    ``ticks_from`` are due; ``last_tick`` is the latest one handled."""

    name: str
    topic: str
    cron: str
    timezone: str = "UTC"
    data: str = "null"
    retry: Optional[int] = None
    missed: str = "once"
    paused: bool = False
    ticks_from: Optional[datetime] = None
    last_tick: Optional[datetime] = None
    add_time: Optional[datetime] = None
    update_time: Optional[datetime] = None


# -- the brokers' principals and the console's records --------------------------------------
@dataclass(frozen=True)
class Principal:
    """One principal: its role, the topic patterns it covers, whether it was revoked."""

    name: str
    role: str
    topics: tuple[str, ...]
    token_hash: str
    created: datetime
    revoked: Optional[datetime] = None


@dataclass(frozen=True)
class SessionUser:
    """The user a live console session belongs to, as stored now (a changed role applies at once)."""

    name: str
    role: str


@dataclass(frozen=True)
class AdminUser:
    """A console user; ``role`` is ``admin`` (may change things) or ``viewer`` (may look)."""

    name: str
    password_hash: str
    role: str


#: Ids examined per console page when a filter has no index (text, time ranges): bounds a page's cost.
SCAN_WINDOW = 50_000
#: A status with at least this many messages in the leader's stored count is shown from that
#: count (refreshed every ~10 s) instead of being counted on each page view: counting 10,000
#: index entries takes a few milliseconds.
COUNTED_FROM = 10_000


@dataclass
class MessagePage:
    """One page of messages, newest id first.

    ``next_before_id`` continues the list (None: nothing older). ``scanned_from`` is the lowest
    id examined when the filter needed a bounded scan; the page may then hold fewer rows than
    asked while older matches still exist.
    """

    messages: list[StoredMessage]
    next_before_id: Optional[int]
    scanned_from: Optional[int] = None


@dataclass
class TopicBacklog:
    """NEW messages of a topic: due now, due later, and the effect time of the oldest due one."""

    due: int = 0
    scheduled: int = 0
    oldest_due: Optional[datetime] = None


@dataclass(frozen=True)
class TopicCounts:
    """Messages per topic and status; ``stored`` names the statuses taken from the leader's
    count of ``counted_at`` (None: everything was counted just now)."""

    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    stored: list[str] = field(default_factory=list)
    counted_at: Optional[datetime] = None


def hours_ago(now: datetime, hours: int) -> datetime:
    """The start of the hour ``hours`` before ``now`` (the hourly report rows' windows)."""
    return now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=hours)


def add_released(released: Optional[dict[str, dict[int, int]]], freed: Mapping[int, tuple[str, int]]) -> None:
    """Add the steps a storage call released, ``freed`` ({id: (topic, priority)}), to the
    ``released`` its caller gave ({topic: {id: priority}}; None: not asked for)."""
    if released is not None:
        for id, (topic, priority) in sorted(freed.items()):
            released.setdefault(topic, {})[id] = priority
