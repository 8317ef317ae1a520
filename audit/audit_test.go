package audit_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/audit"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/mysql"
)

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func openDB(t *testing.T) *sql.DB {
	t.Helper()
	db, err := mysql.OpenDB(testenv.MySQL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := mysql.Migrate(ctx(t), db); err != nil {
		t.Fatal(err)
	}
	return db
}

func exec(t *testing.T, db *sql.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.ExecContext(ctx(t), q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// healthy writes a sale as the backend leaves it after a drain: total 10, limit
// 2, regions bj 6 / sh 4; u1 bought 2 in bj, u2 1 in sh, u3's order failed;
// Redis holds the 7 units left. It answers the accepted order ids.
func healthy(t *testing.T, db *sql.DB, rc rueidis.Client, sale string) []uint64 {
	t.Helper()
	now := time.Now().UTC().Truncate(time.Millisecond)
	exec(t, db, `INSERT INTO sales (id, title, price_cents, total, sold, starts_at, ends_at, per_user_limit, per_order_max, created_at, updated_at)
		VALUES (?, 'audit', 100, 10, 3, ?, ?, 2, 2, ?, ?)`, sale, now.Add(-time.Hour), now.Add(time.Hour), now, now)
	exec(t, db, `INSERT INTO sale_regions (sale_id, region, total, sold) VALUES (?, 'bj', 6, 2), (?, 'sh', 4, 1)`, sale, sale)
	exec(t, db, `INSERT INTO user_purchases (sale_id, user_id, units) VALUES (?, 'u1', 2), (?, 'u2', 1), (?, 'u3', 0)`, sale, sale, sale)
	ids := []uint64{uint64(now.UnixNano()), uint64(now.UnixNano()) + 1, uint64(now.UnixNano()) + 2}
	exec(t, db, `INSERT INTO orders (id, sale_id, user_id, quantity, region, status, reason, created_at, expires_at, updated_at) VALUES
		(?, ?, 'u1', 2, 'bj', 'confirmed', '', ?, ?, ?),
		(?, ?, 'u2', 1, 'sh', 'paid', '', ?, ?, ?),
		(?, ?, 'u3', 1, 'sh', 'failed', 'sold_out', ?, ?, ?)`,
		ids[0], sale, now, now, now, ids[1], sale, now, now, now, ids[2], sale, now, now, now)
	s := &flashgate.Sale{ID: sale, Title: "audit", Total: 10, StartsAt: now.Add(-time.Hour), EndsAt: now.Add(time.Hour),
		PerUserLimit: 2, PerOrderMax: 2, Regions: map[string]int64{"bj": 6, "sh": 4}}
	k := lua.KeysFor(sale, s.RegionNames())
	t.Cleanup(func() {
		_, stock := k.StockKeys()
		rc.Do(context.Background(), rc.B().Del().Key(append(stock, k.Meta, k.Users, k.Resv, k.Orders, k.Idem)...).Build())
		lua.Unindex(context.Background(), rc, sale)
	})
	if _, err := lua.Load().Warm(ctx(t), rc, s, map[string]int64{"bj": 4, "sh": 3}); err != nil {
		t.Fatal(err)
	}
	return ids
}

func TestCheckHealthy(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	for _, target := range testenv.RedisTargets(t) {
		sale := testenv.ID("a")
		accepted := healthy(t, db, target.Client, sale)
		r, err := audit.Check(ctx(t), db, target.Client, sale, accepted)
		if err != nil {
			t.Fatal(err)
		}
		if !r.OK() {
			t.Errorf("%s: healthy sale fails the audit: %v", target.Name, r)
		}
		want := audit.Report{SaleID: sale, Total: 10, Sold: 3, LiveUnits: 3, Orders: 3, RedisRemaining: 7,
			LedgerHolds: true, DistinctBuyers: 2}
		if r.Total != want.Total || r.Sold != want.Sold || r.LiveUnits != want.LiveUnits || r.Orders != want.Orders ||
			r.RedisRemaining != want.RedisRemaining || r.DistinctBuyers != want.DistinctBuyers ||
			r.ByStatus["confirmed"] != 1 || r.ByStatus["paid"] != 1 || r.ByStatus["failed"] != 1 {
			t.Errorf("%s: %v", target.Name, r)
		}
	}
	if _, err := audit.Check(ctx(t), db, testenv.Redis(t, testenv.RedisAddrs()), "nosuchsale", nil); !errors.Is(err, audit.ErrSaleNotFound) {
		t.Errorf("unknown sale: %v", err)
	}
}

func TestCheckFindsBreakage(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	rc := testenv.Redis(t, testenv.RedisAddrs())
	for _, tc := range []struct {
		name   string
		mutate func(t *testing.T, sale string, accepted []uint64) []uint64
		want   func(r audit.Report) bool
	}{
		{"sold bumped by hand", func(t *testing.T, sale string, a []uint64) []uint64 {
			exec(t, db, `UPDATE sales SET sold = sold + 1 WHERE id = ?`, sale)
			return a
		}, func(r audit.Report) bool { return r.Duplicated == 1 && !r.LedgerHolds && r.LedgerDiff == 1 }},
		{"accepted order lost", func(t *testing.T, sale string, a []uint64) []uint64 {
			return append(a, 42)
		}, func(r audit.Report) bool { return r.Lost == 1 }},
		{"oversold", func(t *testing.T, sale string, a []uint64) []uint64 {
			exec(t, db, `INSERT INTO orders (id, sale_id, user_id, quantity, region, status, created_at, expires_at, updated_at)
				VALUES (7, ?, 'u9', 5, 'sh', 'confirmed', NOW(), NOW(), NOW())`, sale)
			return a
		}, func(r audit.Report) bool {
			// 8 live units of 10 overall, but sh has 6 live of 4.
			return r.Oversold == 2 && r.OverLimitUsers == 1 && r.Duplicated > 0
		}},
		{"over the limit", func(t *testing.T, sale string, a []uint64) []uint64 {
			exec(t, db, `INSERT INTO orders (id, sale_id, user_id, quantity, region, status, created_at, expires_at, updated_at)
				VALUES (8, ?, 'u1', 1, 'bj', 'confirmed', NOW(), NOW(), NOW())`, sale)
			exec(t, db, `UPDATE sales SET sold = sold + 1 WHERE id = ?`, sale)
			exec(t, db, `UPDATE sale_regions SET sold = sold + 1 WHERE sale_id = ? AND region = 'bj'`, sale)
			exec(t, db, `UPDATE user_purchases SET units = units + 1 WHERE sale_id = ? AND user_id = 'u1'`, sale)
			return a
		}, func(r audit.Report) bool { return r.OverLimitUsers == 1 && r.Oversold == 0 && r.Duplicated == 0 }},
		{"user counter drifted", func(t *testing.T, sale string, a []uint64) []uint64 {
			exec(t, db, `UPDATE user_purchases SET units = 0 WHERE sale_id = ? AND user_id = 'u1'`, sale)
			return a
		}, func(r audit.Report) bool { return r.Duplicated == 2 && r.LedgerHolds }},
		{"reservation left in Redis", func(t *testing.T, sale string, a []uint64) []uint64 {
			k := lua.KeysFor(sale, nil)
			if err := rc.Do(ctx(t), rc.B().Hset().Key(k.Resv).FieldValue().FieldValue("99", "u5|2|bj|1|2|").Build()).Error(); err != nil {
				t.Fatal(err)
			}
			return a
		}, func(r audit.Report) bool { return r.RedisReserved == 2 && !r.LedgerHolds && r.LedgerDiff == 2 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sale := testenv.ID("b")
			accepted := tc.mutate(t, sale, healthy(t, db, rc, sale))
			r, err := audit.Check(ctx(t), db, rc, sale, accepted)
			if err != nil {
				t.Fatal(err)
			}
			if r.OK() || !tc.want(r) {
				t.Errorf("ok=%v: %v", r.OK(), r)
			}
		})
	}
}
