-- Version 2: lease_expire is NULL outside RUNNING, so (status, lease_expire) also serves the
-- console's per-status pages; (status, id) and (lease_token) are dropped. Each index holding a
-- column the pull or the ack changes costs two index writes per message and state change.
-- `tidemq db upgrade` does the same, clearing lease_expire in chunks of 10,000 ids.
UPDATE tidemq_message SET lease_expire = NULL WHERE status <> 'RUNNING' AND lease_expire IS NOT NULL;
DROP INDEX idx_message_lease_token ON tidemq_message;
DROP INDEX idx_message_status_id ON tidemq_message;
INSERT INTO tidemq_schema_version (version, applied_at) VALUES (2, UTC_TIMESTAMP(3));
