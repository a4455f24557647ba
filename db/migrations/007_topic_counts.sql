-- Version 7: the maintenance leader's periodic count of messages per topic and status. The
-- console reads the count of finished messages from here on large tables instead of counting
-- them on every page view.
CREATE TABLE IF NOT EXISTS `tidemq_topic_count` (
  `topic` varchar(255) NOT NULL,
  `status` varchar(16) NOT NULL,
  `messages` bigint(20) NOT NULL,
  `counted_at` datetime(3) NOT NULL,
  PRIMARY KEY (`topic`,`status`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci;
INSERT INTO tidemq_schema_version (version, applied_at) VALUES (7, UTC_TIMESTAMP(3));
