package chaos

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/loadgen"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/mysql"
)

// Redis stopped (SIGSTOP: it keeps its data) for 20 s in the middle of a sale
// with degrade: mysql. Purchases go on through the MySQL lane meanwhile; once
// Redis answers again the leader warms the stale sale from MySQL and the fast
// path resumes. Oversold, over-limit and lost stay 0, and at rest Redis
// agrees with MySQL: the ledger, and every buyer's units.
func init() {
	scenarios = append(scenarios, scenario{"redis down, degrade=mysql", redisDownDegradeMySQL})
}

const (
	degradeOutage = 20 * time.Second
	degradeFlood  = 32 * time.Second
	// degradeRate paces each gateway's buyers (open loop): the sale must
	// not sell out before Redis stops, nor the buyers reach their limits.
	degradeRate = 500
)

func redisDownDegradeMySQL(t *testing.T) {
	st := newStack(t)
	now := time.Now()
	s := &flashgate.Sale{ID: testenv.ID("degrade"), Title: "chaos", PriceCents: 100, Total: 30000,
		StartsAt: now.Add(-time.Second), EndsAt: now.Add(time.Hour), PerUserLimit: 2, PerOrderMax: 1,
		Degrade: flashgate.DegradeMySQL, DegradeRate: 64}
	if code, b := st.admin("POST", "/admin/v1/sales", s); code != 201 {
		t.Fatalf("create sale: %d %s", code, b)
	}
	st.hist.sale(s)
	st.waitSale(s.ID)

	var paused, resumed time.Time
	var mu sync.Mutex
	var accepted []uint64
	var sent int64
	var wg sync.WaitGroup
	for i, g := range st.gateways {
		toks := make([][]byte, 12000)
		names := make([]string, len(toks))
		for j := range toks {
			names[j] = "dg" + strconv.Itoa(i) + "u" + strconv.Itoa(j)
			tok, err := auth.MintHS256(st.cfg.Auth.JWTSecret, names[j], auth.MintOptions{})
			if err != nil {
				t.Fatal(err)
			}
			toks[j] = []byte("Bearer " + tok)
		}
		wg.Go(func() {
			res, err := loadgen.Run(context.Background(), loadgen.Config{
				Target: "http://" + g.addr, Sale: s.ID, Tokens: toks, Concurrency: 64, Duration: degradeFlood, Rate: degradeRate,
				Record: true,
			})
			if err != nil {
				t.Errorf("%s flood: %v", g.name, err)
				return
			}
			st.hist.calls(s.ID, names, 1, "", res.Calls)
			mu.Lock()
			accepted = append(accepted, res.Accepted...)
			sent += res.Requests
			mu.Unlock()
			t.Logf("%s: %d requests, by code %v", g.name, res.Requests, res.ByCode)
		})
	}
	time.Sleep(3 * time.Second)
	// On a cluster: the sale's master, its replica kept from taking over
	// (the shard is gone whole, not failed over).
	down := st.redisOf(s.ID)
	st.holdShard(down)
	down.Pause()
	paused = time.Now()
	time.Sleep(degradeOutage)
	down.Resume()
	resumed = time.Now()
	st.faultEnd = resumed
	wg.Wait()

	db, err := mysql.OpenDB(st.cfg.MySQL.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// The lane's orders are the ones made while Redis was stopped.
	var during int64
	if err := db.QueryRow(`SELECT COUNT(*) FROM orders WHERE sale_id = ? AND created_at >= ? AND created_at < ?`,
		s.ID, paused.UTC(), resumed.UTC()).Scan(&during); err != nil {
		t.Fatal(err)
	}
	rate := float64(during) / resumed.Sub(paused).Seconds()
	t.Logf("degraded lane: %d orders in the %s Redis was stopped: %.0f purchases/s", during, resumed.Sub(paused).Round(time.Millisecond), rate)
	if during == 0 {
		t.Error("no purchase went through while Redis was stopped")
		for _, p := range append([]*proc{st.backend}, st.gateways...) {
			b, _ := os.ReadFile(p.log)
			var keep []string
			for _, l := range strings.Split(string(b), "\n") {
				if !strings.Contains(l, "undid a reservation") {
					keep = append(keep, l)
				}
			}
			t.Logf("%s log:\n%s", p.name, tail([]byte(strings.Join(keep, "\n")), 30))
		}
	}
	var after int64
	if err := db.QueryRow(`SELECT COUNT(*) FROM orders WHERE sale_id = ? AND created_at >= ?`, s.ID, resumed.Add(2*time.Second).UTC()).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after == 0 {
		t.Error("no purchase went through after Redis came back")
	}

	rep, rec := st.settle(s.ID, accepted)
	row, err := mysql.LoadSale(context.Background(), db, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if row.Stale != 0 {
		t.Errorf("the sale is still stale (%d lane orders not warmed into Redis)", row.Stale)
	}
	// Redis's buyers agree with MySQL's.
	rc := testenv.Redis(t, st.cfg.Redis.Addrs)
	red, err := rc.Do(context.Background(), rc.B().Hgetall().Key(lua.KeysFor(s.ID, nil).Users).Build()).AsIntMap()
	if err != nil {
		t.Fatal(err)
	}
	var differ, buyers int
	err = mysql.EachBuyer(context.Background(), db, s.ID, func(user string, units int64) error {
		if units > 0 {
			buyers++
		}
		if red[user] != units {
			differ++
		}
		delete(red, user)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range red {
		if n != 0 {
			differ++
		}
	}
	if differ > 0 {
		t.Errorf("%d of %d buyers hold other units in Redis than in MySQL", differ, buyers)
	}
	t.Logf("lane rate %.0f/s; recovery %s", rate, rec.Round(10*time.Millisecond))
	record(t, "redis down 20s, degrade=mysql", sent, accepted, rep, rec)
}

// waitSale waits until every gateway serves the sale.
func (st *stack) waitSale(id string) {
	st.t.Helper()
	for _, g := range st.gateways {
		deadline := time.Now().Add(10 * time.Second)
		for {
			res, err := httpClient.Get("http://" + g.addr + "/v1/sales/" + id)
			if err == nil {
				res.Body.Close()
				if res.StatusCode == 200 {
					break
				}
			}
			if time.Now().After(deadline) {
				st.t.Fatalf("%s never learnt of sale %s", g.name, id)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
