-- Version 12: dependencies between messages. A message's deps_left counts its dependencies
-- that have not succeeded yet (it is WAITING while above 0); workflow_id names the workflow it
-- was submitted in or that waits on it (NULL: no dependents, so its ack looks for none).
-- tidemq_dependency holds one row per edge: child_id waits on parent_id.
ALTER TABLE tidemq_message
  ADD COLUMN deps_left int(11) NOT NULL DEFAULT 0,
  ADD COLUMN workflow_id bigint(20) DEFAULT NULL;
CREATE TABLE `tidemq_dependency` (
  `parent_id` bigint(20) NOT NULL,
  `child_id` bigint(20) NOT NULL,
  PRIMARY KEY (`parent_id`,`child_id`),
  KEY `idx_dependency_child` (`child_id`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci;
INSERT INTO tidemq_schema_version (version, applied_at) VALUES (12, UTC_TIMESTAMP(3));
