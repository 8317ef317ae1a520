package backend

import (
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/internal/testenv"
)

// What a gateway's NATS credential can send the backends is bounded: a flood
// of warm requests for made-up sale ids starts no goroutine and runs no MySQL
// query per id, and leaves no per-id state behind; stats from a thousand
// made-up gateways, each naming a hundred made-up sales, keep at most
// maxGateways gateways and no series for a sale MySQL does not have, and a
// gateway gone silent is dropped on the next message. A real sale is still
// warmed on request after the flood.
func TestGatewayJunkBounded(t *testing.T) {
	// Not parallel: it counts the process's goroutines (and MySQL's statements).
	s := start(t, testenv.RedisAddrs(), nil)
	sale := spec(10, 2, nil)
	k := s.createSale(sale)
	nc := testenv.NATS(t)
	// The sale is new to the known set: a request for it has the set read.
	eventually(t, 5*time.Second, "the known set read", func() bool {
		_ = bus.PublishHint(nc, s.cfg.NATS, bus.SaleEvent{Type: bus.EventWarm, SaleID: sale.ID})
		s.b.warmer.mu.Lock()
		defer s.b.warmer.mu.Unlock()
		return s.b.warmer.known[sale.ID]
	})

	questions := func() int64 {
		var name string
		var n int64
		if err := s.db.QueryRowContext(ctx(t), `SHOW GLOBAL STATUS LIKE 'Questions'`).Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	goroutines, q0 := runtime.NumGoroutine(), questions()
	peak := goroutines
	const junk = 5000
	for i := range junk {
		ev := bus.SaleEvent{Type: bus.EventWarm, SaleID: "junk" + strconv.Itoa(i)}
		if err := bus.PublishHint(nc, s.cfg.NATS, ev); err != nil {
			t.Fatal(err)
		}
		if i%100 == 0 {
			peak = max(peak, runtime.NumGoroutine())
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		peak = max(peak, runtime.NumGoroutine())
		time.Sleep(5 * time.Millisecond)
	}
	q := questions() - q0
	s.b.warmer.mu.Lock()
	last, missed := len(s.b.warmer.last), len(s.b.warmer.missed)
	s.b.warmer.mu.Unlock()
	t.Logf("%d warm requests for made-up sales: goroutines %d → peak %d, MySQL statements %d (all sessions), state kept %d + %d",
		junk, goroutines, peak, q, last, missed)
	if peak > goroutines+20 {
		t.Errorf("goroutines peaked at %d, %d before the flood", peak, goroutines)
	}
	if q >= junk {
		t.Errorf("%d MySQL statements during %d requests for made-up sales", q, junk)
	}
	if last+missed > 100 {
		t.Errorf("the warmer keeps %d entries after the flood", last+missed)
	}

	// Stats from made-up gateways naming made-up sales, and one real gateway.
	at := time.Now().UTC()
	for g := range 1000 {
		st := bus.GatewayStats{Gateway: "fake" + strconv.Itoa(g), At: at, Sales: map[string]map[string]uint64{}}
		for i := range 100 {
			st.Sales["junk"+strconv.Itoa(g*100+i)] = map[string]uint64{"accepted": 1}
		}
		if err := bus.PublishStats(nc, s.cfg.NATS, st); err != nil {
			t.Fatal(err)
		}
	}
	heard := func(at time.Time) {
		st := bus.GatewayStats{Gateway: "real", At: at.UTC(), Sales: map[string]map[string]uint64{sale.ID: {"accepted": 3}}}
		if err := bus.PublishStats(nc, s.cfg.NATS, st); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	counts := func() (gws, hist int, junkSeries bool) {
		s.b.live.mu.Lock()
		defer s.b.live.mu.Unlock()
		for id := range s.b.live.hist {
			if id != sale.ID {
				junkSeries = true
			}
		}
		return len(s.b.live.gws), len(s.b.live.hist), junkSeries
	}
	eventually(t, 5*time.Second, "the stats heard", func() bool {
		gws, _, _ := counts()
		return gws > 0
	})
	time.Sleep(500 * time.Millisecond) // the rest of the flood
	gws, hist, junkSeries := counts()
	t.Logf("stats of 1000 made-up gateways: %d gateways kept, %d sales with series", gws, hist)
	if gws > maxGateways || junkSeries {
		t.Errorf("after the stats flood: %d gateways kept, series of made-up sales: %v", gws, junkSeries)
	}
	// Silent past gatewayForget, they are dropped on the next message, and
	// the real gateway is heard.
	time.Sleep(gatewayForget + 500*time.Millisecond)
	eventually(t, 10*time.Second, "silent gateways dropped", func() bool {
		heard(time.Now()) // as a gateway does every second
		time.Sleep(100 * time.Millisecond)
		s.b.live.mu.Lock()
		defer s.b.live.mu.Unlock()
		return len(s.b.live.gws) == 1 && s.b.live.gws["real"] != nil
	})

	// The real sale, lost by Redis, is still warmed on request.
	if err := s.rc.Do(ctx(t), s.rc.B().Del().Key(k.Meta).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the real sale warmed on request", func() bool {
		_ = bus.PublishHint(nc, s.cfg.NATS, bus.SaleEvent{Type: bus.EventWarm, SaleID: sale.ID})
		n, err := s.rc.Do(ctx(t), s.rc.B().Exists().Key(k.Meta).Build()).AsInt64()
		return err == nil && n == 1
	})
}
