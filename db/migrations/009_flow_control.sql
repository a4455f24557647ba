-- Version 9: flow control. A message's priority (higher first among due messages, 0 to 9) and
-- key (a topic's max_running_per_key counts RUNNING messages by it); a topic's limits (NULL: no
-- limit) and the rate's token bucket. The lock index puts priority, descending, before
-- effect_time. One ALTER TABLE per table: the message table is rebuilt once.
ALTER TABLE tidemq_message
  ADD COLUMN priority int(11) NOT NULL DEFAULT 0,
  ADD COLUMN flow_key varchar(255) DEFAULT NULL,
  DROP INDEX idx_message_lock,
  ADD INDEX idx_message_lock (topic, status, priority DESC, effect_time);
ALTER TABLE tidemq_topic
  ADD COLUMN max_running int(11) DEFAULT NULL,
  ADD COLUMN rate_per_second double DEFAULT NULL,
  ADD COLUMN max_running_per_key int(11) DEFAULT NULL,
  ADD COLUMN rate_tokens double DEFAULT NULL,
  ADD COLUMN rate_at datetime(3) DEFAULT NULL;
INSERT INTO tidemq_schema_version (version, applied_at) VALUES (9, UTC_TIMESTAMP(3));
