"""The names of tidemq's tables and columns: one place for the broker, the console and the pipeline.

The broker's SQLAlchemy schema (``tidemq_broker.schema``) builds its tables from these names and
the pipeline's statements and Spark reads use them too, so a renamed column is renamed once.
"""

from __future__ import annotations

__all__ = ["Table", "MESSAGE", "TOPIC", "SCHEMA_VERSION_TABLE", "TOPIC_STATS", "ALARM", "ADMIN_USER",
           "ARCHIVE_BATCH", "PRODUCE_REQUEST", "PRINCIPAL", "TOPIC_COUNT",
           "ADMIN_SESSION", "LOGIN_FAILURE", "SCHEDULE", "DEPENDENCY", "WORKFLOW"]


class Table:
    """A table's name and its columns' names, in the order the table declares them."""

    name: str = ""

    @classmethod
    def columns(cls) -> tuple[str, ...]:
        """Every column name, in declaration order."""
        return tuple(value for key, value in vars(cls).items() if not key.startswith("_") and key != "name"
                     and isinstance(value, str))


class _Message(Table):
    """``tidemq_message``: every message, its state and its trace."""

    name = "tidemq_message"
    id = "id"
    topic = "topic"
    data = "data"
    status = "status"
    effect_time = "effect_time"  # when the message may next run; a retry moves it forward
    order_time = "order_time"  # effect_time as produced: SERIAL_QUEUE order, never moves
    retry_remaining = "retry_remaining"
    retry_schedule = "retry_schedule"
    attempt = "attempt"  # deliveries so far: +1 per lease, -1 when a lease is released unused
    ttr = "ttr"
    lease_token = "lease_token"
    lease_expire = "lease_expire"  # set while RUNNING, NULL in every other status
    consumer = "consumer"
    unique_key = "unique_key"
    version = "version"
    trace = "trace"
    add_time = "add_time"
    update_time = "update_time"
    start_time = "start_time"
    finish_time = "finish_time"
    # The W3C traceparent of the producer's OpenTelemetry span (NULL: none); not ``trace``,
    # which is tidemq's own history of the message.
    trace_context = "trace_context"
    priority = "priority"  # higher first among due messages (0 to 9; flow control, version 9)
    flow_key = "flow_key"  # produce(..., key=...): the topic's per-key running limit counts by it
    # Results (version 11): the handler's return value or its error as JSON text, the latest
    # progress report as JSON, and whether a cancel of the running message was requested.
    result = "result"
    progress = "progress"
    cancel_requested = "cancel_requested"
    # Dependencies (version 12): how many of the message's dependencies have not succeeded yet
    # (WAITING while above 0), and the workflow it was submitted in or that waits on it (NULL:
    # none; a row with NULL has no dependents, which spares the plain ack any further work).
    deps_left = "deps_left"
    workflow_id = "workflow_id"
    # Workflows (version 13): how the message waits on its dependencies (``tidemq.dependencies.
    # WaitMode``: 0 after their success, 1 after they all ended, 2 after a failure among them)
    # and how many of them ended without succeeding.
    wait_mode = "wait_mode"
    deps_failed = "deps_failed"


class _Topic(Table):
    """``tidemq_topic``: per-topic settings."""

    name = "tidemq_topic"
    topic_name = "name"
    retry_count = "retry_count"
    retry_base = "retry_base"
    retry_max = "retry_max"
    ttr = "ttr"
    retention_days = "retention_days"
    max_data_bytes = "max_data_bytes"
    paused = "paused"
    archive = "archive"
    alarm_backlog = "alarm_backlog"
    alarm_failure_rate = "alarm_failure_rate"
    alarm_due_age = "alarm_due_age"
    description = "description"
    add_time = "add_time"
    update_time = "update_time"
    max_deliveries = "max_deliveries"  # deliveries (expired leases included) before FAIL
    # Flow control (version 9), enforced by the broker's lock; NULL: no limit.
    max_running = "max_running"  # RUNNING messages of the topic, cluster-wide
    rate_per_second = "rate_per_second"  # leases (starts) per second
    max_running_per_key = "max_running_per_key"  # RUNNING messages per flow_key
    rate_tokens = "rate_tokens"  # the rate's token bucket: tokens left at rate_at
    rate_at = "rate_at"
    result_retention_seconds = "result_retention_seconds"  # NULL: lifecycle.DEFAULT_RESULT_RETENTION


class _SchemaVersion(Table):
    name = "tidemq_schema_version"
    version = "version"
    applied_at = "applied_at"


class _TopicStats(Table):
    """``tidemq_topic_stats``: written by the pipeline's report, one row per topic and hour."""

    name = "tidemq_topic_stats"
    topic = "topic"
    hour = "hour"
    produced = "produced"
    succeeded = "succeeded"
    failed = "failed"
    retried = "retried"
    lease_expired = "lease_expired"
    backlog = "backlog"
    lateness_p50_ms = "lateness_p50_ms"
    lateness_p95_ms = "lateness_p95_ms"
    lateness_p99_ms = "lateness_p99_ms"
    duration_p50_ms = "duration_p50_ms"
    duration_p95_ms = "duration_p95_ms"
    duration_p99_ms = "duration_p99_ms"
    computed_at = "computed_at"


class _Alarm(Table):
    """``tidemq_alarm``: raised by the pipeline's alarm job."""

    name = "tidemq_alarm"
    id = "id"
    topic = "topic"
    kind = "kind"
    value = "value"
    threshold = "threshold"
    message = "message"
    raised_at = "raised_at"
    resolved_at = "resolved_at"


class _AdminUser(Table):
    name = "tidemq_admin_user"
    user_name = "name"
    password_hash = "password_hash"
    role = "role"
    add_time = "add_time"
    update_time = "update_time"


class _ArchiveBatch(Table):
    """``tidemq_archive_batch``: the archive's manifest, one row per batch moved to Parquet."""

    name = "tidemq_archive_batch"
    id = "id"
    id_from = "id_from"
    id_to = "id_to"
    cutoffs = "cutoffs"
    path = "path"
    state = "state"
    expected_rows = "expected_rows"
    written_rows = "written_rows"
    deleted_rows = "deleted_rows"
    started_at = "started_at"
    finished_at = "finished_at"


class _ProduceRequest(Table):
    """``tidemq_produce_request``: each committed Produce call that named a request id, with the
    ids it was answered, so a retry of the call (on any broker) gets them back and stores nothing."""

    name = "tidemq_produce_request"
    request_id = "request_id"
    ids = "ids"
    created = "created"


class _Principal(Table):
    """``tidemq_principal``: who may call brokers that authenticate: a role, the topic patterns
    it covers, and the SHA-256 of its token (the token itself is shown once, never stored)."""

    name = "tidemq_principal"
    principal = "name"
    role = "role"
    topics = "topics"
    token_hash = "token_hash"
    created = "created"
    revoked = "revoked"


class _TopicCount(Table):
    """``tidemq_topic_count``: the maintenance leader's latest count of messages per topic and
    status, so the console need not count a large table on every page view."""

    name = "tidemq_topic_count"
    topic = "topic"
    status = "status"
    messages = "messages"
    counted_at = "counted_at"


class _AdminSession(Table):
    """``tidemq_admin_session``: the console's signed-in sessions, one row each, keyed by the
    SHA-256 of the random session id the browser holds: deleting a row signs that browser out."""

    name = "tidemq_admin_session"
    id_hash = "id_hash"
    user_name = "user_name"
    created = "created"
    last_seen = "last_seen"


class _LoginFailure(Table):
    """``tidemq_login_failure``: failed console sign-ins per (user, address) and per address,
    shared by every console process, keyed by the SHA-256 of the key."""

    name = "tidemq_login_failure"
    key_hash = "key_hash"
    failures = "failures"
    last_failure = "last_failure"


class _Schedule(Table):
    """``tidemq_schedule``: periodic messages. The maintenance leader produces one message per
    tick of ``cron`` in ``timezone``, keyed ``schedule:<name>:<tick>`` so a tick is stored once."""

    name = "tidemq_schedule"
    schedule_name = "name"
    topic = "topic"
    cron = "cron"
    timezone = "timezone"
    data = "data"
    retry = "retry"  # retries of each message; NULL: the topic's default
    missed = "missed"  # ticks missed in an outage: 'once' (produce the latest) or 'skip'
    paused = "paused"
    ticks_from = "ticks_from"  # ticks after this time are due: creation, resume, a new cron or zone
    last_tick = "last_tick"  # the latest tick handled (produced or skipped); NULL: none yet
    add_time = "add_time"
    update_time = "update_time"


class _Dependency(Table):
    """``tidemq_dependency``: one row per edge of a workflow, ``child_id`` waits on ``parent_id``."""

    name = "tidemq_dependency"
    parent_id = "parent_id"
    child_id = "child_id"


class _Workflow(Table):
    """``tidemq_workflow``: one row per submission of steps (version 13), its id the
    ``workflow_id`` of its steps: the failure policy, the state, and the steps not ended yet,
    lowered in the transaction of each step's end."""

    name = "tidemq_workflow"
    id = "id"
    policy = "policy"
    state = "state"
    steps_total = "steps_total"
    steps_left = "steps_left"
    steps_failed = "steps_failed"
    created_at = "created_at"
    finished_at = "finished_at"


MESSAGE = _Message()
TOPIC = _Topic()
SCHEMA_VERSION_TABLE = _SchemaVersion()
TOPIC_STATS = _TopicStats()
ALARM = _Alarm()
ADMIN_USER = _AdminUser()
ARCHIVE_BATCH = _ArchiveBatch()
PRODUCE_REQUEST = _ProduceRequest()
PRINCIPAL = _Principal()
TOPIC_COUNT = _TopicCount()
ADMIN_SESSION = _AdminSession()
LOGIN_FAILURE = _LoginFailure()
SCHEDULE = _Schedule()
DEPENDENCY = _Dependency()
WORKFLOW = _Workflow()
