-- 0002: the expiry sweeper finds unpaid orders past their payment deadline across all sales
-- (WHERE status = 'confirmed' AND expires_at <= now ORDER BY expires_at) without a scan.

-- +goose Up
ALTER TABLE orders ADD KEY orders_status_expires (status, expires_at);

-- +goose Down
ALTER TABLE orders DROP KEY orders_status_expires;
