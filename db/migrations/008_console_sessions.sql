-- Version 8: the console's server-side sessions (signing out or changing a password ends them
-- for good) and its count of failed sign-ins, shared by every console process.
CREATE TABLE IF NOT EXISTS `tidemq_admin_session` (
  `id_hash` varchar(64) NOT NULL,
  `user_name` varchar(64) NOT NULL,
  `created` datetime(3) NOT NULL,
  `last_seen` datetime(3) NOT NULL,
  PRIMARY KEY (`id_hash`),
  KEY `idx_admin_session_user` (`user_name`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci;
CREATE TABLE IF NOT EXISTS `tidemq_login_failure` (
  `key_hash` varchar(64) NOT NULL,
  `failures` int(11) NOT NULL,
  `last_failure` datetime(3) NOT NULL,
  PRIMARY KEY (`key_hash`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci;
INSERT INTO tidemq_schema_version (version, applied_at) VALUES (8, UTC_TIMESTAMP(3));
