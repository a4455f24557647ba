-- Version 5: authentication. One row per principal allowed to call brokers that run with
-- TIDEMQ_AUTH=token: its role, the topic patterns it covers and the SHA-256 of its token.
CREATE TABLE IF NOT EXISTS `tidemq_principal` (
  `name` varchar(64) NOT NULL,
  `role` varchar(16) NOT NULL,
  `topics` varchar(1024) NOT NULL,
  `token_hash` varchar(64) NOT NULL,
  `created` datetime(3) NOT NULL,
  `revoked` datetime(3) DEFAULT NULL,
  PRIMARY KEY (`name`),
  UNIQUE KEY `idx_principal_token_hash` (`token_hash`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci;
INSERT INTO tidemq_schema_version (version, applied_at) VALUES (5, UTC_TIMESTAMP(3));
