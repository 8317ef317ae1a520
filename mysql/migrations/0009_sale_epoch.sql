-- 0009: the epoch of a sale's books in Redis (docs/recovery.md, "One rebuild"). Every
-- rebuild of Redis from MySQL and the stream raises it, under the sale row lock, in the
-- transaction that reads what it rebuilds from; the rebuilt keys carry it, and a Redis
-- script called with an older one (a write-back of a decision the rebuild already
-- counted) changes nothing. 0: never rebuilt since the column came.

-- +goose Up
ALTER TABLE sales ADD COLUMN epoch BIGINT UNSIGNED NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE sales DROP COLUMN epoch;
