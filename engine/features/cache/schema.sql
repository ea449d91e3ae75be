-- The tables of the response cache (engine/features/cache/models.py), applied by initdb after the
-- root schema.sql.

-- The response cache (engine/features/cache/), opt-in per job definition. One row per cache key
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
