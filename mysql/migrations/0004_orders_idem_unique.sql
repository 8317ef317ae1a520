-- 0004: one order per (sale, user, Idempotency-Key), kept by MySQL itself. Redis holds the
-- key's first order for replays, but Redis can lose its data: a retry after the loss may be
-- admitted as a new order while the first is still in the stream. The writer turns such a
-- second order into a failed row with no key (idem_key NULL, reason duplicate_idempotency_key)
-- and gives its units back; this key is what guarantees it, across backends and batches.
-- NULL (no key) repeats freely.

-- +goose Up
ALTER TABLE orders ADD UNIQUE KEY orders_sale_user_idem (sale_id, user_id, idem_key);

-- +goose Down
ALTER TABLE orders DROP KEY orders_sale_user_idem;
