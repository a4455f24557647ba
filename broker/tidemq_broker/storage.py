"""The storage interface: every database operation tidemq performs is one named method here.

Each transition of a message is one operation (lease, ack, release, extend, expire, requeue,
cancel, an operator's edit or delete, retention) and applies what ``tidemq.lifecycle`` decides
for it; the rest are reads and the probes the pull hub needs. ``tidemq_broker.storages`` holds
the SQL implementation (MySQL/MariaDB for production, SQLite for ``tidemq dev``) and its
factory; both dialects pass tests/conformance/test_storage.py. No other module speaks SQL.
All times are naive UTC datetimes (see ``tidemq.clock``); all durations are seconds.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from datetime import datetime
from typing import Callable, NamedTuple, Optional, Sequence

from tidemq.lifecycle import DEFAULT_MAX_DELIVERIES, DEFAULT_RETENTION_DAYS, Event
from tidemq.link import AckItem, AckOutcome

__all__ = [
    "NewRow",
    "RequestRef",
    "RecentInserts",
    "LockHint",
    "StoredMessage",
    "LeasedMessage",
    "TopicSettings",
    "FlowLimits",
    "MessageFilter",
    "MessageEdit",
    "Backlog",
    "OutageGrace",
    "Schedule",
    "Storage",
    "AckItem",
    "AckOutcome",
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
class LockHint:
    """What the broker knows of a topic that lets a lock read less (``tidemq_broker.hints``).

    ``floor``: no NEW message of the topic is due before it. ``priorities``: the priorities its
    NEW messages have (None: any). ``stranded`` > 0: also take other shards' messages due for
    longer than that many seconds, once the shard's own are taken. The default reads everything.
    """

    floor: Optional[datetime] = None
    priorities: Optional[frozenset[int]] = None
    stranded: float = 0.0


class RecentInserts(NamedTuple):
    """What ``Storage.recent_inserts`` read: the rows ``(id, topic, effect_time, priority)``, and
    the highest id in the table then."""

    rows: list[tuple[int, str, datetime, int]]
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


@dataclass(frozen=True)
class LeasedMessage:
    """A message as a pull hands it out: what a consumer needs, without the trace."""

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

    @property
    def limits(self) -> Optional["FlowLimits"]:
        """The topic's flow limits, or None when it has none (its lock then takes no topic lock)."""
        limits = FlowLimits(self.max_running, self.rate_per_second, self.max_running_per_key)
        return limits if limits.any else None


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


class Storage(abc.ABC):
    """The message store. Each method is one transaction unless it says otherwise."""

    # -- schema and connection ---------------------------------------------------------------
    @abc.abstractmethod
    def create_schema(self) -> None:
        """Create the tables and indexes that are missing (idempotent). An empty database is
        stamped with the current schema version; an older schema is left to ``migrate``."""

    @abc.abstractmethod
    def schema_version(self) -> int:
        """The highest schema version applied (0 when none is recorded)."""

    @abc.abstractmethod
    def migrate(self, version: int) -> None:
        """Apply the schema step to ``version`` (one above the current) and record it."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release all connections."""

    @abc.abstractmethod
    def ping(self) -> None:
        """Raise StorageUnavailableError unless the database answers."""

    # -- transitions (tidemq.lifecycle decides each one) -------------------------------------
    @abc.abstractmethod
    def insert_messages(self, rows: Sequence[NewRow], now: datetime, requests: Sequence[RequestRef] = (),
                        **who: object) -> list[int]:
        """Produce: insert ``rows`` as NEW in one transaction and return their ids in order.

        A row whose (topic, unique_key) is already stored is not inserted again; its existing
        id is returned. Either every row is stored or none is. ``who`` goes to the trace.
        ``requests`` name Produce calls among the rows: a call whose request id is already
        stored (committed before, here or through another broker) stores nothing and gets the
        ids it was first answered; the others' request ids are stored in the same transaction.
        """

    @abc.abstractmethod
    def delete_produce_requests(self, before: datetime, limit: int) -> int:
        """Forget up to ``limit`` request ids stored before ``before``; returns how many."""

    @abc.abstractmethod
    def lock_batch(self, topic: str, rank: int, total: int, limit: int, ttr: int, consumer: str, now: datetime,
                   lease_token: Optional[str] = None, broker: str = "", ahead: float = 0.0,
                   limits: Optional[FlowLimits] = None, hint: LockHint = LockHint()) -> list[LeasedMessage]:
        """Lease up to ``limit`` NEW messages with ``MOD(id, total) = rank`` due by ``now + ahead``,
        higher priority first, then oldest due first; with ``hint.stranded`` > 0 (seconds), fill
        what is left with other shards' messages due for longer than that (their consumer stopped
        pulling: it died, and ZooKeeper has not ended its session yet).

        Never waits for a row another transaction holds, never locks an index range
        (``storages/claims.py``): the lifecycle's lease (token ``lease_token`` or a fresh one,
        ``lease_expire = now + ahead + ttr``) goes to the rows locked by key.
        ``limits`` (the topic's, as the caller last read them): the lock first locks the topic's
        row and takes only what its stored limits allow, so they hold across brokers.
        ``hint``: where the messages can be (``LockHint``); the lock reads only there.
        """

    @abc.abstractmethod
    def lock_serial(self, topic: str, ttr: int, consumer: str, now: datetime, lease_token: Optional[str] = None,
                    broker: str = "", ahead: float = 0.0) -> list[LeasedMessage]:
        """Lease the head of a serial topic: the NEW message first in (order_time, id), if due by
        ``now + ahead`` and if no message of the topic is RUNNING. Returns zero or one message."""

    @abc.abstractmethod
    def ack(self, items: Sequence[AckItem], now: datetime, consumer: str, broker: str,
            topics: Callable[[str], TopicSettings]) -> list[AckOutcome]:
        """Apply many outcomes in one transaction, each guarded by status RUNNING and its token:
        ``lifecycle.succeed`` or ``lifecycle.fail_attempt`` (a retry or FAIL). An outcome that
        lease already recorded (a SUCCESS or FAIL under the same token: an ack sent again after
        its reply was lost) is answered APPLIED and changes nothing; any other is STALE."""

    @abc.abstractmethod
    def release(self, lease_token: str, now: datetime, consumer: str = "", broker: str = "") -> int:
        """Give back the messages leased under ``lease_token`` that nobody will run (the pull's
        caller went away before the reply): RUNNING -> NEW, the attempt not counted."""

    @abc.abstractmethod
    def extend_leases(self, leases: Sequence[tuple[int, str]], ttr: int, now: datetime) -> list[bool]:
        """Extend each (id, token) lease still held to now + ``ttr`` (heartbeats, touch); one
        bool per lease, False for a lease already lost."""

    @abc.abstractmethod
    def expire_leases(self, now: datetime, limit: int, broker: str, max_deliveries: Callable[[str], int],
                      by_topic: Optional[dict[str, int]] = None, grace: Optional[OutageGrace] = None) -> int:
        """Up to ``limit`` RUNNING messages whose lease ran out: back to NEW (due now), or to FAIL
        once delivered ``max_deliveries(topic)`` times. Returns how many moved, and adds them per
        topic to ``by_topic`` when given (the metrics). ``grace``: leases that ran out during a
        database outage stay held until its end plus their ttr (see :class:`OutageGrace`)."""

    @abc.abstractmethod
    def cancel(self, ids: Sequence[int]) -> list[bool]:
        """Delete the messages that are still NEW; True for each one deleted."""

    @abc.abstractmethod
    def requeue(self, ids: Sequence[int], topic: Optional[str], retry: int, now: datetime,
                event: Event = Event.REQUEUED, **who: object) -> int:
        """Put FAIL messages (by id, or every one of ``topic``) back to NEW, due now, with
        ``retry`` retries left after the new attempt (0: one more attempt). Works in batches of
        1000 so no transaction holds many row locks. Returns how many moved."""

    @abc.abstractmethod
    def edit_message(self, id: int, version: int, edit: MessageEdit, now: datetime, user: str,
                     changed: Sequence[str]) -> Optional[StoredMessage]:
        """An operator's edit, applied if the message is still at ``version`` and not RUNNING.

        Returns the updated message, or None when it changed meanwhile, is RUNNING or is gone.
        """

    @abc.abstractmethod
    def delete_messages(self, ids: Sequence[int]) -> int:
        """An operator's delete of messages not RUNNING (a consumer holds those); how many went."""

    @abc.abstractmethod
    def delete_finished(self, topic: str, before: datetime, limit: int) -> int:
        """Retention: delete up to ``limit`` SUCCESS messages of ``topic`` finished before ``before``."""

    # -- probes of the pull hub --------------------------------------------------------------
    @abc.abstractmethod
    def next_due(self, topic: str, rank: int, total: int, hint: LockHint = LockHint()) -> Optional[datetime]:
        """The earliest effect_time of NEW messages of ``topic`` in the shard (None when none),
        read where ``hint`` says they can be; with ``hint.stranded``, also other shards' earliest
        plus that much: when a lock that takes stranded messages would take it."""

    @abc.abstractmethod
    def earliest_new(self, topics: Sequence[str]) -> dict[str, dict[int, datetime]]:
        """{topic: {priority: earliest effect_time of its NEW messages of that priority}} for the
        topics that have any, read without hints: the pull hub's shared probe and the audit of
        its lock hints."""

    @abc.abstractmethod
    def serial_head_due(self, topic: str) -> Optional[datetime]:
        """The effect_time of a serial topic's head (first NEW in (order_time, id)); None when a
        message of the topic is RUNNING or nothing is NEW."""

    @abc.abstractmethod
    def max_id(self) -> int:
        """The highest message id (0 for an empty table): a cheap 'anything new?' probe."""

    @abc.abstractmethod
    def id_step(self) -> int:
        """How far apart the ids one server hands out are: ``auto_increment_increment`` on MySQL
        (a Galera cluster of n nodes sets n), 1 elsewhere."""

    @abc.abstractmethod
    def recent_inserts(self, after: int, missing: Sequence[int], limit: int) -> RecentInserts:
        """``(id, topic, effect_time, priority)`` of the stored messages whose id is above ``after``
        or in ``missing``, in id order, at most ``limit``, and the highest id stored: the pull
        hub's probe of messages committed elsewhere (``tidemq_broker.inserts``)."""

    # -- topics and reads --------------------------------------------------------------------
    @abc.abstractmethod
    def ensure_topics(self, names: Sequence[str], now: datetime) -> None:
        """Create default settings rows for topics that have none."""

    @abc.abstractmethod
    def topics(self) -> list[TopicSettings]:
        """Every configured topic."""

    @abc.abstractmethod
    def save_topic(self, settings: TopicSettings, now: datetime) -> None:
        """Insert or update one topic's settings."""

    @abc.abstractmethod
    def set_topic_limits(self, name: str, limits: FlowLimits, now: datetime) -> None:
        """Set one topic's flow limits (None: no such limit), creating its row if needed; the
        rate's token bucket starts full."""

    @abc.abstractmethod
    def get_message(self, id: int) -> Optional[StoredMessage]:
        """One message by id."""

    @abc.abstractmethod
    def message_topics(self, ids: Sequence[int]) -> set[str]:
        """The topics of the stored messages among ``ids`` (what a permission check looks at)."""

    @abc.abstractmethod
    def lease_topics(self, lease_token: str) -> set[str]:
        """The topics of the RUNNING messages leased under ``lease_token``."""

    @abc.abstractmethod
    def backlog(self, now: datetime) -> list[Backlog]:
        """Every topic with NEW or RUNNING messages: due, scheduled and running counts and the
        oldest due effect_time, in one grouped query (the leader's backlog gauges, every few
        seconds; it counts those rows along the (topic, status, effect_time) index)."""

    @abc.abstractmethod
    def save_topic_counts(self, counts: dict[str, dict[str, int]], now: datetime) -> None:
        """Replace the stored count per topic and status (the leader's, read by the console)."""

    @abc.abstractmethod
    def count_by_status(self, topic: Optional[str] = None) -> dict[str, dict[str, int]]:
        """{topic: {status: count}} for one topic or all."""

    # -- schedules (periodic messages) -------------------------------------------------------
    @abc.abstractmethod
    def put_schedule(self, schedule: Schedule, now: datetime) -> bool:
        """Insert or update a schedule by name (an idempotent declaration); True when it is new.

        A new schedule's ticks start after ``now``. An update keeps ``paused`` and ``last_tick``;
        when it changes the cron expression or the time zone, ticks start after ``now`` again."""

    @abc.abstractmethod
    def schedules(self) -> list[Schedule]:
        """Every schedule, by name."""

    @abc.abstractmethod
    def get_schedule(self, name: str) -> Optional[Schedule]:
        """One schedule by name."""

    @abc.abstractmethod
    def delete_schedule(self, name: str) -> bool:
        """Remove a schedule (messages already produced stay); False when there was none."""

    @abc.abstractmethod
    def pause_schedule(self, name: str, paused: bool, now: datetime) -> bool:
        """Pause or resume a schedule; a resumed one ticks only after ``now`` (what fell in the
        pause is not caught up). False when there is no such schedule."""

    @abc.abstractmethod
    def advance_schedule(self, name: str, tick: datetime) -> bool:
        """Record ``tick`` as handled unless a later one already is; False when nothing moved."""
