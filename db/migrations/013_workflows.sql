-- Version 13: workflows. A message's wait_mode (0: after its dependencies' success, 1: after
-- they all ended, 2: after they ended with a failure among them) and deps_failed (dependencies
-- that ended FAIL or CANCELLED); an index on workflow_id (a workflow's steps); tidemq_workflow,
-- one row per submission of steps. Workflows submitted before this version have no row.
ALTER TABLE tidemq_message
  ADD COLUMN wait_mode tinyint(4) NOT NULL DEFAULT 0,
  ADD COLUMN deps_failed int(11) NOT NULL DEFAULT 0,
  ADD KEY idx_message_workflow (workflow_id);
CREATE TABLE `tidemq_workflow` (
  `id` bigint(20) NOT NULL,
  `policy` varchar(10) NOT NULL,
  `state` varchar(10) NOT NULL,
  `steps_total` int(11) NOT NULL,
  `steps_left` int(11) NOT NULL,
  `steps_failed` int(11) NOT NULL,
  `created_at` datetime(3) NOT NULL,
  `finished_at` datetime(3) DEFAULT NULL,
  PRIMARY KEY (`id`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci;
INSERT INTO tidemq_schema_version (version, applied_at) VALUES (13, UTC_TIMESTAMP(3));
