-- Version 3: a topic's max_deliveries. A message whose lease expires after it has been delivered
-- that many times (its consumer died or hung every time) goes to FAIL instead of back to NEW,
-- with a trace line saying how often its lease expired.
ALTER TABLE tidemq_topic ADD COLUMN max_deliveries int(11) NOT NULL DEFAULT 10;
INSERT INTO tidemq_schema_version (version, applied_at) VALUES (3, UTC_TIMESTAMP(3));
