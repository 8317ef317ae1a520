package e2e

import (
	"context"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashgate/flashgate/audit"
	"github.com/flashgate/flashgate/backend"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/mysql"
)

// TestFailedAdmissionsBoundedWork fails thousands of admissions at once: the
// sale's Redis is paused (SIGSTOP), so every admission times out and asks for
// its reservation to be undone. Those undos wait for Redis in a fixed pool fed
// by a bounded queue, not a goroutine each: while Redis is still paused the
// process holds a bounded number of goroutines. What overflowed the queue is
// reconcile's: once Redis is back, nothing stays reserved.
func TestFailedAdmissionsBoundedWork(t *testing.T) {
	const (
		requests = 3000
		clients  = 100
		workers  = 4
		queue    = 200
	)
	red := testenv.StartRedis(t)
	cfg := e2eConfig(t)
	cfg.Redis.Addrs = []string{red.Addr}
	cfg.Gateway.AdmitTimeout = 100 * time.Millisecond
	cfg.Gateway.BreakerFailures = 1 << 30 // every request tries Redis: the breaker would spare most
	cfg.Gateway.ReleaseWorkers, cfg.Gateway.ReleaseQueue = workers, queue
	cfg.RateLimit.PerIP.Rate, cfg.RateLimit.PerUser.Rate, cfg.RateLimit.PerSale.Rate = 0, 0, 0
	cfg.RateLimit.MaxInflight = 1 << 20
	b := startBackend(t, cfg)
	gw := startGateway(t, cfg)
	s := newSale(requests+100, 1)
	createSale(t, cfg, b.AdminAddr(), s)
	awaitSale(t, gw, s.ID)

	toks := tokens(t, cfg, "bw", requests)
	tr := &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: clients}
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	url := "http://" + gw.Addr() + "/v1/sales/" + s.ID + "/orders"
	base := runtime.NumGoroutine()

	red.Pause()
	paused := true
	defer func() {
		if paused {
			red.Resume()
		}
	}()
	var next, n503, other atomic.Int64
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= requests {
					return
				}
				req, _ := http.NewRequest("POST", url, strings.NewReader(`{"quantity":1}`))
				req.Header.Set("Authorization", string(toks[i]))
				res, err := client.Do(req)
				if err != nil {
					other.Add(1)
					continue
				}
				res.Body.Close()
				if res.StatusCode == 503 {
					n503.Add(1)
				} else {
					other.Add(1)
				}
			}
		})
	}
	wg.Wait()
	tr.CloseIdleConnections()
	// Redis is still paused: every undo is either waiting in the pool or was
	// refused by the full queue. A goroutine per undo would be thousands now.
	peak := runtime.NumGoroutine()
	red.Resume()
	paused = false
	if n503.Load() < requests*9/10 {
		t.Fatalf("%d of %d purchases answered 503 against a paused Redis (%d otherwise)", n503.Load(), requests, other.Load())
	}
	// The bound: the fixed pool, plus the HTTP server's and client's own
	// goroutines for at most `clients` connections, plus slack for the runtime.
	bound := base + workers + 3*clients + 200
	if peak > bound {
		t.Errorf("%d goroutines with Redis paused after %d failed admissions (before: %d, bound %d): background work is not bounded",
			peak, n503.Load(), base, bound)
	}

	// Reconcile finds what the queue could not take.
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, err := b.ReconcileWith(ctx, s.ID, backend.ReconcileOptions{StaleAfter: time.Millisecond})
		cancel()
		rep := drainTry(t, cfg, s.ID)
		if err == nil && rep.RedisReserved == 0 && rep.LedgerHolds {
			assertInvariants(t, rep)
			t.Logf("%d 503s; %d goroutines with Redis paused (before %d, bound %d); after reconcile: %s",
				n503.Load(), peak, base, bound, rep)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still reserved after reconcile: %s (err %v)", rep, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// drainTry audits the sale once (no accepted ids to look for).
func drainTry(t *testing.T, cfg config.Config, sale string) audit.Report {
	t.Helper()
	db, err := mysql.OpenDB(cfg.MySQL.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rep, err := audit.Check(context.Background(), db, testenv.Redis(t, cfg.Redis.Addrs), sale, nil)
	if err != nil {
		t.Logf("audit: %v", err)
	}
	return rep
}
