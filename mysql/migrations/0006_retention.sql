-- 0006: retention (docs/retention.md). A sale that is over and settled leaves Redis after
-- sales.retention; MySQL keeps it, with when it was closed (retention counts from the earlier of
-- ends_at and closed_at) and when the leader retired it from Redis (a retired sale is never warmed
-- again).

-- +goose Up
ALTER TABLE sales
  ADD COLUMN closed_at  DATETIME(3) NULL,
  ADD COLUMN retired_at DATETIME(3) NULL,
  ADD KEY sales_retired (retired_at, ends_at);

-- +goose Down
ALTER TABLE sales DROP KEY sales_retired, DROP COLUMN retired_at, DROP COLUMN closed_at;
