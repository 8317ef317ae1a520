package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/internal/dial"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/metrics/metricstest"
)

// startSkewed is start with the gateway's clock off Redis's by skew.
func startSkewed(t *testing.T, skew time.Duration) *env {
	t.Helper()
	cfg := testenv.Config(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := dial.Gateway(cfg)
	if err != nil {
		t.Fatal(err)
	}
	g, err := Start(ctx, Deps{Redis: c.Redis, NATS: c.NATS, JetStream: c.JetStream,
		Now: func() time.Time { return time.Now().Add(skew) }}, cfg.GatewayOptions())
	if err != nil {
		c.Close()
		t.Fatalf("start gateway: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := g.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		c.Close()
	})
	return &env{t: t, cfg: cfg, g: g, rc: testenv.Redis(t, cfg.Redis.Addrs), url: "http://" + g.Addr()}
}

// TestGatewayClockSkew: Redis's clock decides (invariant 8). A gateway whose
// clock is 5 s fast does not open a sale early for its buyers (the sale
// starts in 3 s by Redis's clock: 425, nothing reserved), and the order it
// admits carries Redis's time, not its own, so no reservation or hold of it
// is aged by the gateway's clock; one 40 s slow does not make its
// reservations look stale (older than 30 s) the moment they are made. Each
// gateway exports its skew as flashgate_redis_clock_skew_seconds.
func TestGatewayClockSkew(t *testing.T) {
	for _, tc := range []struct {
		name string
		skew time.Duration
	}{
		{"5s fast", 5 * time.Second},
		{"40s slow", -40 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startSkewed(t, tc.skew)
			if tc.skew > 0 {
				soon := e.sale(func(s *flashgate.Sale) {
					s.StartsAt, s.EndsAt = time.Now().Add(3*time.Second), time.Now().Add(time.Hour)
				})
				if r := e.buy(soon, e.token("early"), `{}`, nil); r.Status != 425 || r.Code != "not_started" {
					t.Fatalf("3 s before the start by Redis's clock: %d %s, want 425 not_started", r.Status, r.Raw)
				}
				if rem, resv := e.stock(soon); rem != soon.Total || resv != 0 {
					t.Fatalf("after the early purchase: remaining %d, %d reservations; want %d, 0", rem, resv, soon.Total)
				}
			}
			open := e.sale(nil)
			r := e.buy(open, e.token("buyer"), `{}`, nil)
			if r.Status != 202 {
				t.Fatalf("purchase on an open sale: %d %s", r.Status, r.Raw)
			}
			k := lua.KeysFor(open.ID, nil)
			resv, err := lua.Reservations(context.Background(), e.rc, k)
			if err != nil || len(resv) != 1 {
				t.Fatalf("reservations %v %v, want 1", resv, err)
			}
			after, err := lua.ServerTime(context.Background(), e.rc, k.Resv)
			if err != nil {
				t.Fatal(err)
			}
			for id, o := range resv {
				if o.CreatedAt.After(after) {
					t.Errorf("reservation %d created at %v, after Redis's clock read after it (%v): stamped by the gateway's clock", id, o.CreatedAt, after)
				}
			}
			old, err := lua.Older(context.Background(), e.rc, k, resv, 30*time.Second)
			if err != nil || len(old) != 0 {
				t.Errorf("a reservation just made looks older than 30 s (%v %v)", old, err)
			}
			// The skew, sampled at start and every lua.SkewEvery.
			deadline := time.Now().Add(2 * lua.SkewEvery)
			for {
				v, ok := metricstest.Handler(t, e.g.metrics.Handler()).Value("flashgate_redis_clock_skew_seconds")
				if ok && (v-tc.skew.Seconds()) < 1 && (tc.skew.Seconds()-v) < 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("flashgate_redis_clock_skew_seconds = %v (%v), want about %v", v, ok, tc.skew.Seconds())
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}
