-- The tables of provider batches (engine/features/batches/models.py), applied by initdb after the
-- root schema.sql.

-- Provider batches (issue 22, engine/features/batches/): a batch sent to a provider's batch API
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
