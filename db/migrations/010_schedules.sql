-- Version 10: periodic messages. The maintenance leader produces one message per tick of `cron`
-- in `timezone` (unique key schedule:<name>:<tick in UTC>, so a tick is stored once, also
-- across a failover), then records the tick in `last_tick`.
CREATE TABLE IF NOT EXISTS `tidemq_schedule` (
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
INSERT INTO tidemq_schema_version (version, applied_at) VALUES (10, UTC_TIMESTAMP(3));
