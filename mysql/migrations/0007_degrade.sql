-- 0007: the degraded lane (docs/degrade.md). A sale says what its purchases meet while its Redis
-- shard is unreachable: 'closed' (503) or 'mysql' (decided here under the sale row lock, at most
-- degrade_rate at once per gateway; 0 = the default). stale counts the orders the lane wrote
-- since Redis last matched MySQL: while it is not 0 the fast path stays off, until the leader
-- has warmed the sale again from MySQL and set it back to 0 (only if no lane order came since).

-- +goose Up
ALTER TABLE sales
  ADD COLUMN degrade      VARCHAR(8) NOT NULL DEFAULT 'closed',
  ADD COLUMN degrade_rate INT        NOT NULL DEFAULT 0,
  ADD COLUMN stale        BIGINT     NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE sales DROP COLUMN stale, DROP COLUMN degrade_rate, DROP COLUMN degrade;
