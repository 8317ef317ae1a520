-- 0003: purchase limits across dimensions (flashgate.Limit). A sale keeps its limits (JSON, as
-- the admin API took them) and the time zone their day and month windows begin in. Each order
-- keeps what it counts against them (flashgate.EncodeCharges), and limit_usage counts, per limit,
-- window and subject, the units (or orders) of live orders: the row the guard
-- UPDATE ... WHERE used + n <= max runs on, in the transaction that inserts the order.

-- +goose Up
ALTER TABLE sales
  ADD COLUMN limits    TEXT        NULL,
  ADD COLUMN time_zone VARCHAR(64) NOT NULL DEFAULT 'UTC';

ALTER TABLE orders ADD COLUMN charges VARCHAR(1024) NOT NULL DEFAULT '';

CREATE TABLE limit_usage (
  sale_id   VARCHAR(64) NOT NULL,
  lim       SMALLINT    NOT NULL, -- index into the sale's limits
  window_id VARCHAR(16) NOT NULL, -- 'sale', 'd20261122', 'm202611'
  subject   VARCHAR(64) NOT NULL,
  dimension VARCHAR(16) NOT NULL, -- the limit's, for people reading the table
  used      BIGINT      NOT NULL DEFAULT 0,
  PRIMARY KEY (sale_id, lim, window_id, subject),
  CONSTRAINT limit_usage_used CHECK (used >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE limit_usage;
ALTER TABLE orders DROP COLUMN charges;
ALTER TABLE sales DROP COLUMN limits, DROP COLUMN time_zone;
