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
  KEY `ai_job_user_id_lifecycle_status` (`user_id`, `lifecycle_status`),
  KEY `ai_job_user_id_created_at` (`user_id`, `created_at`),
  KEY `ai_job_job_type_created_at` (`job_type`, `created_at`),
  KEY `ai_job_job_type_queue_name_created_at` (`job_type`, `queue_name`, `created_at`),
  KEY `ai_job_queue_name_created_at` (`queue_name`, `created_at`),
  KEY `ai_job_created_at` (`created_at`),
  KEY `ai_job_retry_of_job_id` (`retry_of_job_id`),
  KEY `ai_job_finished_at` (`finished_at`)          -- the operators' throughput, bulk retry
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

CREATE TABLE IF NOT EXISTS `webhook_endpoint` (
  `id` VARCHAR(36) NOT NULL,
  `user_id` VARCHAR(64) NOT NULL,
  `url` VARCHAR(2048) NOT NULL,
  `events` LONGTEXT NULL,                       -- JSON array of event types; NULL: all
  `job_types` LONGTEXT NULL,                    -- JSON array of job types; NULL: all
  `job_id` VARCHAR(36) NULL,                    -- set: the webhookUrl of this one job
  `created_at` DATETIME(6) NOT NULL,
  `deleted_at` DATETIME(6) NULL,
  PRIMARY KEY (`id`),
  KEY `webhook_endpoint_user_id_deleted_at` (`user_id`, `deleted_at`),
  KEY `webhook_endpoint_job_id` (`job_id`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS `webhook_delivery` (
  `id` VARCHAR(36) NOT NULL,                    -- the webhook-id header of every attempt
  `endpoint_id` VARCHAR(36) NOT NULL,
  `event_id` BIGINT NOT NULL,                   -- outbox_event.id
  `event_type` VARCHAR(64) NOT NULL,
  `job_id` VARCHAR(36) NOT NULL,
  `status` VARCHAR(16) NOT NULL,                -- pending | sending | delivered | dead
  `attempt_count` INTEGER NOT NULL,
  `next_attempt_at` DATETIME(6) NOT NULL,       -- due time; while sending, the end of the claim
  `locked_by` VARCHAR(64) NULL,
  `last_status_code` INTEGER NULL,
  `last_error` VARCHAR(512) NULL,
  `delivered_at` DATETIME(6) NULL,
  `created_at` DATETIME(6) NOT NULL,
  `updated_at` DATETIME(6) NOT NULL,
  PRIMARY KEY (`id`),
  UNIQUE KEY `webhook_delivery_event_id_endpoint_id` (`event_id`, `endpoint_id`),
  KEY `webhook_delivery_status_next_attempt_at` (`status`, `next_attempt_at`),
  KEY `webhook_delivery_endpoint_id` (`endpoint_id`),
  KEY `webhook_delivery_job_id` (`job_id`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- Secrets the service makes for itself (the publicAccessToken key when no master key is set).
CREATE TABLE IF NOT EXISTS `app_secret` (
  `name` VARCHAR(64) NOT NULL,
  `value` VARCHAR(128) NOT NULL,
  `created_at` DATETIME(6) NOT NULL,
  PRIMARY KEY (`name`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

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

-- Budgets in money (issue 21 item 5; engine/gateway/budgets.py): per user, per job type or
-- global, per UTC day, month or in total. `amount` is in the units of ai_usage_log.cost.
CREATE TABLE IF NOT EXISTS `ai_budget` (
  `id` VARCHAR(36) NOT NULL,
  `scope` VARCHAR(16) NOT NULL,                 -- user | jobType | global
  `subject` VARCHAR(64) NOT NULL,               -- the user id or job type; '' when global
  `period` VARCHAR(8) NOT NULL,                 -- day | month | total
  `amount` DECIMAL(14, 6) NOT NULL,
  `on_exceeded` VARCHAR(8) NOT NULL,            -- fail | wait
  `created_at` DATETIME(6) NOT NULL,
  `updated_at` DATETIME(6) NOT NULL,
  PRIMARY KEY (`id`),
  UNIQUE KEY `ai_budget_scope_subject_period` (`scope`, `subject`, `period`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- A budget's spend in one period (`period_key`: d:YYYY-MM-DD, m:YYYY-MM or total), in millionths
-- of the cost unit (integers: exact on both databases): `spent_micros` grows in the transaction
-- that writes each call's usage row, `reserved_micros` is the sum of the open reservations
-- (ai_budget_reservation) counted against it.
CREATE TABLE IF NOT EXISTS `ai_budget_spend` (
  `id` BIGINT NOT NULL AUTO_INCREMENT,
  `budget_id` VARCHAR(36) NOT NULL,
  `period_key` VARCHAR(16) NOT NULL,
  `spent_micros` BIGINT NOT NULL,
  `reserved_micros` BIGINT NOT NULL,
  `created_at` DATETIME(6) NOT NULL,
  PRIMARY KEY (`id`),
  UNIQUE KEY `ai_budget_spend_budget_id_period_key` (`budget_id`, `period_key`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- One provider call's reservation of its maximum cost, held from before the call until its usage
-- row is written; `job_id` + `attempt_no` tie it to the job's lock, so the reaper releases the
-- reservation of a worker that died meanwhile.
CREATE TABLE IF NOT EXISTS `ai_budget_reservation` (
  `id` BIGINT NOT NULL AUTO_INCREMENT,
  `job_id` VARCHAR(36) NOT NULL,
  `attempt_no` INTEGER NOT NULL,
  `call_no` INTEGER NOT NULL,
  `amount_micros` BIGINT NOT NULL,             -- the call's maximum cost, in millionths
  `spend_ids` VARCHAR(255) NOT NULL,            -- the ai_budget_spend rows it counts in: "1,7,9"
  `created_at` DATETIME(6) NOT NULL,
  PRIMARY KEY (`id`),
  KEY `ai_budget_reservation_job_id` (`job_id`),
  KEY `ai_budget_reservation_created_at` (`created_at`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- The response cache (engine/gateway/cache.py), opt-in per job definition. One row per cache key
-- (SHA-256 of provider, model, prompt, rendered messages, sampling, output schema version and,
-- in scope 'user', the user). A row without output is a claim: its owner job is calling the
-- provider and identical jobs wait for its answer until the claim expires. The purger deletes
-- expired rows.
CREATE TABLE IF NOT EXISTS `ai_response_cache` (
  `cache_key` VARCHAR(64) NOT NULL,
  `job_type` VARCHAR(64) NOT NULL,
  `owner_job_id` VARCHAR(36) NOT NULL,
  `output` LONGTEXT NULL,                       -- the validated output; NULL while claimed
  `model` VARCHAR(128) NOT NULL,
  `prompt_tokens` INTEGER NOT NULL,
  `completion_tokens` INTEGER NOT NULL,
  `created_at` DATETIME(6) NOT NULL,
  `expires_at` DATETIME(6) NOT NULL,
  PRIMARY KEY (`cache_key`),
  KEY `ai_response_cache_expires_at` (`expires_at`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- Provider batches (issue 22, engine/gateway/batches/): a batch sent to a provider's batch API
-- and the job attempts in it. The stored file and batch ids and custom_id make each step
-- idempotent through any restart.
CREATE TABLE IF NOT EXISTS `ai_provider_batch` (
  `id` VARCHAR(36) NOT NULL,
  `provider` VARCHAR(64) NOT NULL,
  `model` VARCHAR(128) NOT NULL,
  `state` VARCHAR(16) NOT NULL,                 -- building | uploaded | submitted | cancelling | ended
  `provider_status` VARCHAR(32) NOT NULL,       -- what the provider last said
  `input_file_id` VARCHAR(128) NULL,
  `provider_batch_id` VARCHAR(128) NULL,
  `output_file_id` VARCHAR(128) NULL,
  `error_file_id` VARCHAR(128) NULL,
  `job_count` INTEGER NOT NULL,
  `succeeded_count` INTEGER NOT NULL,
  `failed_count` INTEGER NOT NULL,
  `cost` DECIMAL(14, 6) NOT NULL,
  `poll_count` INTEGER NOT NULL,
  `next_poll_at` DATETIME(6) NULL,
  `created_at` DATETIME(6) NOT NULL,
  `submitted_at` DATETIME(6) NULL,
  `ended_at` DATETIME(6) NULL,
  `updated_at` DATETIME(6) NOT NULL,
  PRIMARY KEY (`id`),
  KEY `ai_provider_batch_state_next_poll_at` (`state`, `next_poll_at`),
  KEY `ai_provider_batch_created_at` (`created_at`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS `ai_provider_batch_item` (
  `id` BIGINT NOT NULL AUTO_INCREMENT,
  `job_id` VARCHAR(36) NOT NULL,
  `attempt_no` INTEGER NOT NULL,
  `custom_id` VARCHAR(64) NOT NULL,             -- '<job id>:<attempt>'
  `group_key` VARCHAR(200) NOT NULL,            -- 'provider/model'
  `batch_id` VARCHAR(36) NULL,
  `state` VARCHAR(16) NOT NULL,                 -- waiting | batched | answered | failed | expired | cancelled | consumed
  `request` LONGTEXT NOT NULL,                  -- the chat completion body, as the online path sends it
  `response` LONGTEXT NULL,
  `error_code` VARCHAR(64) NULL,
  `max_wait_ms` INTEGER NOT NULL,
  `max_jobs` INTEGER NOT NULL,
  `parked_attempt` INTEGER NOT NULL,            -- the job's lock (attempt_no) deferred for it last
  `created_at` DATETIME(6) NOT NULL,
  `updated_at` DATETIME(6) NOT NULL,
  PRIMARY KEY (`id`),
  UNIQUE KEY `ai_provider_batch_item_custom_id` (`custom_id`),
  KEY `ai_provider_batch_item_job_id` (`job_id`),
  KEY `ai_provider_batch_item_batch_id` (`batch_id`),
  KEY `ai_provider_batch_item_state_group_key_created_at` (`state`, `group_key`, `created_at`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
