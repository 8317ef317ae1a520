-- 0002: the expiry sweeper finds unpaid orders past their payment deadline across all sales
-- (WHERE status = 'confirmed' AND expires_at <= now ORDER BY expires_at) without a scan.
ALTER TABLE orders ADD KEY orders_status_expires (status, expires_at);
