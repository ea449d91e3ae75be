-- aijob: the deployed MySQL/MariaDB schema. `python aijob.py initdb` applies it; every statement is
-- idempotent (CREATE TABLE IF NOT EXISTS, indexes declared inline), so it is safe to run twice.
-- engine/store.py holds the same tables as peewee models; tests/test_schema.py checks they agree.
-- Times are UTC DATETIME(6) written from the database clock (UTC_TIMESTAMP(6)).

CREATE TABLE IF NOT EXISTS `ai_job` (
  `id` VARCHAR(36) NOT NULL,
  `lifecycle_status` VARCHAR(16) NOT NULL,      -- queued | running | succeeded | failed | cancelled
  `queue_name` VARCHAR(32) NOT NULL,            -- ai-interactive | ai-background
  `priority` INTEGER NOT NULL,                  -- 0 = highest, 100 = lowest
  `progress` INTEGER NOT NULL,                  -- 0..100
  `user_id` VARCHAR(64) NOT NULL,
  `job_type` VARCHAR(64) NOT NULL,
  `target_type` VARCHAR(64) NOT NULL,
  `target_id` VARCHAR(128) NOT NULL,
  `idempotency_key` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,  -- exact: initdb makes it NO PAD where it can (store.py)
  `request_fingerprint` VARCHAR(64) NOT NULL,   -- SHA-256 of the canonical request
  `credential_mode` VARCHAR(32) NOT NULL,       -- platform_key | user_deepseek_key
  `credential_id` VARCHAR(36) NULL,
  `prompt_version` VARCHAR(32) NULL,
  `output_schema_version` VARCHAR(32) NULL,
  `locked_by` VARCHAR(64) NULL,                 -- worker instance holding the lock
  `locked_at` DATETIME(6) NULL,
  `lock_until` DATETIME(6) NULL,
  `attempt_no` INTEGER NOT NULL,                -- fencing token: +1 at every lock
  `retry_count` INTEGER NOT NULL,               -- engine retries used
  `max_retry_count` INTEGER NOT NULL,
  `cancel_requested_at` DATETIME(6) NULL,
  `started_at` DATETIME(6) NULL,
  `finished_at` DATETIME(6) NULL,
  `error_code` VARCHAR(64) NULL,
  `public_error_message` VARCHAR(512) NULL,
  `internal_error_message` TEXT NULL,           -- SUPER_ADMIN only
  `output_hash` VARCHAR(64) NULL,
  `retry_of_job_id` VARCHAR(36) NULL,
  `created_at` DATETIME(6) NOT NULL,
  `updated_at` DATETIME(6) NOT NULL,
  `defer_count` INTEGER NOT NULL DEFAULT 0,     -- locks that ended deferred (not attempts)
  PRIMARY KEY (`id`),
  UNIQUE KEY `ai_job_user_id_job_type_idempotency_key` (`user_id`, `job_type`, `idempotency_key`),
  KEY `ai_job_lifecycle_status_lock_until` (`lifecycle_status`, `lock_until`),
  KEY `ai_job_lifecycle_status_created_at` (`lifecycle_status`, `created_at`),
  KEY `ai_job_user_id_created_at` (`user_id`, `created_at`),
  KEY `ai_job_job_type_created_at` (`job_type`, `created_at`),
  KEY `ai_job_job_type_queue_name_created_at` (`job_type`, `queue_name`, `created_at`),
  KEY `ai_job_queue_name_created_at` (`queue_name`, `created_at`),
  KEY `ai_job_created_at` (`created_at`),
  KEY `ai_job_retry_of_job_id` (`retry_of_job_id`),
  KEY `ai_job_finished_at` (`finished_at`),         -- the operators' throughput, bulk retry
  KEY `ai_job_lifecycle_status_user_id_started_at_created_at`
    (`lifecycle_status`, `user_id`, `started_at`, `created_at`)  -- the busiest users
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS `ai_job_snapshot` (
  `id` BIGINT NOT NULL AUTO_INCREMENT,
  `job_id` VARCHAR(36) NOT NULL,
  `content` LONGTEXT NOT NULL,                  -- JSON: validated input and overrides
  `redaction_version` INTEGER NOT NULL,
  `expires_at` DATETIME(6) NULL,
  `created_at` DATETIME(6) NOT NULL,
  PRIMARY KEY (`id`),
  UNIQUE KEY `ai_job_snapshot_job_id` (`job_id`),
  KEY `ai_job_snapshot_expires_at` (`expires_at`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS `ai_artifact` (
  `id` VARCHAR(36) NOT NULL,
  `job_id` VARCHAR(36) NOT NULL,
  `artifact_type` VARCHAR(64) NOT NULL,
  `content` LONGTEXT NOT NULL,                  -- JSON
  `content_hash` VARCHAR(64) NOT NULL,
  `created_at` DATETIME(6) NOT NULL,
  PRIMARY KEY (`id`),
  KEY `ai_artifact_job_id` (`job_id`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS `ai_job_artifact` (
  `id` BIGINT NOT NULL AUTO_INCREMENT,
  `job_id` VARCHAR(36) NOT NULL,
  `artifact_type` VARCHAR(64) NOT NULL,
  `artifact_id` VARCHAR(64) NOT NULL,
  `ordinal` INTEGER NOT NULL,
  `created_at` DATETIME(6) NOT NULL,
  PRIMARY KEY (`id`),
  UNIQUE KEY `ai_job_artifact_job_id_artifact_type_artifact_id` (`job_id`, `artifact_type`, `artifact_id`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS `outbox_event` (
  `id` BIGINT NOT NULL AUTO_INCREMENT,
  `event_type` VARCHAR(64) NOT NULL,
  `aggregate_type` VARCHAR(64) NOT NULL,
  `aggregate_id` VARCHAR(64) NOT NULL,
  `dedupe_key` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,  -- exact, as idempotency_key
  `payload` LONGTEXT NOT NULL,                  -- JSON: {jobId, jobType, queueName, priority} only
  `status` VARCHAR(16) NOT NULL,                -- pending | processing | published | failed | dead
  `attempt_count` INTEGER NOT NULL,
  `available_at` DATETIME(6) NOT NULL,
  `locked_by` VARCHAR(64) NULL,
  `locked_at` DATETIME(6) NULL,
  `last_error` VARCHAR(512) NULL,
  `created_at` DATETIME(6) NOT NULL,
  `updated_at` DATETIME(6) NOT NULL,
  PRIMARY KEY (`id`),
  UNIQUE KEY `outbox_event_dedupe_key` (`dedupe_key`),
  KEY `outbox_event_status_available_at` (`status`, `available_at`),
  KEY `outbox_event_status_locked_at` (`status`, `locked_at`),
  KEY `outbox_event_aggregate_id` (`aggregate_id`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS `ai_usage_log` (
  `id` BIGINT NOT NULL AUTO_INCREMENT,
  `job_id` VARCHAR(36) NOT NULL,
  `user_id` VARCHAR(64) NOT NULL,
  `job_type` VARCHAR(64) NOT NULL,
  `attempt_no` INTEGER NOT NULL,
  `call_no` INTEGER NOT NULL DEFAULT 1,
  `credential_mode` VARCHAR(32) NOT NULL,
  `provider` VARCHAR(64) NOT NULL,
  `model` VARCHAR(128) NOT NULL,
  `prompt_tokens` INTEGER NOT NULL,
  `completion_tokens` INTEGER NOT NULL,
  `cost` DECIMAL(14, 6) NOT NULL,
  `latency_ms` INTEGER NOT NULL,
  `error_code` VARCHAR(64) NULL,
  `cached` TINYINT(1) NOT NULL DEFAULT 0,       -- answered by the response cache, cost 0
  `batch_id` VARCHAR(36) NULL,                  -- answered in this ai_provider_batch
  `created_at` DATETIME(6) NOT NULL,
  PRIMARY KEY (`id`),
  KEY `ai_usage_log_job_id` (`job_id`),
  KEY `ai_usage_log_user_id_created_at` (`user_id`, `created_at`),
  KEY `ai_usage_log_job_type_created_at` (`job_type`, `created_at`),
  KEY `ai_usage_log_created_at` (`created_at`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS `user_model_credential` (
  `id` VARCHAR(36) NOT NULL,
  `user_id` VARCHAR(64) NOT NULL,
  `provider` VARCHAR(64) NOT NULL,
  `encrypted_key` TEXT NOT NULL,                -- AES-256-GCM, base64(nonce || ciphertext)
  `masked_key` VARCHAR(32) NOT NULL,
  `created_at` DATETIME(6) NOT NULL,
  PRIMARY KEY (`id`),
  KEY `user_model_credential_user_id` (`user_id`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS `api_token` (
  `id` BIGINT NOT NULL AUTO_INCREMENT,
  `token_hash` VARCHAR(64) NOT NULL,            -- SHA-256 of the bearer token; never the token
  `user_id` VARCHAR(64) NOT NULL,               -- the user; for role service, its name
  `role` VARCHAR(16) NOT NULL,                  -- user | service | SUPER_ADMIN
  `created_at` DATETIME(6) NOT NULL,
  `revoked_at` DATETIME(6) NULL,
  `last_used_at` DATETIME(6) NULL,              -- at most once a minute per token
  `token_hint` VARCHAR(16) NULL,                -- the first characters, to tell tokens apart
  PRIMARY KEY (`id`),
  UNIQUE KEY `api_token_token_hash` (`token_hash`),
  KEY `api_token_user_id` (`user_id`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- The transition history (architecture decision 14): one row per lifecycle change of a job.
CREATE TABLE IF NOT EXISTS `ai_job_event` (
  `id` BIGINT NOT NULL AUTO_INCREMENT,          -- increasing: the history's order, a stream's cursor
  `job_id` VARCHAR(36) NOT NULL,
  `kind` VARCHAR(32) NOT NULL,                  -- created | dispatched | started | taken_over | ...
  `attempt_no` INTEGER NOT NULL,                -- the job's attempt (lock) when it happened
  `detail` LONGTEXT NOT NULL,                   -- JSON; engine/core/history.py says who sees what
  `created_at` DATETIME(6) NOT NULL,
  PRIMARY KEY (`id`),
  KEY `ai_job_event_job_id_id` (`job_id`, `id`),
  KEY `ai_job_event_created_at` (`created_at`)  -- the purge of old history
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- Secrets the service makes for itself (the publicAccessToken key when no master key is set).
CREATE TABLE IF NOT EXISTS `app_secret` (
  `name` VARCHAR(64) NOT NULL,
  `value` VARCHAR(128) NOT NULL,
  `created_at` DATETIME(6) NOT NULL,
  PRIMARY KEY (`name`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- One row per named lease (architecture decision 12): the `housekeeping` lease's holder runs the
-- reaper, reconciler, outbox polling, webhook fan-out and purge. Taken and renewed by CAS on the
-- database clock; released on a clean shutdown.
CREATE TABLE IF NOT EXISTS `leader_lease` (
  `name` VARCHAR(64) NOT NULL,
  `holder` VARCHAR(128) NOT NULL,               -- the holding process's instance id
  `acquired_at` DATETIME(6) NOT NULL,           -- when this holder took it
  `expires_at` DATETIME(6) NOT NULL,
  PRIMARY KEY (`name`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- A user's admission counters (engine/core/admission.py): unfinished jobs, and jobs created on
-- `day` (UTC), changed in the transactions that create and finish jobs.
CREATE TABLE IF NOT EXISTS `ai_user_admission` (
  `user_id` VARCHAR(64) NOT NULL,
  `active` INTEGER NOT NULL,                    -- queued or running
  `day` DATE NOT NULL,                          -- the UTC day of created_on_day
  `created_on_day` INTEGER NOT NULL,
  `last_job_id` VARCHAR(36) NOT NULL,           -- the last job admitted
  `active_limit` INTEGER NOT NULL DEFAULT 0,    -- the limits the last create was held to
  `daily_limit` INTEGER NOT NULL DEFAULT 0,     -- (0: none)
  PRIMARY KEY (`user_id`),
  -- A create that would pass a limit fails its upsert here (engine/core/admission.py)
  CONSTRAINT `admission_within_limits` CHECK (
    (`active_limit` = 0 OR `active` <= `active_limit`)
    AND (`daily_limit` = 0 OR `created_on_day` <= `daily_limit`))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

