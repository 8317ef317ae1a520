package gateway

import (
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
)

// With the sale's Redis stopped (and its breaker open), a sale with degrade:
// mysql goes to the lane
// and answers its decisions as the fast path answers the script's; a sale
// without a lane answers 503 and never asks it; degrade_rate caps what is on
// the lane at once; stale and fresh events move the sale on and off the lane.
// The lane here is the test's own responder on the lane's subject, so that
// every decision can be asked for (backend and mysql test the real one).
func TestLaneAnswers(t *testing.T) {
	red := testenv.StartRedis(t)
	e := start(t, func(c *config.Config) {
		c.Redis.Addrs = []string{red.Addr}
		c.Gateway.AdmitTimeout = 300 * time.Millisecond
		c.Gateway.BreakerFailures = 2
		c.Gateway.BreakerOpen = time.Second
	})
	nc := testenv.NATS(t)
	var next atomic.Pointer[bus.LaneReply]
	var asked atomic.Int64
	var last atomic.Pointer[bus.LanePurchase]
	var hold sync.Mutex // held by the test: the lane waits on it
	sub, err := bus.ServePurchases(nc, e.cfg.NATS, func(p bus.LanePurchase) bus.LaneReply {
		asked.Add(1)
		last.Store(&p)
		hold.Lock()
		defer hold.Unlock()
		return *next.Load()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	s := e.sale(func(s *flashgate.Sale) { s.Degrade, s.DegradeRate = flashgate.DegradeMySQL, 1 })
	plain := e.sale(nil)
	user := 0
	buy := func(s *flashgate.Sale, body string, hdr map[string]string) reply {
		user++
		return e.buy(s, e.token("lane"+strconv.Itoa(user)), body, hdr)
	}
	if r := buy(s, `{"quantity":1}`, nil); r.Status != 202 || asked.Load() != 0 {
		t.Fatalf("Redis up: %d %s, lane asked %d times", r.Status, r.Raw, asked.Load())
	}

	red.Pause()
	defer red.Resume()
	// An admission sent to the stopped Redis is a 503, not the lane (Redis
	// may run it when it wakes); two of them open the breaker.
	for range 2 {
		if r := buy(s, `{"quantity":1}`, nil); r.Status != 503 || asked.Load() != 0 {
			t.Fatalf("admission timed out: %d %s, lane asked %d times", r.Status, r.Raw, asked.Load())
		}
	}
	cases := []struct {
		name   string
		reply  bus.LaneReply
		status int
		code   string
		check  func(reply) bool
	}{
		{"admitted", bus.LaneReply{Outcome: "ok", OrderID: 4242, Remaining: 3}, 202, "accepted",
			func(r reply) bool { return r.OrderID == "4242" && r.State == "confirmed" }},
		{"replay", bus.LaneReply{Outcome: "replay", OrderID: 4241, Status: "paid"}, 202, "accepted",
			func(r reply) bool { return r.OrderID == "4241" && r.State == "paid" }},
		{"limit", bus.LaneReply{Outcome: "limit_reached", Limit: -1, Held: 2}, 403, "limit_reached",
			func(r reply) bool { return strings.Contains(string(r.Raw), `"dimension":"user"`) }},
		{"not started", bus.LaneReply{Outcome: "not_started", WaitMS: 2500}, 425, "not_started",
			func(r reply) bool { return r.RetryAfter == "3" }},
		{"ended", bus.LaneReply{Outcome: "ended"}, 410, "ended", nil},
		{"bad quantity", bus.LaneReply{Outcome: "bad_quantity"}, 400, "invalid_request", nil},
		{"bad order", bus.LaneReply{Outcome: "bad_order"}, 400, "invalid_request", nil},
		{"undecided", bus.LaneReply{Outcome: "unavailable"}, 503, "unavailable", nil},
		{"fresh, Redis still away", bus.LaneReply{Outcome: "fresh"}, 503, "unavailable", nil},
		{"sold out", bus.LaneReply{Outcome: "sold_out"}, 409, "sold_out", nil},
	}
	for _, c := range cases {
		next.Store(&c.reply)
		before := asked.Load()
		r := buy(s, `{"quantity":1}`, map[string]string{"Idempotency-Key": "k" + c.code})
		if r.Status != c.status || r.Code != c.code || (c.check != nil && !c.check(r)) || asked.Load() == before {
			t.Errorf("%s: %d %s (lane asked %d times)", c.name, r.Status, r.Raw, asked.Load()-before)
		}
		if c.reply.Outcome == "ok" && !e.g.sales.get([]byte(s.ID)).lane.stale.Load() {
			t.Error("an admitted lane order did not mark the sale stale")
		}
	}
	if p := last.Load(); p.SaleID != s.ID || p.Quantity != 1 || p.IdemKey != "ksold_out" || p.ExpiresMS <= p.CreatedMS {
		t.Errorf("the lane got %+v", p)
	}
	gs := e.g.sales.get([]byte(s.ID))
	// Sold out is marked: the next buyer is answered from memory.
	before := asked.Load()
	if r := buy(s, `{"quantity":1}`, nil); r.Status != 409 || asked.Load() != before {
		t.Errorf("after sold out: %d %s, lane asked %d times", r.Status, r.Raw, asked.Load()-before)
	}
	e.g.restocked(gs, "")

	// No lane: 503, the lane never asked.
	before = asked.Load()
	if r := buy(plain, `{"quantity":1}`, nil); r.Status != 503 || asked.Load() != before {
		t.Errorf("sale without a lane: %d %s, lane asked %d times", r.Status, r.Raw, asked.Load()-before)
	}

	// degrade_rate 1: while one purchase is on the lane the next is 503 at once.
	next.Store(&bus.LaneReply{Outcome: "ok", OrderID: 77, Remaining: 5})
	hold.Lock()
	first := make(chan reply, 1)
	before = asked.Load()
	go func() { first <- buy(s, `{"quantity":1}`, nil) }()
	for asked.Load() == before {
		select {
		case r := <-first:
			// Answered without the lane: waiting for the lane would never end.
			hold.Unlock()
			t.Fatalf("the first purchase never reached the lane: %d %s", r.Status, r.Raw)
		case <-time.After(5 * time.Millisecond):
		}
	}
	if r := buy(s, `{"quantity":1}`, nil); r.Status != 503 || r.Message != "degraded lane busy" {
		t.Errorf("second purchase on a full lane: %d %s", r.Status, r.Raw)
	}
	hold.Unlock()
	if r := <-first; r.Status != 202 || r.OrderID != "77" {
		t.Errorf("the purchase on the lane: %d %s", r.Status, r.Raw)
	}

	// fresh and stale events move the sale off and on the lane.
	if err := bus.PublishEvent(nc, e.cfg.NATS, bus.SaleEvent{Type: bus.EventFresh, SaleID: s.ID}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "fresh event", func() bool { return !gs.lane.stale.Load() })
	if err := bus.PublishEvent(nc, e.cfg.NATS, bus.SaleEvent{Type: bus.EventStale, SaleID: s.ID}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "stale event", func() bool { return gs.lane.stale.Load() })
	red.Resume()
	// Redis back but the sale stale: still the lane (the lane says when it is fresh).
	before = asked.Load()
	if r := buy(s, `{"quantity":1}`, nil); r.Status != 202 || r.OrderID != "77" || asked.Load() != before+1 {
		t.Errorf("stale sale, Redis back: %d %s", r.Status, r.Raw)
	}
	next.Store(&bus.LaneReply{Outcome: "fresh"})
	waitFor(t, "the fast path back", func() bool {
		r := buy(s, `{"quantity":1}`, nil)
		return r.Status == 202 && r.OrderID != "77"
	})
	if gs.lane.stale.Load() {
		t.Error("a fresh answer left the sale stale")
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 15s: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
