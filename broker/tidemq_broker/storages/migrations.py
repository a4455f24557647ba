"""The schema: creating it, its version, and every step between versions — each step once.

``tidemq db upgrade`` (``tidemq_broker.migrations.upgrade``) applies the steps of ``STEPS`` in
order; db/migrations/ holds the same steps as SQL for a DBA who applies changes by hand
(tests/integration/test_migrations.py checks that each step has its file).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from sqlalchemy import Connection, func, insert, inspect, select, update
from sqlalchemy.exc import DBAPIError

from tidemq import clock
from tidemq.lifecycle import DEFAULT_MAX_DELIVERIES, MessageStatus
from tidemq.tables import MESSAGE, TOPIC

from ..errors import ConfigurationError
from ..schema import SCHEMA_VERSION, metadata
from ..schema import message as m
from ..schema import (admin_session, dependency, login_failure, principal, produce_request, schedule, topic_count,
                      workflow)
from ..schema import schema_version as v
from .database import SqlDatabase

__all__ = ["Migrations", "Step", "STEPS"]

_CHUNK = 10_000  # rows per UPDATE of a data step: keeps each transaction short on big tables


@dataclass(frozen=True)
class Step:
    """One schema step: the version it leads to, what it does, and how."""

    version: int
    name: str
    apply: Callable[[SqlDatabase], None]


def _lease_indexes(db: SqlDatabase) -> None:
    """Version 2: lease_expire is NULL outside RUNNING, which lets one (topic, status,
    lease_expire) index serve lease expiry, the pull's read-back of what it leased and the
    console's pages; it replaces four indexes. Each index holding status costs two index
    writes per state change of every message."""
    upper = db.tx(lambda conn: conn.execute(select(func.max(m.c.id))).scalar() or 0)
    for start in range(0, upper + 1, _CHUNK):
        db.tx(lambda conn, lo=start: conn.execute(
            update(m).where(m.c.id >= lo, m.c.id < lo + _CHUNK, m.c.status != MessageStatus.RUNNING.value,
                            m.c.lease_expire.is_not(None)).values(lease_expire=None)))
    present = {ix["name"] for ix in inspect(db.engine).get_indexes(m.name)}
    replaced = {"idx_message_lease_token", "idx_message_status_id", "idx_message_status_lease",
                "idx_message_topic_status_id"}
    with db.engine.begin() as conn:
        if "idx_message_topic_status_lease" not in present:
            conn.exec_driver_sql(f"CREATE INDEX idx_message_topic_status_lease ON {m.name} "
                                 "(topic, status, lease_expire)")
        for name in sorted(replaced & present):
            db.dialect.alter_table(conn, m.name, drop_index=name)


def _max_deliveries(db: SqlDatabase) -> None:
    """Version 3: a topic's ``max_deliveries``: after that many deliveries, a message whose lease
    expires again goes to FAIL (a poison message) instead of back to NEW."""
    columns = {column["name"] for column in inspect(db.engine).get_columns(TOPIC.name)}
    if TOPIC.max_deliveries not in columns:
        with db.engine.begin() as conn:
            db.dialect.alter_table(conn, TOPIC.name, [f"{TOPIC.max_deliveries} INTEGER NOT NULL "
                                                      f"DEFAULT {DEFAULT_MAX_DELIVERIES}"])


def _produce_requests(db: SqlDatabase) -> None:
    """Version 4: ``tidemq_produce_request``, the request ids of committed Produce calls, so a
    call retried on another broker after its commit stores nothing twice."""
    metadata.create_all(db.engine, tables=[produce_request])


def _principals(db: SqlDatabase) -> None:
    """Version 5: ``tidemq_principal``, who may call brokers that authenticate."""
    metadata.create_all(db.engine, tables=[principal])


def _trace_context(db: SqlDatabase) -> None:
    """Version 6: ``tidemq_message.trace_context``, the producer's W3C traceparent, so each
    handler's span joins the producer's trace."""
    columns = {column["name"] for column in inspect(db.engine).get_columns(MESSAGE.name)}
    if MESSAGE.trace_context not in columns:
        with db.engine.begin() as conn:
            db.dialect.alter_table(conn, MESSAGE.name, [f"{MESSAGE.trace_context} VARCHAR(255) NULL"])


def _topic_counts(db: SqlDatabase) -> None:
    """Version 7: ``tidemq_topic_count``, the leader's periodic count per topic and status."""
    metadata.create_all(db.engine, tables=[topic_count])


def _console_sessions(db: SqlDatabase) -> None:
    """Version 8: the console's server-side sessions and its shared count of failed sign-ins."""
    metadata.create_all(db.engine, tables=[admin_session, login_failure])


def _flow_control(db: SqlDatabase) -> None:
    """Version 9: flow control. Messages get a ``priority`` and a ``flow_key``; topics get their
    limits and the rate's token bucket; the lock index puts priority (descending) before
    effect_time. MySQL does it in one ALTER TABLE per table (one rebuild of the message table)."""
    inspector = inspect(db.engine)
    columns = {column["name"] for column in inspector.get_columns(MESSAGE.name)}
    topic_columns = {column["name"] for column in inspector.get_columns(TOPIC.name)}
    index = next((ix for ix in inspector.get_indexes(MESSAGE.name) if ix["name"] == "idx_message_lock"), None)
    message_columns = []
    if MESSAGE.priority not in columns:
        message_columns.append(f"{MESSAGE.priority} INTEGER NOT NULL DEFAULT 0")
    if MESSAGE.flow_key not in columns:
        message_columns.append(f"{MESSAGE.flow_key} VARCHAR(255) NULL")
    new_index = index is None or MESSAGE.priority not in index["column_names"]
    topic_columns_added = [f"{name} {kind} NULL" for name, kind in (
        (TOPIC.max_running, "INTEGER"), (TOPIC.rate_per_second, "DOUBLE"), (TOPIC.max_running_per_key, "INTEGER"),
        (TOPIC.rate_tokens, "DOUBLE"), (TOPIC.rate_at, "DATETIME(3)")) if name not in topic_columns]
    lock_index = f"idx_message_lock ({MESSAGE.topic}, {MESSAGE.status}, {MESSAGE.priority} DESC, {MESSAGE.effect_time})"
    with db.engine.begin() as conn:
        db.dialect.alter_table(conn, MESSAGE.name, message_columns,
                               drop_index="idx_message_lock" if new_index and index else None,
                               add_index=lock_index if new_index else None)
        db.dialect.alter_table(conn, TOPIC.name, topic_columns_added)


def _schedules(db: SqlDatabase) -> None:
    """Version 10: ``tidemq_schedule``, periodic messages the maintenance leader produces."""
    metadata.create_all(db.engine, tables=[schedule])


def _results(db: SqlDatabase) -> None:
    """Version 11: results, progress and cancelling running work. A message's ``result`` (its
    handler's return value or error, JSON), ``progress`` and ``cancel_requested``; a topic's
    ``result_retention_seconds``. No index: each of them is read and written by id."""
    inspector = inspect(db.engine)
    columns = {column["name"] for column in inspector.get_columns(MESSAGE.name)}
    topic_columns = {column["name"] for column in inspector.get_columns(TOPIC.name)}
    result_type = "MEDIUMTEXT" if db.engine.dialect.name in ("mysql", "mariadb") else "TEXT"
    message_columns = [f"{name} {kind}" for name, kind in (
        (MESSAGE.result, f"{result_type} NULL"), (MESSAGE.progress, "VARCHAR(1024) NULL"),
        (MESSAGE.cancel_requested, "BOOLEAN NOT NULL DEFAULT 0")) if name not in columns]
    added_topic = [f"{TOPIC.result_retention_seconds} INTEGER NULL"] \
        if TOPIC.result_retention_seconds not in topic_columns else []
    with db.engine.begin() as conn:
        db.dialect.alter_table(conn, MESSAGE.name, message_columns)
        db.dialect.alter_table(conn, TOPIC.name, added_topic)


def _dependencies(db: SqlDatabase) -> None:
    """Version 12: dependencies between messages. A message's ``deps_left`` (WAITING while above
    0) and ``workflow_id`` (NULL: no dependents, so its ack looks for none), and
    ``tidemq_dependency``, one row per edge. No index on the new columns: they are read and
    written by id."""
    columns = {column["name"] for column in inspect(db.engine).get_columns(MESSAGE.name)}
    added = [f"{name} {kind}" for name, kind in (
        (MESSAGE.deps_left, "INTEGER NOT NULL DEFAULT 0"), (MESSAGE.workflow_id, "BIGINT NULL")) if name not in columns]
    with db.engine.begin() as conn:
        db.dialect.alter_table(conn, MESSAGE.name, added)
    metadata.create_all(db.engine, tables=[dependency])


def _workflows(db: SqlDatabase) -> None:
    """Version 13: workflows. A message's ``wait_mode`` and ``deps_failed`` (how it waits on
    dependencies that may fail), an index on ``workflow_id`` (a workflow's steps, read by a
    cancel of the workflow), and ``tidemq_workflow``, one row per submission of steps. One
    ALTER TABLE on MySQL: the message table is rebuilt once."""
    inspector = inspect(db.engine)
    columns = {column["name"] for column in inspector.get_columns(MESSAGE.name)}
    indexes = {ix["name"] for ix in inspector.get_indexes(MESSAGE.name)}
    added = [f"{name} {kind}" for name, kind in (
        (MESSAGE.wait_mode, "TINYINT NOT NULL DEFAULT 0"), (MESSAGE.deps_failed, "INTEGER NOT NULL DEFAULT 0"))
        if name not in columns]
    index = None if "idx_message_workflow" in indexes else f"idx_message_workflow ({MESSAGE.workflow_id})"
    with db.engine.begin() as conn:
        db.dialect.alter_table(conn, MESSAGE.name, added, add_index=index)
    metadata.create_all(db.engine, tables=[workflow])


def _keyed_topic(db: SqlDatabase) -> None:
    """Version 14: a topic's unique keys are unique in ``(unique_key, keyed_topic)``, where
    ``keyed_topic`` is generated: the topic of a message with a unique key, NULL without one. The
    index ``(topic, unique_key)`` gave every keyless message of a topic the value (topic, NULL),
    which a Galera cluster certifies: inserts of a topic through two nodes conflicted. One ALTER
    TABLE on MySQL. SQLite keeps its table's (topic, unique_key) constraint (it cannot drop it
    without copying the table), which says the same."""
    inspector = inspect(db.engine)
    columns = {column["name"] for column in inspector.get_columns(MESSAGE.name)}
    indexes = {ix["name"] for ix in inspector.get_indexes(MESSAGE.name)}
    added = [] if MESSAGE.keyed_topic in columns else [
        f"{MESSAGE.keyed_topic} VARCHAR(255) GENERATED ALWAYS AS "
        f"(CASE WHEN {MESSAGE.unique_key} IS NULL THEN NULL ELSE {MESSAGE.topic} END) STORED"]
    old = "uk_message_topic_unique_key"
    new = None if "uk_message_unique_key" in indexes else \
        f"uk_message_unique_key ({MESSAGE.unique_key}, {MESSAGE.keyed_topic})"
    with db.engine.begin() as conn:
        db.dialect.alter_table(conn, MESSAGE.name, added, drop_index=old if old in indexes else None,
                               add_index=new, unique=True)


STEPS = (
    Step(2, "lease_expire only while RUNNING; one (topic, status, lease_expire) index replaces four", _lease_indexes),
    Step(3, "tidemq_topic.max_deliveries: poison messages end in FAIL", _max_deliveries),
    Step(4, "tidemq_produce_request: a retried Produce call stores nothing twice", _produce_requests),
    Step(5, "tidemq_principal: tokens, roles and topic patterns for authenticated brokers", _principals),
    Step(6, "tidemq_message.trace_context: the producer's OpenTelemetry trace context", _trace_context),
    Step(7, "tidemq_topic_count: the console reads counts of finished messages from the leader's count", _topic_counts),
    Step(8, "tidemq_admin_session and tidemq_login_failure: revocable console sessions, shared sign-in brake",
         _console_sessions),
    Step(9, "flow control: message priority and key, topic limits, priority in the lock index", _flow_control),
    Step(10, "tidemq_schedule: periodic messages, one per tick of a cron expression", _schedules),
    Step(11, "results: a message's result, progress and cancel request; a topic's result retention", _results),
    Step(12, "dependencies: a message's deps_left and workflow_id, tidemq_dependency's edges", _dependencies),
    Step(13, "workflows: a message's wait_mode and deps_failed, an index on workflow_id, tidemq_workflow", _workflows),
    Step(14, "unique keys in (unique_key, keyed_topic): a keyless message gives Galera no key to certify",
         _keyed_topic),
)
assert [step.version for step in STEPS] == list(range(2, SCHEMA_VERSION + 1)), "a schema step is missing"


class Migrations:
    """Create the schema, read its version, apply one step; and whether the database answers."""

    def __init__(self, db: SqlDatabase) -> None:
        self._db = db

    def create_schema(self) -> None:
        # Reach the server through the transaction object first: an unreachable or refusing
        # server is then a StorageUnavailableError with the reason, not a driver traceback.
        self._db.tx(lambda conn: conn.execute(select(1)).scalar())
        try:
            metadata.create_all(self._db.engine)
        except DBAPIError:
            # Another broker created the tables between our check and our CREATE.
            metadata.create_all(self._db.engine)

        def record(conn: Connection) -> None:
            # Only a new database is at the current version by creation: an older schema keeps
            # its version until `tidemq db upgrade` has applied the steps.
            if conn.execute(select(v.c.version).limit(1)).first() is None:
                conn.execute(insert(v).values(version=SCHEMA_VERSION, applied_at=clock.now()))

        self._db.tx(record)

    def ping(self) -> None:
        self._db.tx(lambda conn: conn.execute(select(1)).scalar())

    def schema_version(self) -> int:
        return self._db.tx(lambda conn: conn.execute(select(func.max(v.c.version))).scalar() or 0)

    def migrate(self, version: int) -> None:
        step = next((s for s in STEPS if s.version == version), None)
        if step is None:
            raise ConfigurationError(f"no schema step leads to version {version}")
        step.apply(self._db)
        self._db.tx(lambda conn: conn.execute(insert(v).values(version=version, applied_at=clock.now())))
