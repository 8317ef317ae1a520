-- 0001: the ledger. MySQL is the source of truth: every unit sold is counted
-- in sales.sold (and sale_regions.sold, user_purchases.units) by the same transaction that
-- inserts its order, under the guard UPDATE ... WHERE sold + n <= total.

-- +goose Up
CREATE TABLE sales (
  id             VARCHAR(64)  NOT NULL,
  title          VARCHAR(200) NOT NULL,
  price_cents    BIGINT       NOT NULL,
  total          BIGINT       NOT NULL,
  sold           BIGINT       NOT NULL DEFAULT 0,
  starts_at      DATETIME(3)  NOT NULL,
  ends_at        DATETIME(3)  NOT NULL,
  per_user_limit BIGINT       NOT NULL,
  per_order_max  BIGINT       NOT NULL,
  closed         TINYINT(1)   NOT NULL DEFAULT 0,
  created_at     DATETIME(3)  NOT NULL,
  updated_at     DATETIME(3)  NOT NULL,
  PRIMARY KEY (id),
  KEY sales_ends (closed, ends_at),
  CONSTRAINT sales_sold CHECK (sold >= 0 AND sold <= total)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE sale_regions (
  sale_id VARCHAR(64) NOT NULL,
  region  VARCHAR(16) NOT NULL,
  total   BIGINT      NOT NULL,
  sold    BIGINT      NOT NULL DEFAULT 0,
  PRIMARY KEY (sale_id, region),
  CONSTRAINT sale_regions_sold CHECK (sold BETWEEN 0 AND total)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE user_purchases (
  sale_id VARCHAR(64) NOT NULL,
  user_id VARCHAR(64) NOT NULL,
  units   BIGINT      NOT NULL DEFAULT 0,
  PRIMARY KEY (sale_id, user_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- orders.sale_id has no foreign key on purpose: an order of a sale MySQL does not know
-- still gets its row (failed, unknown_sale), so no accepted order is ever lost.
CREATE TABLE orders (
  id         BIGINT UNSIGNED NOT NULL,
  sale_id    VARCHAR(64)  NOT NULL,
  user_id    VARCHAR(64)  NOT NULL,
  quantity   BIGINT       NOT NULL,
  region     VARCHAR(16)  NOT NULL DEFAULT '',
  status     VARCHAR(16)  NOT NULL,
  reason     VARCHAR(64)  NOT NULL DEFAULT '',
  idem_key   VARCHAR(64)  NULL,
  created_at DATETIME(3)  NOT NULL,
  expires_at DATETIME(3)  NOT NULL,
  updated_at DATETIME(3)  NOT NULL,
  PRIMARY KEY (id),
  KEY orders_sale_status (sale_id, status),
  KEY orders_sale_user (sale_id, user_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE orders;
DROP TABLE user_purchases;
DROP TABLE sale_regions;
DROP TABLE sales;
