"""The storage interface: every database operation tidemq performs is one method here.

Implementations live in ``tidemq_broker.storages`` (MySQL/MariaDB for production, SQLite for
``tidemq dev``); both pass tests/conformance/test_storage.py. No other module speaks SQL.
All times are naive UTC datetimes (see ``tidemq_broker.clock``); all durations are seconds.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Optional, Sequence

__all__ = [
    "NewRow",
    "StoredMessage",
    "LeasedMessage",
    "TopicSettings",
    "AckItem",
    "AckOutcome",
    "MessageFilter",
    "Storage",
    "open_storage",
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


@dataclass
class TopicSettings:
    """Per-topic settings (the topic table); defaults apply to topics never configured."""

    name: str
    retry_count: int = 3
    retry_base: float = 10.0
    retry_max: float = 3600.0
    ttr: int = 60
    retention_days: int = 7
    max_data_bytes: Optional[int] = None
    paused: bool = False
    archive: bool = False
    alarm_backlog: Optional[int] = None
    alarm_failure_rate: Optional[float] = None
    alarm_due_age: Optional[int] = None
    description: str = ""


@dataclass(frozen=True)
class AckItem:
    """One outcome reported by a consumer."""

    id: int
    lease_token: str
    success: bool
    error: str = ""


class AckOutcome(str, enum.Enum):
    """APPLIED: the outcome was recorded. STALE: refused, the lease was lost."""

    APPLIED = "APPLIED"
    STALE = "STALE"


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


#: Picks the delay before the next attempt: (message, topic settings) -> seconds.
Backoff = Callable[[StoredMessage, TopicSettings], float]


class Storage(abc.ABC):
    """The message store. Each method is one transaction unless it says otherwise."""

    # -- lifecycle ---------------------------------------------------------------------------
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
    def drop_schema(self) -> None:
        """Drop tidemq's tables (tests and `tidemq db reset` only)."""

    @abc.abstractmethod
    def truncate(self) -> None:
        """Delete every message and topic row (tests)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release all connections."""

    @abc.abstractmethod
    def ping(self) -> None:
        """Raise StorageUnavailableError unless the database answers."""

    # -- produce -----------------------------------------------------------------------------
    @abc.abstractmethod
    def insert_messages(self, rows: Sequence[NewRow], now: datetime, trace_line: str) -> list[int]:
        """Insert ``rows`` in one transaction and return their ids in order.

        A row whose (topic, unique_key) is already stored is not inserted again; its existing
        id is returned. Either every row is stored or none is.
        """

    # -- pull --------------------------------------------------------------------------------
    @abc.abstractmethod
    def lock_batch(
        self, topic: str, rank: int, total: int, limit: int, ttr: int, consumer: str, now: datetime, trace_line: str,
        lease_token: Optional[str] = None,
    ) -> list[LeasedMessage]:
        """Lease up to ``limit`` due NEW messages with ``MOD(id, total) = rank``, oldest due first.

        One conditional UPDATE sets RUNNING, the lease token (``lease_token``, or a fresh one)
        and ``lease_expire = now + ttr``; the leased rows are then read back by that lease.
        """

    @abc.abstractmethod
    def lock_serial(self, topic: str, ttr: int, consumer: str, now: datetime, trace_line: str,
                    lease_token: Optional[str] = None) -> list[LeasedMessage]:
        """Lease the head of a serial topic: the NEW message first in (order_time, id), if due
        and if no message of the topic is RUNNING. Returns zero or one message."""

    @abc.abstractmethod
    def next_due(self, topic: str, rank: int, total: int) -> Optional[datetime]:
        """The earliest effect_time of NEW messages of ``topic`` in the shard (None when none)."""

    @abc.abstractmethod
    def earliest_new(self, topics: Sequence[str]) -> dict[str, datetime]:
        """{topic: earliest effect_time of its NEW messages} for the topics that have any.

        One grouped query for all topics: the pull hub's shared probe."""

    @abc.abstractmethod
    def serial_head_due(self, topic: str) -> Optional[datetime]:
        """The effect_time of a serial topic's head (first NEW in (order_time, id)); None when a
        message of the topic is RUNNING or nothing is NEW."""

    @abc.abstractmethod
    def max_id(self) -> int:
        """The highest message id (0 for an empty table): a cheap 'anything new?' probe."""

    # -- ack ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def ack(
        self,
        items: Sequence[AckItem],
        now: datetime,
        consumer: str,
        broker: str,
        topics: Callable[[str], TopicSettings],
        backoff: Backoff,
    ) -> list[AckOutcome]:
        """Apply many outcomes in one transaction, each guarded by status RUNNING and its token.

        Success -> SUCCESS. Failure -> NEW at now + backoff while retries remain, else FAIL.
        """

    @abc.abstractmethod
    def release(self, lease_token: str, now: datetime, trace_line: str) -> int:
        """Give back the messages leased under ``lease_token`` that nobody will run (the pull's
        caller went away before the reply): RUNNING -> NEW, the attempt not counted."""

    @abc.abstractmethod
    def touch(self, id: int, lease_token: str, ttr: int, now: datetime) -> bool:
        """Extend a lease still held under ``lease_token`` to now + ttr."""

    @abc.abstractmethod
    def cancel(self, ids: Sequence[int], now: datetime) -> list[bool]:
        """Delete the messages that are still NEW; True for each one deleted."""

    @abc.abstractmethod
    def requeue(
        self, ids: Sequence[int], topic: Optional[str], retry: int, now: datetime, trace_line: str
    ) -> int:
        """Put FAIL messages (by id, or every one of ``topic``) back to NEW, due now, with
        ``retry`` retries left after the new attempt (0: one more attempt). Works in batches of
        1000 so no transaction holds many row locks. Returns how many moved."""

    # -- maintenance -------------------------------------------------------------------------
    @abc.abstractmethod
    def expire_leases(self, now: datetime, limit: int, broker: str) -> int:
        """Return up to ``limit`` RUNNING messages whose lease expired to NEW (due now)."""

    @abc.abstractmethod
    def delete_finished(self, topic: str, before: datetime, limit: int) -> int:
        """Delete up to ``limit`` SUCCESS messages of ``topic`` finished before ``before``."""

    # -- topics ------------------------------------------------------------------------------
    @abc.abstractmethod
    def ensure_topics(self, names: Sequence[str], now: datetime) -> None:
        """Create default settings rows for topics that have none."""

    @abc.abstractmethod
    def topics(self) -> list[TopicSettings]:
        """Every configured topic."""

    @abc.abstractmethod
    def save_topic(self, settings: TopicSettings, now: datetime) -> None:
        """Insert or update one topic's settings."""

    # -- reading -----------------------------------------------------------------------------
    @abc.abstractmethod
    def get_message(self, id: int) -> Optional[StoredMessage]:
        """One message by id."""

    @abc.abstractmethod
    def list_messages(
        self, flt: MessageFilter, limit: int, before_id: Optional[int] = None
    ) -> list[StoredMessage]:
        """Messages matching ``flt``, newest id first, keyset-paginated by ``before_id``."""

    @abc.abstractmethod
    def count_by_status(self, topic: Optional[str] = None) -> dict[str, dict[str, int]]:
        """{topic: {status: count}} for one topic or all."""


def open_storage(url: str, **options: Any) -> Storage:
    """Open the store at SQLAlchemy ``url``: MySQL/MariaDB or SQLite."""
    from .errors import ConfigurationError

    if url.startswith(("mysql", "mariadb")):
        from .storages.mysql import MySqlStorage

        return MySqlStorage(url, **options)
    if url.startswith("sqlite"):
        from .storages.sqlite import SqliteStorage

        return SqliteStorage(url, **options)
    raise ConfigurationError(
        f"TIDEMQ_DB_URL {url!r} is not supported: use mysql+pymysql://user:pw@host:3306/db or sqlite:///file"
    )
