-- 0013: when a sale's books in Redis were last rebuilt (docs/ingest.md, "The backend
-- trusts no message"), on MySQL's clock: set with the epoch, in the rebuild's
-- transaction. An order Redis has no trace of is written only when its id is older
-- than this (it was admitted before the rebuild, by a Redis that lost it); any other
-- such order was never admitted and ends failed, unadmitted. NULL: not rebuilt since
-- the column came (no order unknown to Redis is written until the next rebuild).

-- +goose Up
ALTER TABLE sales ADD COLUMN rebuilt_at DATETIME(3) NULL;

-- +goose Down
ALTER TABLE sales DROP COLUMN rebuilt_at;
