-- The tables of budgets in money (engine/features/budgets/models.py), applied by initdb after the
-- root schema.sql.

-- Budgets in money (issue 21 item 5; engine/features/budgets/): per user, per job type or
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
