-- 0011: the outbox of order events (docs/events.md). Every status change of an order
-- (confirmed, failed, paid, canceled, expired) adds one row here in the transaction that makes
-- it; the backend leader publishes the rows in pos order to the order-events stream (Nats-Msg-Id
-- = event_id) and deletes them once JetStream acked them. orders.event_seq counts an order's
-- changes: the statement that changes the status raises it, and the event carries it, so a
-- consumer orders one order's events by seq and drops a second copy by event_id
-- ("<order id>-<seq>"). Orders written before this migration start at 0: their first event after
-- it has seq 1.

-- +goose Up
ALTER TABLE orders ADD COLUMN event_seq INT UNSIGNED NOT NULL DEFAULT 0;

CREATE TABLE order_events (
  pos          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  event_id     VARCHAR(32)     NOT NULL,
  order_id     BIGINT UNSIGNED NOT NULL,
  seq          INT UNSIGNED    NOT NULL,
  type         VARCHAR(16)     NOT NULL, -- confirmed failed paid canceled expired
  sale_id      VARCHAR(64)     NOT NULL,
  user_id      VARCHAR(64)     NOT NULL,
  status       VARCHAR(16)     NOT NULL, -- the order's status after the change
  reason       VARCHAR(64)     NOT NULL DEFAULT '',
  quantity     BIGINT          NOT NULL,
  region       VARCHAR(16)     NOT NULL DEFAULT '',
  amount_cents BIGINT          NULL,     -- price x quantity; NULL for an order of a sale MySQL does not know
  occurred_at  DATETIME(6)     NOT NULL, -- MySQL's clock, in the transaction of the change
  PRIMARY KEY (pos),
  UNIQUE KEY order_events_id (event_id),
  UNIQUE KEY order_events_order_seq (order_id, seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE order_events;
ALTER TABLE orders DROP COLUMN event_seq;
