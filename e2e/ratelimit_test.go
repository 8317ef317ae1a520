package e2e

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/internal/wire"
	"github.com/flashgate/flashgate/loadgen"
)

// TestSaleRateAcrossThreeGateways: three gateways against one Redis Cluster,
// each flooded with purchases of one sale well over its per-sale rate. In
// global mode the fleet lets through what the limit allows (burst + rate ×
// time) within 10%; in local mode each gateway has its own budget, so the
// fleet lets through about three times that (the contrast is what the global
// mode is for).
func TestSaleRateAcrossThreeGateways(t *testing.T) {
	const rate, burst = 300.0, 30
	for _, mode := range []string{config.RateGlobal, config.RateLocal} {
		t.Run(mode, func(t *testing.T) {
			cfg := e2eConfig(t)
			cfg.Redis.Addrs = testenv.ClusterAddrs()
			cfg.RateLimit = config.RateLimit{Mode: mode, PerSale: config.Rate{Rate: rate, Burst: burst}}
			be := startBackend(t, cfg)
			gws := []*wire.Gateway{startGateway(t, cfg), startGateway(t, cfg), startGateway(t, cfg)}
			s := newSale(1_000_000, 1_000_000)
			createSale(t, cfg, be.AdminAddr(), s)
			for _, gw := range gws {
				awaitSale(t, gw, s.ID)
			}
			toks := tokens(t, cfg, "rl", 500)
			var mu sync.Mutex
			var passed, refused int64
			var longest time.Duration
			var wg sync.WaitGroup
			for _, gw := range gws {
				addr := gw.Addr()
				wg.Add(1)
				go func() {
					defer wg.Done()
					res, err := loadgen.Run(context.Background(), loadgen.Config{
						Target: "http://" + addr, Sale: s.ID, Tokens: toks, Concurrency: 16, Duration: 3 * time.Second,
					})
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					defer mu.Unlock()
					// Every answer but 429 went past the per-sale limit (202s,
					// and whatever the admission said after it).
					for code, n := range res.ByStatus {
						if code == 429 {
							refused += n
						} else {
							passed += n
						}
					}
					if res.ByStatus[503] != 0 || res.Errors != 0 {
						t.Errorf("%s: statuses %v, %d transport errors", addr, res.ByStatus, res.Errors)
					}
					longest = max(longest, res.Elapsed)
				}()
			}
			wg.Wait()
			want := burst + rate*longest.Seconds()
			t.Logf("%s: %d passed the per-sale limit, %d refused, in %v; the limit allows %.0f", mode, passed, refused, longest.Round(time.Millisecond), want)
			if refused == 0 {
				t.Fatalf("nothing refused: the flood did not reach the limit")
			}
			switch mode {
			case config.RateGlobal:
				if math.Abs(float64(passed)-want) > 0.1*want {
					t.Errorf("fleet let %d through, want %.0f ± 10%%", passed, want)
				}
			case config.RateLocal:
				if float64(passed) < 2*want {
					t.Errorf("three local budgets let %d through, want about 3 × %.0f", passed, want)
				}
			}
		})
	}
}
