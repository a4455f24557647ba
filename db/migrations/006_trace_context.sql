-- Version 6: the producer's OpenTelemetry trace context (its W3C traceparent), stored with each
-- message and handed back with every delivery, so each handler's span joins the producer's trace.
-- Not `trace`, which is tidemq's own history of the message.
ALTER TABLE tidemq_message ADD COLUMN trace_context varchar(255) DEFAULT NULL;
INSERT INTO tidemq_schema_version (version, applied_at) VALUES (6, UTC_TIMESTAMP(3));
