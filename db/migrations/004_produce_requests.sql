-- Version 4: idempotent produce. A broker stores the request id a client gave its Produce call in
-- the transaction that stores the messages; a retry of a committed call returns the same ids and
-- stores nothing. Rows are deleted by the maintenance leader after 24 h.
CREATE TABLE IF NOT EXISTS `tidemq_produce_request` (
  `request_id` varchar(64) NOT NULL,
  `ids` mediumtext NOT NULL,
  `created` datetime(3) NOT NULL,
  PRIMARY KEY (`request_id`),
  KEY `idx_produce_request_created` (`created`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci;
INSERT INTO tidemq_schema_version (version, applied_at) VALUES (4, UTC_TIMESTAMP(3));
