-- Version 11: results, progress and cancelling running work. A message's result (its handler's
-- return value on SUCCESS, its error on a retry or FAIL, JSON text), its latest progress report
-- (JSON) and whether a cancel of it was requested while it ran; a topic's result retention in
-- seconds (NULL: a day). No index: each of them is read and written by id.
ALTER TABLE tidemq_message
  ADD COLUMN result mediumtext DEFAULT NULL,
  ADD COLUMN progress varchar(1024) DEFAULT NULL,
  ADD COLUMN cancel_requested tinyint(1) NOT NULL DEFAULT 0;
ALTER TABLE tidemq_topic
  ADD COLUMN result_retention_seconds int(11) DEFAULT NULL;
INSERT INTO tidemq_schema_version (version, applied_at) VALUES (11, UTC_TIMESTAMP(3));
