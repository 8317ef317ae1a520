-- 0010: payments (docs/payments.md). The shop's payment service, never the buyer, marks an
-- order paid (POST /v1/payments, signed): the transaction that moves the order to paid writes
-- the payment's id and amount on its row. A repeated payment_id answers what the row says; the
-- unique key keeps one payment from paying two orders.

-- +goose Up
ALTER TABLE orders
  ADD COLUMN payment_id   VARCHAR(64) NULL,
  ADD COLUMN amount_cents BIGINT      NULL,
  ADD UNIQUE KEY orders_payment (payment_id);

-- +goose Down
ALTER TABLE orders DROP KEY orders_payment, DROP COLUMN amount_cents, DROP COLUMN payment_id;
