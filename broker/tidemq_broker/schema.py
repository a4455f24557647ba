"""The database schema as SQLAlchemy Core metadata.

Table and column names come from ``tidemq.tables`` (which the pipeline reads too); an import
check below fails when a table here and its names there drift apart.

db/schema.sql is the same schema written for a MySQL DBA; tests/unit/test_schema_sql.py fails
when the two drift apart.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Computed,
    DateTime,
    Double,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
)
from sqlalchemy import text
from sqlalchemy.dialects import mysql

from tidemq import tables
from tidemq.lifecycle import DEFAULT_MAX_DELIVERIES

__all__ = ["metadata", "message", "topic", "topic_stats", "alarm", "admin_user", "schema_version", "archive_batch",
           "produce_request", "principal", "topic_count", "admin_session", "login_failure", "schedule", "dependency",
           "workflow", "SCHEMA_VERSION"]

SCHEMA_VERSION = 14

# Milliseconds matter for delays: MySQL's DATETIME defaults to whole seconds.
Time = DateTime().with_variant(mysql.DATETIME(fsp=3), "mysql", "mariadb")
LongText = Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")
# SQLite only auto-increments an INTEGER PRIMARY KEY.
Id = BigInteger().with_variant(Integer(), "sqlite")
TinyInt = SmallInteger().with_variant(mysql.TINYINT(), "mysql", "mariadb")

metadata = MetaData()

message = Table(
    tables.MESSAGE.name,
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("topic", String(255), nullable=False),
    Column("data", LongText, nullable=False),
    Column("status", String(10), nullable=False),
    # When the message may next run; a retry moves it forward.
    Column("effect_time", Time, nullable=False),
    # effect_time as produced; never moves. SERIAL_QUEUE runs in (order_time, id) order.
    Column("order_time", Time, nullable=False),
    Column("retry_remaining", Integer, nullable=False),
    # JSON list of seconds, one per further attempt; NULL: the topic's backoff.
    Column("retry_schedule", Text, nullable=True),
    Column("attempt", Integer, nullable=False),
    Column("ttr", Integer, nullable=True),
    Column("lease_token", String(32), nullable=True),
    # Set while RUNNING and NULL in every other status (see idx_message_topic_status_lease).
    Column("lease_expire", Time, nullable=True),
    Column("consumer", String(255), nullable=True),
    Column("unique_key", String(255), nullable=True),
    Column("version", Integer, nullable=False),
    Column("trace", LongText, nullable=False),
    Column("add_time", Time, nullable=False),
    Column("update_time", Time, nullable=False),
    Column("start_time", Time, nullable=True),
    Column("finish_time", Time, nullable=True),
    # The producer's W3C traceparent (OpenTelemetry), returned with every delivery; NULL: none.
    Column("trace_context", String(255), nullable=True),
    # Higher first among due messages, PRIORITY_MIN to PRIORITY_MAX (tidemq.validation).
    Column("priority", Integer, nullable=False, server_default=text("0")),
    # The producer's key (produce(..., key=...)): a topic's max_running_per_key counts by it.
    Column("flow_key", String(255), nullable=True),
    # Results (version 11): the handler's return value (SUCCESS) or its error (a retry, FAIL) as
    # JSON text, cleared after the topic's result retention; the latest progress report (JSON);
    # whether a cancel of the running message was requested. Everything here goes by id.
    Column("result", LongText, nullable=True),
    Column("progress", String(1024), nullable=True),
    Column("cancel_requested", Boolean, nullable=False, server_default=text("0")),
    # Dependencies (version 12): dependencies not succeeded yet (WAITING while above 0) and the
    # workflow of the message; NULL means it has no dependents, so its ack looks for none.
    Column("deps_left", Integer, nullable=False, server_default=text("0")),
    Column("workflow_id", BigInteger, nullable=True),
    # Workflows (version 13): how the message waits (tidemq.dependencies.WaitMode, 0: after
    # its dependencies' success) and how many of its dependencies ended without succeeding.
    Column("wait_mode", TinyInt, nullable=False, server_default=text("0")),
    Column("deps_failed", Integer, nullable=False, server_default=text("0")),
    # A topic's unique keys (version 14): the topic of a message with a unique key, NULL
    # without one, computed by the server. (unique_key, keyed_topic) is unique; a keyless row has
    # no value in it, where (topic, unique_key) gave every keyless message of a topic the value
    # (topic, NULL). A Galera node certifies a write set by the unique-key values of the rows it
    # writes, so that one value made every insert of a topic conflict with every insert of the
    # same topic through another node (docs/ARCHITECTURE.md, "Unique keys and certification").
    Column("keyed_topic", String(255),
           Computed("CASE WHEN unique_key IS NULL THEN NULL ELSE topic END", persisted=True), nullable=True),
    # The pull lock: equality on topic and status, then one range of effect_time per priority,
    # read in index order (priority DESC, effect_time): the lock names every priority
    # (``priority IN (9, ..., 0)``), so each range stops at the first message not yet due and no
    # row is sorted. Probes that want the earliest effect_time take it per priority.
    Index("idx_message_lock", "topic", "status", text("priority DESC"), "effect_time"),
    # Lease expiry finds RUNNING rows of each topic whose lease ran out, and a pull reads back
    # what it leased by its lease's expiry time. Since lease_expire is NULL outside RUNNING and
    # InnoDB ends every index with the primary key, (topic, status, NULL) is also the console's
    # walk of one topic and status in id order. Each index holding status costs every state
    # change two index writes, so this one index serves all three (version 2 replaced
    # (status, lease_expire), (topic, status, id), (status, id) and (lease_token) with it).
    Index("idx_message_topic_status_lease", "topic", "status", "lease_expire"),
    # A workflow's steps (version 13): cancelling a workflow and the console's graph read them.
    # Written on insert and when a message joins a workflow, never by a change of status.
    Index("idx_message_workflow", "workflow_id"),
    # Produce finds stored keys by (unique_key, keyed_topic); the console filters by unique_key.
    Index("uk_message_unique_key", "unique_key", "keyed_topic", unique=True),
    # Never reuse the id of a deleted message (SQLite would, without AUTOINCREMENT).
    sqlite_autoincrement=True,
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)

topic = Table(
    tables.TOPIC.name,
    metadata,
    Column("name", String(255), primary_key=True),
    Column("retry_count", Integer, nullable=False),
    Column("retry_base", Double, nullable=False),
    Column("retry_max", Double, nullable=False),
    Column("ttr", Integer, nullable=False),
    Column("retention_days", Integer, nullable=False),
    Column("max_data_bytes", Integer, nullable=True),
    Column("paused", Boolean, nullable=False),
    # True: finished messages move to the Parquet archive (`tidemq pipeline archive`) and the
    # broker's retention leaves them alone. False: retention deletes SUCCESS rows itself.
    Column("archive", Boolean, nullable=False, server_default=text("0")),
    Column("alarm_backlog", Integer, nullable=True),
    Column("alarm_failure_rate", Double, nullable=True),
    Column("alarm_due_age", Integer, nullable=True),
    Column("description", String(1000), nullable=False),
    Column("add_time", Time, nullable=False),
    Column("update_time", Time, nullable=False),
    # Deliveries (expired leases included) after which an expiring lease ends in FAIL.
    Column("max_deliveries", Integer, nullable=False, server_default=text(str(DEFAULT_MAX_DELIVERIES))),
    # Flow control (version 9), NULL: no limit. A lock of a topic with a limit locks this row,
    # so limits hold across brokers; the rate's token bucket (tokens at rate_at) lives here too.
    Column("max_running", Integer, nullable=True),
    Column("rate_per_second", Double, nullable=True),
    Column("max_running_per_key", Integer, nullable=True),
    Column("rate_tokens", Double, nullable=True),
    Column("rate_at", Time, nullable=True),
    # Seconds the results of finished messages are kept (version 11); NULL: the default, a day.
    Column("result_retention_seconds", Integer, nullable=True),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)

schema_version = Table(
    tables.SCHEMA_VERSION_TABLE.name,
    metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("applied_at", Time, nullable=False),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)

# Written by the pipeline's report job, charted by the console: one row per topic and hour.
topic_stats = Table(
    tables.TOPIC_STATS.name,
    metadata,
    Column("topic", String(255), primary_key=True),
    Column("hour", Time, primary_key=True),
    Column("produced", BigInteger, nullable=False),
    Column("succeeded", BigInteger, nullable=False),
    Column("failed", BigInteger, nullable=False),
    Column("retried", BigInteger, nullable=False),
    Column("lease_expired", BigInteger, nullable=False),
    Column("backlog", BigInteger, nullable=False),
    Column("lateness_p50_ms", Double, nullable=True),
    Column("lateness_p95_ms", Double, nullable=True),
    Column("lateness_p99_ms", Double, nullable=True),
    Column("duration_p50_ms", Double, nullable=True),
    Column("duration_p95_ms", Double, nullable=True),
    Column("duration_p99_ms", Double, nullable=True),
    Column("computed_at", Time, nullable=False),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)

# Raised by the pipeline's alarm job, shown in the console.
alarm = Table(
    tables.ALARM.name,
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("topic", String(255), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("value", Double, nullable=False),
    Column("threshold", Double, nullable=False),
    Column("message", String(1000), nullable=False),
    Column("raised_at", Time, nullable=False),
    Column("resolved_at", Time, nullable=True),
    Index("idx_alarm_topic_raised", "topic", "raised_at"),
    sqlite_autoincrement=True,
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)

# Console users. Passwords are stored only as salted hashes (werkzeug's scrypt format).
admin_user = Table(
    tables.ADMIN_USER.name,
    metadata,
    Column("name", String(64), primary_key=True),
    Column("password_hash", String(255), nullable=False),
    Column("role", String(16), nullable=False),
    Column("add_time", Time, nullable=False),
    Column("update_time", Time, nullable=False),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)

# The pipeline's archive manifest: one row per batch of finished messages moved to Parquet.
# PENDING: being written (a rerun removes its files and writes it again); WRITTEN: the Parquet
# counts matched; DONE: the rows are deleted from tidemq_message.
archive_batch = Table(
    tables.ARCHIVE_BATCH.name,
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("id_from", BigInteger, nullable=False),
    Column("id_to", BigInteger, nullable=False),
    Column("cutoffs", Text, nullable=False),
    Column("path", String(1000), nullable=False),
    Column("state", String(10), nullable=False),
    Column("expected_rows", BigInteger, nullable=False),
    Column("written_rows", BigInteger, nullable=True),
    Column("deleted_rows", BigInteger, nullable=True),
    Column("started_at", Time, nullable=False),
    Column("finished_at", Time, nullable=True),
    Index("idx_archive_batch_state", "state"),
    sqlite_autoincrement=True,
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)

# Idempotent produce: a client names each Produce call; the broker stores the name in the
# transaction that stores the messages. ``ids`` is the comma-separated answer. Kept at least
# PRODUCE_REQUEST_HOURS (maintenance.requests), then deleted by the leader.
produce_request = Table(
    tables.PRODUCE_REQUEST.name,
    metadata,
    Column("request_id", String(64), primary_key=True),
    Column("ids", LongText, nullable=False),
    Column("created", Time, nullable=False),
    Index("idx_produce_request_created", "created"),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)

# Authentication: one row per principal. Tokens are random 32-byte secrets, so a plain SHA-256
# is enough to keep a copy of the table from being a list of working tokens (a slow password
# hash guards low-entropy secrets; these are not). A revoked principal keeps its row.
principal = Table(
    tables.PRINCIPAL.name,
    metadata,
    Column("name", String(64), primary_key=True),
    Column("role", String(16), nullable=False),
    Column("topics", String(1024), nullable=False),
    Column("token_hash", String(64), nullable=False),
    Column("created", Time, nullable=False),
    Column("revoked", Time, nullable=True),
    Index("idx_principal_token_hash", "token_hash", unique=True),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)

# The leader's periodic count of messages per topic and status (maintenance/counts.py): the
# console reads the bulk of finished messages from here instead of counting them per page view.
topic_count = Table(
    tables.TOPIC_COUNT.name,
    metadata,
    Column("topic", String(255), primary_key=True),
    Column("status", String(16), primary_key=True),
    Column("messages", BigInteger, nullable=False),
    Column("counted_at", Time, nullable=False),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)

# The console's sessions: a row per signed-in browser, so signing out (or a password change)
# ends a session for good, whatever its cookie says.
admin_session = Table(
    tables.ADMIN_SESSION.name,
    metadata,
    Column("id_hash", String(64), primary_key=True),
    Column("user_name", String(64), nullable=False),
    Column("created", Time, nullable=False),
    Column("last_seen", Time, nullable=False),
    Index("idx_admin_session_user", "user_name"),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)

# Failed console sign-ins, shared by every console process on the database.
login_failure = Table(
    tables.LOGIN_FAILURE.name,
    metadata,
    Column("key_hash", String(64), primary_key=True),
    Column("failures", Integer, nullable=False),
    Column("last_failure", Time, nullable=False),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)

# Periodic messages (tidemq_broker.schedules): the leader produces one message per tick.
schedule = Table(
    tables.SCHEDULE.name,
    metadata,
    Column("name", String(200), primary_key=True),
    Column("topic", String(255), nullable=False),
    Column("cron", String(255), nullable=False),
    Column("timezone", String(64), nullable=False),
    Column("data", LongText, nullable=False),
    Column("retry", Integer, nullable=True),
    Column("missed", String(8), nullable=False),
    Column("paused", Boolean, nullable=False),
    Column("ticks_from", Time, nullable=False),
    Column("last_tick", Time, nullable=True),
    Column("add_time", Time, nullable=False),
    Column("update_time", Time, nullable=False),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)

# The edges of workflows (version 12): child_id waits on parent_id. The primary key serves an
# ack's look for the children of the parents it succeeded or failed; the index the reverse.
dependency = Table(
    tables.DEPENDENCY.name,
    metadata,
    Column("parent_id", BigInteger, primary_key=True, autoincrement=False),
    Column("child_id", BigInteger, primary_key=True, autoincrement=False),
    Index("idx_dependency_child", "child_id"),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)

# Workflows (version 13): one row per submission of steps, keyed by its workflow_id. steps_left
# is lowered in the transaction of each step's end, under this row's lock, so exactly one
# transaction sees it reach 0 and sets state and finished_at.
workflow = Table(
    tables.WORKFLOW.name,
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=False),
    Column("policy", String(10), nullable=False),
    Column("state", String(10), nullable=False),
    Column("steps_total", Integer, nullable=False),
    Column("steps_left", Integer, nullable=False),
    Column("steps_failed", Integer, nullable=False),
    Column("created_at", Time, nullable=False),
    Column("finished_at", Time, nullable=True),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)


for _table, _names in ((message, tables.MESSAGE), (topic, tables.TOPIC), (schema_version, tables.SCHEMA_VERSION_TABLE),
                       (topic_stats, tables.TOPIC_STATS), (alarm, tables.ALARM), (admin_user, tables.ADMIN_USER),
                       (archive_batch, tables.ARCHIVE_BATCH), (produce_request, tables.PRODUCE_REQUEST),
                       (principal, tables.PRINCIPAL), (topic_count, tables.TOPIC_COUNT),
                       (admin_session, tables.ADMIN_SESSION), (login_failure, tables.LOGIN_FAILURE),
                       (schedule, tables.SCHEDULE), (dependency, tables.DEPENDENCY),
                       (workflow, tables.WORKFLOW)):
    if (tuple(c.name for c in _table.columns if c.computed is None) != _names.columns()
            or tuple(c.name for c in _table.columns if c.computed is not None) != _names.generated()):
        raise AssertionError(f"{_table.name}: the columns differ from tidemq.tables")
