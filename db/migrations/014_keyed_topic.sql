-- Version 14: a topic's unique keys are unique in (unique_key, keyed_topic), keyed_topic being
-- generated: the topic when the message has a unique key, NULL without one. The index it
-- replaces, (topic, unique_key), gave every keyless message of a topic the value (topic, NULL);
-- a Galera node certifies a writeset by the unique-key values of the rows it writes, so inserts
-- of a topic through two nodes conflicted with each other. One ALTER TABLE: the message table
-- is rebuilt once.
ALTER TABLE tidemq_message
  ADD COLUMN keyed_topic varchar(255) GENERATED ALWAYS AS (CASE WHEN unique_key IS NULL THEN NULL ELSE topic END) STORED,
  DROP INDEX uk_message_topic_unique_key,
  ADD UNIQUE INDEX uk_message_unique_key (unique_key, keyed_topic);
INSERT INTO tidemq_schema_version (version, applied_at) VALUES (14, UTC_TIMESTAMP(3));
