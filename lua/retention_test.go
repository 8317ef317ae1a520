package lua

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/internal/testenv"
)

// Retire removes every key of a sale, limit counters of each day and month
// it ran in included, and its entries in both indexes; other sales keep
// theirs. On a standalone Redis and on a Cluster (one slot per sale).
func TestRetire(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, target := range testenv.RedisTargets(t) {
		t.Run(target.Name, func(t *testing.T) {
			c := target.Client
			mk := func() *flashgate.Sale {
				now := time.Now().UTC().Truncate(time.Millisecond)
				return &flashgate.Sale{ID: testenv.ID("rt"), Title: "t", PriceCents: 1, Total: 10,
					// Three days across a month's end in Shanghai time.
					StartsAt: time.Date(2026, 10, 30, 20, 0, 0, 0, time.UTC), EndsAt: now.Add(-time.Hour),
					PerUserLimit: 5, PerOrderMax: 5, Regions: map[string]int64{"bj": 4, "sh": 6},
					TimeZone: "Asia/Shanghai",
					Limits: []flashgate.Limit{
						{Dimension: flashgate.DimUser, Max: 4, Per: flashgate.PerMonth},
						{Dimension: flashgate.DimPhone, Max: 1, Per: flashgate.PerDay},
						{Dimension: flashgate.DimDevice, Max: 3},
					}}
			}
			gone, kept := mk(), mk()
			var written []string
			for _, s := range []*flashgate.Sale{gone, kept} {
				if _, err := Load().Warm(ctx, c, s, map[string]int64{"bj": 4, "sh": 6}); err != nil {
					t.Fatal(err)
				}
				k := KeysFor(s.ID, s.RegionNames())
				loc, _ := s.Location()
				mid := s.StartsAt.Add(s.EndsAt.Sub(s.StartsAt) / 2)
				d, _ := flashgate.Window(flashgate.PerDay, mid, loc)
				m, _ := flashgate.Window(flashgate.PerMonth, s.StartsAt, loc)
				last, _ := flashgate.Window(flashgate.PerDay, s.EndsAt, loc)
				keys := []string{k.Users, k.Resv, k.Orders, k.Idem, k.Restocked(), k.Limit(flashgate.PerSale), k.Limit(d), k.Limit(m), k.Limit(last)}
				for _, key := range keys {
					if err := c.Do(ctx, c.B().Hset().Key(key).FieldValue().FieldValue("x", "1").Build()).Error(); err != nil {
						t.Fatal(err)
					}
				}
				if s == gone {
					written = append(keys, k.Meta)
				}
				t.Cleanup(func() { _, _ = Retire(context.Background(), c, s) })
			}
			for _, key := range written {
				if !slices.Contains(AllKeys(gone), key) {
					t.Errorf("AllKeys lacks %s", key)
				}
			}
			n, err := Retire(ctx, c, gone)
			if err != nil {
				t.Fatal(err)
			}
			if n != int64(len(written)+2) { // + two stock keys
				t.Errorf("retire deleted %d keys, want %d", n, len(written)+2)
			}
			for _, key := range AllKeys(gone) {
				if e, _ := c.Do(ctx, c.B().Exists().Key(key).Build()).AsInt64(); e != 0 {
					t.Errorf("%s left behind", key)
				}
			}
			live, err := LiveSales(ctx, c, time.Now().Add(-24*time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			if slices.Contains(live, gone.ID) || !slices.Contains(live, kept.ID) {
				t.Errorf("live index: retired in it %v, kept in it %v", slices.Contains(live, gone.ID), slices.Contains(live, kept.ID))
			}
			if _, err := LoadSale(ctx, c, kept.ID); err != nil {
				t.Errorf("the other sale: %v", err)
			}
			// Idempotent.
			if n, err := Retire(ctx, c, gone); err != nil || n != 0 {
				t.Errorf("second retire: %d %v", n, err)
			}
		})
	}
}

// A sale warmed before the live index existed (in the set only) gets its
// score from its meta; one without meta is left out.
func TestBackfillLive(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := testenv.Redis(t, testenv.RedisAddrs())
	now := time.Now().UTC().Truncate(time.Millisecond)
	s := &flashgate.Sale{ID: testenv.ID("bf"), Title: "t", PriceCents: 1, Total: 1,
		StartsAt: now.Add(-time.Hour), EndsAt: now.Add(time.Hour), PerUserLimit: 1, PerOrderMax: 1}
	if _, err := Load().Warm(ctx, c, s, map[string]int64{"": 1}); err != nil {
		t.Fatal(err)
	}
	cold := testenv.ID("bf")
	t.Cleanup(func() {
		_, _ = Retire(context.Background(), c, s)
		_ = Unindex(context.Background(), c, cold)
	})
	// As an older version left it.
	if err := c.Do(ctx, c.B().Zrem().Key(LiveIndex).Member(s.ID).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := c.Do(ctx, c.B().Sadd().Key(SalesIndex).Member(cold).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if _, err := BackfillLive(ctx, c); err != nil {
		t.Fatal(err)
	}
	score, err := c.Do(ctx, c.B().Zscore().Key(LiveIndex).Member(s.ID).Build()).AsFloat64()
	if err != nil || int64(score) != s.EndsAt.UnixMilli() {
		t.Errorf("backfilled score %v (%v), want %d", score, err, s.EndsAt.UnixMilli())
	}
	if err := c.Do(ctx, c.B().Zscore().Key(LiveIndex).Member(cold).Build()).Error(); err == nil {
		t.Error("a sale without meta was scored")
	}
}
