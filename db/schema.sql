-- tidemq schema (version 14) for MySQL 8 / MariaDB 10.8+ (InnoDB, utf8mb4; descending indexes).
-- Run the server with transaction-isolation=READ-COMMITTED and innodb_autoinc_lock_mode=1 (or 0).
-- `tidemq db init` creates the same schema; tests/integration/test_schema_sql.py fails when they differ.

-- Every message and its trace. States: NEW -> RUNNING -> SUCCESS | NEW (retry) | FAIL;
-- RUNNING -> NEW when the lease (lease_expire) runs out; WAITING -> NEW when its last
-- dependency succeeds (tidemq_dependency), WAITING -> CANCELLED when one fails.
--   effect_time  when the message may next run (a retry moves it forward)
--   order_time   effect_time as produced; SERIAL_QUEUE runs in (order_time, id) order
--   lease_token  set by the pull that leased the row; an ack must present it
--   lease_expire set while RUNNING, NULL in every other status
--   trace_context the producer's W3C traceparent (OpenTelemetry), NULL when it had none
--   priority     higher first among due messages (0 to 9)
--   flow_key     the producer's key; a topic's max_running_per_key counts RUNNING messages by it
--   deps_left    dependencies not succeeded yet: WAITING while above 0, NEW once they all have
--   workflow_id  the workflow it belongs to or that waits on it; NULL: it has no dependents
--   wait_mode    how it waits: 0 until its dependencies succeeded (a failure cancels it), 1 until
--                they all ended whatever their outcome, 2 until they ended with a failure among them
--   deps_failed  dependencies that ended FAIL or CANCELLED
--   keyed_topic  generated: the topic when unique_key is set, NULL without one
-- uk_message_unique_key keeps a topic's unique keys unique. A message without one has no value
-- in it (NULL in both columns), so on a Galera cluster keyless inserts of a topic through
-- different nodes do not conflict in certification, as they did on one (topic, NULL) value.
-- idx_message_lock serves the pull lock: topic and status by equality, then one range of
-- effect_time per priority (the lock names all ten), read in index order: no row is sorted.
-- idx_message_topic_status_lease finds each topic's expired leases and, lease_expire being NULL
-- outside RUNNING, walks one topic and status in id order for the console.
-- idx_message_workflow finds a workflow's steps (cancelling a workflow, the console's graph).
CREATE TABLE `tidemq_message` (
  `id` bigint(20) NOT NULL AUTO_INCREMENT,
  `topic` varchar(255) NOT NULL,
  `data` mediumtext NOT NULL,
  `status` varchar(10) NOT NULL,
  `effect_time` datetime(3) NOT NULL,
  `order_time` datetime(3) NOT NULL,
  `retry_remaining` int(11) NOT NULL,
  `retry_schedule` text DEFAULT NULL,
  `attempt` int(11) NOT NULL,
  `ttr` int(11) DEFAULT NULL,
  `lease_token` varchar(32) DEFAULT NULL,
  `lease_expire` datetime(3) DEFAULT NULL,
  `consumer` varchar(255) DEFAULT NULL,
  `unique_key` varchar(255) DEFAULT NULL,
  `version` int(11) NOT NULL,
  `trace` mediumtext NOT NULL,
  `add_time` datetime(3) NOT NULL,
  `update_time` datetime(3) NOT NULL,
  `start_time` datetime(3) DEFAULT NULL,
  `finish_time` datetime(3) DEFAULT NULL,
  `trace_context` varchar(255) DEFAULT NULL,
  `priority` int(11) NOT NULL DEFAULT 0,
  `flow_key` varchar(255) DEFAULT NULL,
  `result` mediumtext DEFAULT NULL,
  `progress` varchar(1024) DEFAULT NULL,
  `cancel_requested` tinyint(1) NOT NULL DEFAULT 0,
  `deps_left` int(11) NOT NULL DEFAULT 0,
  `workflow_id` bigint(20) DEFAULT NULL,
  `wait_mode` tinyint(4) NOT NULL DEFAULT 0,
  `deps_failed` int(11) NOT NULL DEFAULT 0,
  `keyed_topic` varchar(255) GENERATED ALWAYS AS (case when `unique_key` is null then NULL else `topic` end) STORED,
  PRIMARY KEY (`id`),
  UNIQUE KEY `uk_message_unique_key` (`unique_key`,`keyed_topic`),
  KEY `idx_message_lock` (`topic`,`status`,`priority` DESC,`effect_time`),
  KEY `idx_message_topic_status_lease` (`topic`,`status`,`lease_expire`),
  KEY `idx_message_workflow` (`workflow_id`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci;

-- Per-topic settings; a row with defaults is created when a topic is first produced to.
-- max_running, rate_per_second, max_running_per_key: flow control (NULL: no limit), enforced by
-- the pull lock, which locks this row for topics that have limits; rate_tokens at rate_at is the
-- rate's token bucket.
CREATE TABLE `tidemq_topic` (
  `name` varchar(255) NOT NULL,
  `retry_count` int(11) NOT NULL,
  `retry_base` double NOT NULL,
  `retry_max` double NOT NULL,
  `ttr` int(11) NOT NULL,
  `retention_days` int(11) NOT NULL,
  `max_data_bytes` int(11) DEFAULT NULL,
  `paused` tinyint(1) NOT NULL,
  `archive` tinyint(1) NOT NULL DEFAULT 0,
  `alarm_backlog` int(11) DEFAULT NULL,
  `alarm_failure_rate` double DEFAULT NULL,
  `alarm_due_age` int(11) DEFAULT NULL,
  `description` varchar(1000) NOT NULL,
  `add_time` datetime(3) NOT NULL,
  `update_time` datetime(3) NOT NULL,
  `max_deliveries` int(11) NOT NULL DEFAULT 10,
  `max_running` int(11) DEFAULT NULL,
  `rate_per_second` double DEFAULT NULL,
  `max_running_per_key` int(11) DEFAULT NULL,
  `rate_tokens` double DEFAULT NULL,
  `rate_at` datetime(3) DEFAULT NULL,
  `result_retention_seconds` int(11) DEFAULT NULL,
  PRIMARY KEY (`name`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci;

-- Hourly per-topic statistics written by `tidemq pipeline report`, charted by the console.
CREATE TABLE `tidemq_topic_stats` (
  `topic` varchar(255) NOT NULL,
  `hour` datetime(3) NOT NULL,
  `produced` bigint(20) NOT NULL,
  `succeeded` bigint(20) NOT NULL,
  `failed` bigint(20) NOT NULL,
  `retried` bigint(20) NOT NULL,
  `lease_expired` bigint(20) NOT NULL,
  `backlog` bigint(20) NOT NULL,
  `lateness_p50_ms` double DEFAULT NULL,
  `lateness_p95_ms` double DEFAULT NULL,
  `lateness_p99_ms` double DEFAULT NULL,
  `duration_p50_ms` double DEFAULT NULL,
  `duration_p95_ms` double DEFAULT NULL,
  `duration_p99_ms` double DEFAULT NULL,
  `computed_at` datetime(3) NOT NULL,
  PRIMARY KEY (`topic`,`hour`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci;

-- Alarms raised by `tidemq pipeline alarm`, shown in the console.
CREATE TABLE `tidemq_alarm` (
  `id` bigint(20) NOT NULL AUTO_INCREMENT,
  `topic` varchar(255) NOT NULL,
  `kind` varchar(32) NOT NULL,
  `value` double NOT NULL,
  `threshold` double NOT NULL,
  `message` varchar(1000) NOT NULL,
  `raised_at` datetime(3) NOT NULL,
  `resolved_at` datetime(3) DEFAULT NULL,
  PRIMARY KEY (`id`),
  KEY `idx_alarm_topic_raised` (`topic`,`raised_at`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci;

-- Applied schema versions (`tidemq db upgrade`).
CREATE TABLE `tidemq_schema_version` (
  `version` int(11) NOT NULL,
  `applied_at` datetime(3) NOT NULL,
  PRIMARY KEY (`version`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci;

-- The archive manifest of `tidemq pipeline archive`: one row per batch moved to Parquet
-- (PENDING -> WRITTEN once the Parquet counts match -> DONE once deleted from tidemq_message).
CREATE TABLE `tidemq_archive_batch` (
  `id` bigint(20) NOT NULL AUTO_INCREMENT,
  `id_from` bigint(20) NOT NULL,
  `id_to` bigint(20) NOT NULL,
  `cutoffs` text NOT NULL,
  `path` varchar(1000) NOT NULL,
  `state` varchar(10) NOT NULL,
  `expected_rows` bigint(20) NOT NULL,
  `written_rows` bigint(20) DEFAULT NULL,
  `deleted_rows` bigint(20) DEFAULT NULL,
  `started_at` datetime(3) NOT NULL,
  `finished_at` datetime(3) DEFAULT NULL,
  PRIMARY KEY (`id`),
  KEY `idx_archive_batch_state` (`state`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci;

-- Admin console users; passwords only as salted hashes (`tidemq admin user add NAME --role ...`).
CREATE TABLE `tidemq_admin_user` (
  `name` varchar(64) NOT NULL,
  `password_hash` varchar(255) NOT NULL,
  `role` varchar(16) NOT NULL,
  `add_time` datetime(3) NOT NULL,
  `update_time` datetime(3) NOT NULL,
  PRIMARY KEY (`name`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci;

-- Idempotent produce: each Produce call a client named (its request id, kept across its retries
-- on other brokers) with the ids it was answered. Kept at least 24 h, then deleted by the leader.
CREATE TABLE `tidemq_produce_request` (
  `request_id` varchar(64) NOT NULL,
  `ids` mediumtext NOT NULL,
  `created` datetime(3) NOT NULL,
  PRIMARY KEY (`request_id`),
  KEY `idx_produce_request_created` (`created`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci;

-- Authentication: who may call brokers that run with TIDEMQ_AUTH=token, with its role, the
-- topic patterns it covers and the SHA-256 of its token (the token is shown once, never stored).
CREATE TABLE `tidemq_principal` (
  `name` varchar(64) NOT NULL,
  `role` varchar(16) NOT NULL,
  `topics` varchar(1024) NOT NULL,
  `token_hash` varchar(64) NOT NULL,
  `created` datetime(3) NOT NULL,
  `revoked` datetime(3) DEFAULT NULL,
  PRIMARY KEY (`name`),
  UNIQUE KEY `idx_principal_token_hash` (`token_hash`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci;

-- The maintenance leader's periodic count of messages per topic and status: the console reads
-- the count of finished messages from here on large tables instead of counting on every view.
CREATE TABLE `tidemq_topic_count` (
  `topic` varchar(255) NOT NULL,
  `status` varchar(16) NOT NULL,
  `messages` bigint(20) NOT NULL,
  `counted_at` datetime(3) NOT NULL,
  PRIMARY KEY (`topic`,`status`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci;

-- The console's signed-in sessions, keyed by the SHA-256 of the id the browser holds: signing
-- out or changing a password deletes rows, and a deleted row's cookie no longer signs anyone in.
CREATE TABLE `tidemq_admin_session` (
  `id_hash` varchar(64) NOT NULL,
  `user_name` varchar(64) NOT NULL,
  `created` datetime(3) NOT NULL,
  `last_seen` datetime(3) NOT NULL,
  PRIMARY KEY (`id_hash`),
  KEY `idx_admin_session_user` (`user_name`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci;

-- Failed console sign-ins per (user, address) and per address, shared by every console process.
CREATE TABLE `tidemq_login_failure` (
  `key_hash` varchar(64) NOT NULL,
  `failures` int(11) NOT NULL,
  `last_failure` datetime(3) NOT NULL,
  PRIMARY KEY (`key_hash`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci;

-- Periodic messages: the maintenance leader produces one message per tick of `cron` in
-- `timezone`, keyed schedule:<name>:<tick in UTC>, then records the tick in `last_tick`.
CREATE TABLE `tidemq_schedule` (
  `name` varchar(200) NOT NULL,
  `topic` varchar(255) NOT NULL,
  `cron` varchar(255) NOT NULL,
  `timezone` varchar(64) NOT NULL,
  `data` mediumtext NOT NULL,
  `retry` int(11) DEFAULT NULL,
  `missed` varchar(8) NOT NULL,
  `paused` tinyint(1) NOT NULL,
  `ticks_from` datetime(3) NOT NULL,
  `last_tick` datetime(3) DEFAULT NULL,
  `add_time` datetime(3) NOT NULL,
  `update_time` datetime(3) NOT NULL,
  PRIMARY KEY (`name`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci;

-- Dependencies between messages: child_id waits on parent_id (WAITING until each parent
-- succeeded). An ack reads the children of a parent by the primary key.
CREATE TABLE `tidemq_dependency` (
  `parent_id` bigint(20) NOT NULL,
  `child_id` bigint(20) NOT NULL,
  PRIMARY KEY (`parent_id`,`child_id`),
  KEY `idx_dependency_child` (`child_id`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci;

-- Workflows: one row per submission of steps, its id the workflow_id of its steps. policy: stop
-- or continue; state RUNNING until its last step ended, then SUCCEEDED, FAILED (a step ended
-- FAIL or CANCELLED) or CANCELLED (cancelled as a whole). steps_left is lowered in the
-- transaction of each step's end, so exactly one transaction ends the workflow.
CREATE TABLE `tidemq_workflow` (
  `id` bigint(20) NOT NULL,
  `policy` varchar(10) NOT NULL,
  `state` varchar(10) NOT NULL,
  `steps_total` int(11) NOT NULL,
  `steps_left` int(11) NOT NULL,
  `steps_failed` int(11) NOT NULL,
  `created_at` datetime(3) NOT NULL,
  `finished_at` datetime(3) DEFAULT NULL,
  PRIMARY KEY (`id`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci;
