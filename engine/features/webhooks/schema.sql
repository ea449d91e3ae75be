-- The webhooks' tables on MySQL/MariaDB (engine/features/webhooks/models.py describes the same
-- ones): applied by `python aijob.py initdb` after the kernel's schema.sql. Safe to run twice.

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
