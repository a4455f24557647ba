"""The SQL storage: the :class:`~tidemq_broker.storage.Storage` interface over one
:class:`~tidemq_broker.storages.database.SqlDatabase`, by composition.

Each group of operations is its own component around the same database object: ``writes``
(produce and operators' changes), ``leases``, ``acks``, ``reads``, ``schedules`` and ``migrations``. What
differs between MySQL and SQLite is the database's dialect object, not a subclass.
"""

from __future__ import annotations

from datetime import datetime
from typing import Callable, Optional, Sequence

from sqlalchemy import select

from tidemq.lifecycle import Event
from tidemq.link import AckItem, AckOutcome

from ..storage import (Backlog, FlowLimits, LeasedMessage, LockHint, MessageEdit, NewRow, OutageGrace, RecentInserts,
                       RequestRef, Schedule, Storage, StoredMessage, TopicSettings)
from .acks import Acks
from .database import SqlDatabase
from .leases import Leases
from .migrations import Migrations
from .reads import Reads
from .schedules import Schedules
from .writes import Writes

__all__ = ["SqlStorage"]


class SqlStorage(Storage):
    """Storage on MySQL/MariaDB or SQLite; ``db`` is the shared engine and transaction object."""

    def __init__(self, db: SqlDatabase) -> None:
        self.db = db
        self._writes = Writes(db)
        self._leases = Leases(db)
        self._acks = Acks(db)
        self._reads = Reads(db)
        self._migrations = Migrations(db)
        self._schedules = Schedules(db)

    # -- schema and connection ---------------------------------------------------------------
    def create_schema(self) -> None:
        self._migrations.create_schema()

    def schema_version(self) -> int:
        return self._migrations.schema_version()

    def migrate(self, version: int) -> None:
        self._migrations.migrate(version)

    def close(self) -> None:
        self.db.close()

    def ping(self) -> None:
        self.db.tx(lambda conn: conn.execute(select(1)).scalar())

    # -- transitions -------------------------------------------------------------------------
    def insert_messages(self, rows: Sequence[NewRow], now: datetime, requests: Sequence[RequestRef] = (),
                        **who: object) -> list[int]:
        return self._writes.insert_messages(rows, now, requests, **who)

    def delete_produce_requests(self, before: datetime, limit: int) -> int:
        return self._writes.delete_produce_requests(before, limit)

    def lock_batch(self, topic: str, rank: int, total: int, limit: int, ttr: int, consumer: str, now: datetime,
                   lease_token: Optional[str] = None, broker: str = "", ahead: float = 0.0,
                   limits: Optional[FlowLimits] = None, hint: LockHint = LockHint()) -> list[LeasedMessage]:
        return self._leases.lock_batch(topic, rank, total, limit, ttr, consumer, now, lease_token, broker, ahead,
                                       limits, hint)

    def lock_serial(self, topic: str, ttr: int, consumer: str, now: datetime, lease_token: Optional[str] = None,
                    broker: str = "", ahead: float = 0.0) -> list[LeasedMessage]:
        return self._leases.lock_serial(topic, ttr, consumer, now, lease_token, broker, ahead)

    def ack(self, items: Sequence[AckItem], now: datetime, consumer: str, broker: str,
            topics: Callable[[str], TopicSettings]) -> list[AckOutcome]:
        return self._acks.ack(items, now, consumer, broker, topics)

    def release(self, lease_token: str, now: datetime, consumer: str = "", broker: str = "") -> int:
        return self._leases.release(lease_token, now, consumer, broker)

    def extend_leases(self, leases: Sequence[tuple[int, str]], ttr: int, now: datetime) -> list[bool]:
        return self._leases.extend_leases(leases, ttr, now)

    def expire_leases(self, now: datetime, limit: int, broker: str,
                      max_deliveries: Callable[[str], int], by_topic: Optional[dict[str, int]] = None,
                      grace: Optional[OutageGrace] = None) -> int:
        return self._leases.expire_leases(now, limit, broker, max_deliveries, by_topic, grace)

    def cancel(self, ids: Sequence[int]) -> list[bool]:
        return self._writes.cancel(ids)

    def requeue(self, ids: Sequence[int], topic: Optional[str], retry: int, now: datetime,
                event: Event = Event.REQUEUED, **who: object) -> int:
        return self._writes.requeue(ids, topic, retry, now, event, **who)

    def edit_message(self, id: int, version: int, edit: MessageEdit, now: datetime, user: str,
                     changed: Sequence[str]) -> Optional[StoredMessage]:
        return self._writes.edit_message(id, version, edit, now, user, changed)

    def delete_messages(self, ids: Sequence[int]) -> int:
        return self._writes.delete_messages(ids)

    def delete_finished(self, topic: str, before: datetime, limit: int) -> int:
        return self._writes.delete_finished(topic, before, limit)

    # -- probes ------------------------------------------------------------------------------
    def next_due(self, topic: str, rank: int, total: int, hint: LockHint = LockHint()) -> Optional[datetime]:
        return self._leases.next_due(topic, rank, total, hint)

    def earliest_new(self, topics: Sequence[str]) -> dict[str, dict[int, datetime]]:
        return self._leases.earliest_new(topics)

    def serial_head_due(self, topic: str) -> Optional[datetime]:
        return self._leases.serial_head_due(topic)

    def max_id(self) -> int:
        return self._leases.max_id()

    def recent_inserts(self, after: int, missing: Sequence[int], limit: int) -> RecentInserts:
        return self._leases.recent_inserts(after, missing, limit)

    def id_step(self) -> int:
        return self._leases.id_step()

    # -- topics and reads --------------------------------------------------------------------
    def ensure_topics(self, names: Sequence[str], now: datetime) -> None:
        self._reads.ensure_topics(names, now)

    def topics(self) -> list[TopicSettings]:
        return self._reads.topics()

    def save_topic(self, settings: TopicSettings, now: datetime) -> None:
        self._reads.save_topic(settings, now)

    def set_topic_limits(self, name: str, limits: FlowLimits, now: datetime) -> None:
        self._reads.set_topic_limits(name, limits, now)

    def get_message(self, id: int) -> Optional[StoredMessage]:
        return self._reads.get_message(id)

    def message_topics(self, ids: Sequence[int]) -> set[str]:
        return self._reads.message_topics(ids)

    def lease_topics(self, lease_token: str) -> set[str]:
        return self._reads.lease_topics(lease_token)

    def backlog(self, now: datetime) -> list[Backlog]:
        return self._reads.backlog(now)

    def save_topic_counts(self, counts: dict[str, dict[str, int]], now: datetime) -> None:
        self._reads.save_topic_counts(counts, now)

    def count_by_status(self, topic: Optional[str] = None) -> dict[str, dict[str, int]]:
        return self._reads.count_by_status(topic)

    # -- schedules ---------------------------------------------------------------------------
    def put_schedule(self, schedule: Schedule, now: datetime) -> bool:
        return self._schedules.put(schedule, now)

    def schedules(self) -> list[Schedule]:
        return self._schedules.list()

    def get_schedule(self, name: str) -> Optional[Schedule]:
        return self._schedules.get(name)

    def delete_schedule(self, name: str) -> bool:
        return self._schedules.delete(name)

    def pause_schedule(self, name: str, paused: bool, now: datetime) -> bool:
        return self._schedules.pause(name, paused, now)

    def advance_schedule(self, name: str, tick: datetime) -> bool:
        return self._schedules.advance(name, tick)
