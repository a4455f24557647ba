-- Version 2: lease_expire is NULL outside RUNNING, so one (topic, status, lease_expire) index
-- serves lease expiry, the pull's read-back of what it leased (by its lease's expiry time) and
-- the console's pages (the primary key ends every InnoDB index, so (topic, status, NULL) is a
-- walk in id order). It replaces four indexes. Each index holding a column the pull or the ack changes costs
-- two index writes per message and state change.
-- `tidemq db upgrade` does the same, clearing lease_expire in chunks of 10,000 ids.
UPDATE tidemq_message SET lease_expire = NULL WHERE status <> 'RUNNING' AND lease_expire IS NOT NULL;
CREATE INDEX idx_message_topic_status_lease ON tidemq_message (topic, status, lease_expire);
DROP INDEX idx_message_lease_token ON tidemq_message;
DROP INDEX idx_message_status_id ON tidemq_message;
DROP INDEX idx_message_status_lease ON tidemq_message;
DROP INDEX idx_message_topic_status_id ON tidemq_message;
INSERT INTO tidemq_schema_version (version, applied_at) VALUES (2, UTC_TIMESTAMP(3));
