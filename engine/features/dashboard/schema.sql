-- The dashboard's table (engine/features/dashboard/models.py): `python aijob.py initdb` applies it
-- after the kernel's schema.sql; idempotent like it. tests/test_schema.py checks it agrees with
-- the model.

-- Dashboard sign-ins: the SHA-256 of the session id only; the id itself is the HttpOnly cookie.
CREATE TABLE IF NOT EXISTS `dashboard_session` (
  `session_hash` VARCHAR(64) NOT NULL,
  `token_hash` VARCHAR(64) NOT NULL,            -- the admin token it was opened with (api_token)
  `user_id` VARCHAR(64) NOT NULL,
  `created_at` DATETIME(6) NOT NULL,
  `expires_at` DATETIME(6) NOT NULL,
  PRIMARY KEY (`session_hash`),
  KEY `dashboard_session_expires_at` (`expires_at`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
