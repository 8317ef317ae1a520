-- 0012: who did what on the admin API (docs/credentials.md). Every change an admin key
-- makes (create, update, pause, resume, close, reconcile, ...) is a row: the key's id and
-- role, the address it came from, MySQL's time, what it acted on, and the state before and
-- after as JSON. And a sale's pause (docs/runbook.md, "Pause a sale"): MySQL keeps it so
-- that a rebuild of Redis from MySQL restores it.

-- +goose Up
CREATE TABLE admin_audit (
  id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  at          DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  key_id      VARCHAR(64)     NOT NULL,
  role        VARCHAR(16)     NOT NULL,
  source      VARCHAR(64)     NOT NULL,
  action      VARCHAR(32)     NOT NULL,
  sale_id     VARCHAR(64)     NULL,
  target      VARCHAR(64)     NULL,
  before_json LONGTEXT        NULL,
  after_json  LONGTEXT        NULL,
  PRIMARY KEY (id),
  KEY admin_audit_sale (sale_id, id),
  CONSTRAINT admin_audit_before CHECK (before_json IS NULL OR JSON_VALID(before_json)),
  CONSTRAINT admin_audit_after CHECK (after_json IS NULL OR JSON_VALID(after_json))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

ALTER TABLE sales ADD COLUMN paused TINYINT(1) NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE sales DROP COLUMN paused;
DROP TABLE admin_audit;
