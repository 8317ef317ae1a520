package backend

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

// started is a running backend with clients of the test's own.
type started struct {
	*env
	b  *Backend
	nc *nats.Conn
	js jetstream.JetStream
}

// start runs a backend on a fresh database, stream and consumer; cfgFn adjusts
// the configuration first.
func start(t *testing.T, redisAddrs []string, cfgFn func(*config.Config)) *started {
	t.Helper()
	e := newEnv(t, redisAddrs)
	e.cfg.Backend.AckWait = 2 * time.Second // quick redeliveries
	if cfgFn != nil {
		cfgFn(&e.cfg)
	}
	b, err := dialAndStart(t, e.cfg)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.Shutdown(c); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	nc := testenv.NATS(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &started{env: e, b: b, nc: nc, js: js}
}

// publish sends an order like a gateway: JetStream, Nats-Msg-Id = order id.
func (s *started) publish(m flashgate.Order) {
	s.t.Helper()
	if _, err := s.js.Publish(ctx(s.t), bus.OrderSubject(s.cfg.NATS, m.SaleID), bus.AppendOrder(nil, &m),
		jetstream.WithMsgID(strconv.FormatUint(m.ID, 10))); err != nil {
		s.t.Fatalf("publish: %v", err)
	}
}

// call makes an admin request with the test's token (token "" sends none).
func (s *started) call(method, path, token, body string) (int, map[string]any) {
	s.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx(s.t), method, "http://"+s.b.AdminAddr()+path, rd)
	if err != nil {
		s.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		s.t.Fatalf("%s %s: %d %q: %v", method, path, res.StatusCode, raw, err)
	}
	return res.StatusCode, out
}

func (s *started) consumerIdle() bool {
	c, err := s.js.Consumer(ctx(s.t), s.cfg.NATS.Stream, s.cfg.NATS.Consumer)
	if err != nil {
		s.t.Fatal(err)
	}
	info, err := c.Info(ctx(s.t))
	if err != nil {
		s.t.Fatal(err)
	}
	return info.NumPending == 0 && info.NumAckPending == 0
}

func saleBody(id string, total, limit int64, extra string) string {
	now := time.Now().UTC()
	return `{"id":"` + id + `","title":"phone","price_cents":99900,"total":` + strconv.FormatInt(total, 10) +
		`,"starts_at":"` + now.Add(-time.Minute).Format(time.RFC3339Nano) + `","ends_at":"` +
		now.Add(time.Hour).Format(time.RFC3339Nano) + `","per_user_limit":` + strconv.FormatInt(limit, 10) + extra + `}`
}

func TestEndToEnd(t *testing.T) {
	t.Parallel()
	for _, target := range []struct {
		name  string
		addrs []string
	}{{"standalone", testenv.RedisAddrs()}, {"cluster", testenv.ClusterAddrs()}} {
		t.Run(target.name, func(t *testing.T) {
			t.Parallel()
			s := start(t, target.addrs, nil)
			sale := spec(20, 2, nil)
			k := s.createSale(sale)

			// An unparseable message first: it must not block the good ones.
			if _, err := s.js.Publish(ctx(t), bus.OrderSubject(s.cfg.NATS, sale.ID), []byte(`{"id":"not a number"`)); err != nil {
				t.Fatal(err)
			}
			// An order whose publish "failed" and which the gateway released, then
			// published after all (it got through): the tombstone drops it.
			gone := admit(t, s.rc, k, "g1", 1, "")
			if r, err := s.scripts.Release(ctx(t), s.rc, k, gone.ID, "", "", lua.ReleaseGateway, flashgate.ReasonPublishFailed); err != nil || !r.Released {
				t.Fatalf("release: %+v %v", r, err)
			}
			s.publish(gone)
			var accepted []uint64
			for i := range 6 {
				m := admit(t, s.rc, k, "u"+strconv.Itoa(i%3), 1, "")
				s.publish(m)
				accepted = append(accepted, m.ID)
			}
			// A duplicate publish inside the dedup window is dropped by JetStream;
			// a redelivery would be a no-op anyway.
			s.publish(flashgate.Order{ID: accepted[0], SaleID: sale.ID, UserID: "u0", Quantity: 1})

			eventually(t, 10*time.Second, "6 confirmed rows", func() bool { return s.rows(sale.ID, "confirmed") == 6 })
			eventually(t, 10*time.Second, "consumer drained (bad message terminated)", s.consumerIdle)
			if _, _, ok := s.order(gone.ID); ok {
				t.Error("the released order has a row")
			}
			for _, id := range accepted {
				if st, _ := redisStatus(t, s.rc, k, id); st != "confirmed" {
					t.Errorf("redis status of %d = %q", id, st)
				}
			}
			if r := check(t, s.env, sale.ID, accepted); !r.OK() || r.Sold != 6 || r.Orders != 6 {
				t.Errorf("audit: %v", r)
			}
		})
	}
}

// MySQL fails mid-flight (the orders table vanishes): nothing is acked, and
// the orders are written once it is back.
func TestConsumerRidesOutMySQLOutage(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	sale := spec(10, 2, nil)
	k := s.createSale(sale)
	if _, err := s.db.ExecContext(ctx(t), `RENAME TABLE orders TO orders_away`); err != nil {
		t.Fatal(err)
	}
	m := admit(t, s.rc, k, "u1", 2, "")
	s.publish(m)
	// The batch fails: the claim happened, the write did not, the message waits.
	eventually(t, 5*time.Second, "order claimed", func() bool {
		st, _ := redisStatus(t, s.rc, k, m.ID)
		return st == "processing"
	})
	time.Sleep(300 * time.Millisecond)
	if s.consumerIdle() {
		t.Fatal("the message was acked while MySQL could not write it")
	}
	if got := s.sold(sale.ID); got != 0 {
		t.Fatalf("sold = %d during the outage", got)
	}
	if _, err := s.db.ExecContext(ctx(t), `RENAME TABLE orders_away TO orders`); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "order written after the outage", func() bool { return s.rows(sale.ID, "confirmed") == 1 })
	eventually(t, 5*time.Second, "consumer drained", s.consumerIdle)
	if r := check(t, s.env, sale.ID, []uint64{m.ID}); !r.OK() {
		t.Errorf("audit: %v", r)
	}
}

func TestAdminAPI(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	tok := s.cfg.Admin.Token
	events := make(chan bus.SaleEvent, 16)
	sub, err := bus.SubscribeEvents(s.nc, s.cfg.NATS, func(ev bus.SaleEvent) { events <- ev })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := s.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	id := testenv.ID("adm")
	cleanRedisID(t, s.rc, id)

	for _, tc := range []struct {
		name, method, path, token, body string
		status                          int
		code                            string
	}{
		{"no token", "POST", "/admin/v1/sales", "", saleBody(id, 10, 2, ""), 401, "unauthorized"},
		{"bad token", "POST", "/admin/v1/sales", tok + "x", saleBody(id, 10, 2, ""), 401, "unauthorized"},
		{"bad token ledger", "GET", "/admin/v1/sales/" + id, "nope", "", 401, "unauthorized"},
		{"malformed", "POST", "/admin/v1/sales", tok, `{"id":`, 400, "invalid_request"},
		{"unknown field", "POST", "/admin/v1/sales", tok, saleBody(id, 10, 2, `,"colour":"red"`), 400, "invalid_request"},
		{"trailing data", "POST", "/admin/v1/sales", tok, saleBody(id, 10, 2, "") + `{}`, 400, "invalid_request"},
		{"invalid total", "POST", "/admin/v1/sales", tok, saleBody(id, 0, 2, ""), 400, "invalid_request"},
		{"regions do not add up", "POST", "/admin/v1/sales", tok, saleBody(id, 10, 2, `,"regions":{"bj":4}`), 400, "invalid_request"},
		{"per_order_max over limit", "POST", "/admin/v1/sales", tok, saleBody(id, 10, 2, `,"per_order_max":3`), 400, "invalid_request"},
		{"too many buckets", "POST", "/admin/v1/sales", tok, saleBody(id, 100, 2, `,"buckets":65`), 400, "invalid_request"},
		{"bucket tags from the client", "POST", "/admin/v1/sales", tok, saleBody(id, 100, 2, `,"buckets":2,"bucket_tags":["a","b"]`), 400, "invalid_request"},
		{"ledger of no sale", "GET", "/admin/v1/sales/" + id, tok, "", 404, "sale_not_found"},
		{"close no sale", "POST", "/admin/v1/sales/" + id + "/close", tok, "", 404, "sale_not_found"},
	} {
		status, body := s.call(tc.method, tc.path, tc.token, tc.body)
		if status != tc.status || body["code"] != tc.code || body["message"] == "" {
			t.Errorf("%s: %d %v, want %d %s", tc.name, status, body, tc.status, tc.code)
		}
	}

	status, body := s.call("POST", "/admin/v1/sales", tok, saleBody(id, 10, 2, `,"regions":{"bj":6,"sh":4}`))
	if status != 201 || body["id"] != id || body["per_order_max"] != float64(1) || body["total"] != float64(10) {
		t.Fatalf("create: %d %v", status, body)
	}
	ev := nextEvent(t, events)
	if ev.Type != bus.EventCreated || ev.SaleID != id || ev.Sale == nil || ev.Sale.Regions["bj"] != 6 {
		t.Errorf("created event: %+v", ev)
	}
	if status, body := s.call("POST", "/admin/v1/sales", tok, saleBody(id, 10, 2, "")); status != 409 || body["code"] != "conflict" {
		t.Errorf("duplicate: %d %v", status, body)
	}
	// Redis knows the sale now, as MySQL has it.
	got, err := lua.LoadSale(ctx(t), s.rc, id)
	if err != nil || got.Total != 10 || got.PerUserLimit != 2 || got.Regions["sh"] != 4 {
		t.Fatalf("redis meta: %+v %v", got, err)
	}

	k := lua.KeysFor(id, []string{"bj", "sh"})
	var accepted []uint64
	for _, r := range []string{"bj", "bj", "sh"} {
		m := admit(t, s.rc, k, "buyer-"+r+strconv.Itoa(len(accepted)), 1, r)
		s.publish(m)
		accepted = append(accepted, m.ID)
	}
	eventually(t, 10*time.Second, "3 rows", func() bool { return s.rows(id, "confirmed") == 3 })
	eventually(t, 5*time.Second, "reservations settled", func() bool { return reservations(t, s.rc, k) == 0 })
	status, body = s.call("GET", "/admin/v1/sales/"+id, tok, "")
	inv, _ := body["invariant3"].(map[string]any)
	if status != 200 || inv["holds"] != true || inv["diff"] != float64(0) || body["sold"] != float64(3) ||
		body["remaining"] != float64(7) || inv["total"] != float64(10) {
		t.Errorf("ledger: %d %v", status, body)
	}
	if byRegion, _ := body["sold_by_region"].(map[string]any); byRegion["bj"] != float64(2) || byRegion["sh"] != float64(1) {
		t.Errorf("sold by region: %v", body["sold_by_region"])
	}
	if st, _ := body["orders_by_status"].(map[string]any); st["confirmed"].(map[string]any)["units"] != float64(3) {
		t.Errorf("orders by status: %v", body["orders_by_status"])
	}

	// An order admitted before the close and written after it is a 202 given:
	// it is confirmed.
	late := admit(t, s.rc, k, "late", 1, "sh")
	status, body = s.call("POST", "/admin/v1/sales/"+id+"/close", tok, "")
	if status != 200 || body["closed"] != true {
		t.Errorf("close: %d %v", status, body)
	}
	if ev := nextEvent(t, events); ev.Type != bus.EventClosed || ev.SaleID != id {
		t.Errorf("closed event: %+v", ev)
	}
	now := time.Now()
	a, err := s.scripts.Admit(ctx(t), s.rc, k, lua.AdmitArgs{User: "after", Quantity: 1, OrderID: nextID.Add(1), Now: now, Region: "bj", PayBy: now.Add(time.Minute)})
	if err != nil || a.Outcome != lua.Ended {
		t.Errorf("admit after close: %v %v, want ended", a.Outcome, err)
	}
	s.publish(late)
	eventually(t, 10*time.Second, "late order written", func() bool { _, _, ok := s.order(late.ID); return ok })
	if st, why, _ := s.order(late.ID); st != "confirmed" {
		t.Errorf("an order admitted before the close: %s/%s, want confirmed", st, why)
	}
	eventually(t, 5*time.Second, "reservations settled", func() bool { return reservations(t, s.rc, k) == 0 })
	if r := check(t, s.env, id, append(accepted, late.ID)); !r.OK() {
		t.Errorf("audit after close: %v", r)
	}

	if status, body := s.call("POST", "/admin/v1/sales/"+id+"/reconcile", tok, ""); status != 200 || body["invariant3_holds"] != true {
		t.Errorf("reconcile: %d %v", status, body)
	}
	if status, body := s.call("GET", "/admin/v1/nothing", "", ""); status != 401 {
		t.Errorf("unknown admin route without token: %d %v", status, body)
	}
	if status, _ := s.call("GET", "/healthz", "", ""); status != 200 {
		t.Errorf("healthz: %d", status)
	}
	if status, body := s.call("GET", "/readyz", "", ""); status != 200 || body["status"] != "ready" {
		t.Errorf("readyz: %d %v", status, body)
	}
}

func TestAdminWithoutToken(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), func(c *config.Config) { c.Admin.Token = "" })
	id := testenv.ID("adm")
	for _, tok := range []string{"", "anything"} {
		if status, body := s.call("POST", "/admin/v1/sales", tok, saleBody(id, 10, 2, "")); status != 401 || body["code"] != "unauthorized" {
			t.Errorf("create with %q: %d %v", tok, status, body)
		}
	}
	req, _ := http.NewRequest("GET", "http://"+s.b.AdminAddr()+"/admin/v1/sales/x", nil)
	req.Header.Set("Authorization", "Bearer ")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 401 {
		t.Errorf("empty bearer: %d", res.StatusCode)
	}
	if n := s.queryInt(`SELECT COUNT(*) FROM sales`); n != 0 {
		t.Errorf("%d sales created without a token", n)
	}
}

func TestWarming(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.RedisAddrs())
	// Sales MySQL has from before: one half sold, one closed, one ended.
	open := spec(10, 3, map[string]int64{"bj": 6, "sh": 4})
	closed, ended := spec(10, 3, nil), spec(10, 3, nil)
	closed.Closed = true
	ended.StartsAt, ended.EndsAt = ended.StartsAt.Add(-2*time.Hour), ended.StartsAt.Add(-time.Hour)
	for _, s := range []*flashgate.Sale{open, closed, ended} {
		if err := insertSale(ctx(t), e.db, s, s.StartsAt); err != nil {
			t.Fatal(err)
		}
		cleanRedis(t, e.rc, s)
	}
	for _, q := range []string{
		`UPDATE sales SET sold = 4 WHERE id = ?`,
		`UPDATE sale_regions SET sold = 3 WHERE sale_id = ? AND region = 'bj'`,
		`UPDATE sale_regions SET sold = 1 WHERE sale_id = ? AND region = 'sh'`,
		`INSERT INTO user_purchases (sale_id, user_id, units) VALUES (?, 'u1', 3), (?, 'u2', 1)`,
	} {
		args := []any{open.ID}
		if strings.Count(q, "?") == 2 {
			args = append(args, open.ID)
		}
		if _, err := e.db.ExecContext(ctx(t), q, args...); err != nil {
			t.Fatal(err)
		}
	}
	// A stale user entry that MySQL does not back must go.
	k := lua.KeysFor(open.ID, open.RegionNames())
	if err := e.rc.Do(ctx(t), e.rc.B().Hset().Key(k.Users).FieldValue().FieldValue("ghost", "9").Build()).Error(); err != nil {
		t.Fatal(err)
	}

	b, err := dialAndStart(t, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown(context.Background())

	checkWarm := func() {
		t.Helper()
		if got := remaining(t, e.rc, k, "bj"); got != 3 {
			t.Errorf("bj remaining = %d, want 3", got)
		}
		if got := remaining(t, e.rc, k, "sh"); got != 3 {
			t.Errorf("sh remaining = %d, want 3", got)
		}
		users, err := e.rc.Do(ctx(t), e.rc.B().Hgetall().Key(k.Users).Build()).AsStrMap()
		if err != nil || len(users) != 2 || users["u1"] != "3" || users["u2"] != "1" {
			t.Errorf("users hash: %v %v", users, err)
		}
		// u1 holds the limit: Redis refuses it more.
		now := time.Now()
		a, err := e.scripts.Admit(ctx(t), e.rc, k, lua.AdmitArgs{User: "u1", Quantity: 1, OrderID: nextID.Add(1), Now: now, Region: "bj", PayBy: now})
		if err != nil || a.Outcome != lua.LimitReached {
			t.Errorf("admit u1: %v %v, want limit_reached", a.Outcome, err)
		}
	}
	checkWarm()
	for _, s := range []*flashgate.Sale{closed, ended} {
		if _, err := lua.LoadSale(ctx(t), e.rc, s.ID); err != lua.ErrNotWarmed {
			t.Errorf("sale %s warmed at start: %v", s.ID, err)
		}
	}

	// Redis loses the sale; a gateway asks for a warm.
	if err := e.rc.Do(ctx(t), e.rc.B().Del().Key(k.Meta, k.Users).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	nc := testenv.NATS(t)
	eventually(t, 5*time.Second, "warmed on request", func() bool {
		if err := bus.PublishEvent(nc, e.cfg.NATS, bus.SaleEvent{Type: bus.EventWarm, SaleID: open.ID}); err != nil {
			t.Fatal(err)
		}
		n, err := e.rc.Do(ctx(t), e.rc.B().Exists().Key(k.Meta).Build()).AsInt64()
		return err == nil && n == 1
	})
	checkWarm()
	// The closed sale, warmed on request, is warmed closed.
	eventually(t, 5*time.Second, "closed sale warmed closed", func() bool {
		_ = bus.PublishEvent(nc, e.cfg.NATS, bus.SaleEvent{Type: bus.EventWarm, SaleID: closed.ID})
		got, err := lua.LoadSale(ctx(t), e.rc, closed.ID)
		return err == nil && got.Closed
	})
}

func TestShutdownIdempotentAndRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.RedisAddrs())
	b, err := dialAndStart(t, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for range 2 {
		if err := b.Shutdown(ctx(t)); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("shutdown took %v", d)
	}
	if _, err := http.Get("http://" + b.AdminAddr() + "/healthz"); err == nil {
		t.Error("admin server still answers after shutdown")
	}

	// Run (now internal/wire.RunBackend) is tested in internal/wire.

	// Start fails cleanly when a dependency is missing.
	bad := e.cfg
	bad.MySQL.DSN = "root@tcp(127.0.0.1:1)/nothing?timeout=1s"
	if _, err := dialAndStart(t, bad); err == nil {
		t.Error("start without MySQL succeeded")
	}
}

// The server neither gives up on a message nor backs off on its own: the
// backend alone decides (backend.max_deliver, nakDelay), whatever the
// configuration, so no message ever runs out of deliveries and stays in the
// work-queue stream, and no server back-off stacks on a nak's delay.
func TestConsumerConfig(t *testing.T) {
	for _, md := range []int{-1, 0, 1, 3, 10} {
		var o config.BackendOptions
		o.Backend.MaxDeliver, o.Backend.AckWait = md, 7*time.Second
		c := consumerConfig(o)
		if c.MaxDeliver != -1 || len(c.BackOff) != 0 || c.AckWait != 7*time.Second {
			t.Errorf("max_deliver %d: MaxDeliver %d, BackOff %v, AckWait %v", md, c.MaxDeliver, c.BackOff, c.AckWait)
		}
	}
}

func nextEvent(t *testing.T, ch <-chan bus.SaleEvent) bus.SaleEvent {
	t.Helper()
	select {
	case ev := <-ch:
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("no sale event")
		return bus.SaleEvent{}
	}
}

func cleanRedisID(t testing.TB, rc rueidis.Client, id string) {
	cleanRedis(t, rc, &flashgate.Sale{ID: id, Regions: map[string]int64{"bj": 1, "sh": 1}})
}

// Two backends share the consumer while Redis admits more than MySQL allows:
// their batches of the one sale interleave, and MySQL still sells exactly the
// total, to each buyer within the limit, every accepted order ending as a row.
func TestTwoBackendsUnderLoad(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), func(c *config.Config) { c.Backend.BatchSize = 7 })
	other, err := dialAndStart(t, s.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Shutdown(context.Background()) })

	sale := spec(50, 2, nil)
	if err := insertSale(ctx(t), s.db, sale, sale.StartsAt); err != nil {
		t.Fatal(err)
	}
	k := s.warmWith(sale, map[string]int64{"": 60})
	var mu sync.Mutex
	var accepted []uint64
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			for i := range 20 {
				now := time.Now()
				user := "u" + strconv.Itoa((w*20+i)%45)
				a := lua.AdmitArgs{User: user, Quantity: 1, OrderID: nextID.Add(1), Now: now, PayBy: now.Add(time.Minute)}
				got, err := s.scripts.Admit(ctx(t), s.rc, k, a)
				if err != nil {
					t.Error(err)
					return
				}
				if got.Outcome != lua.Admitted {
					continue
				}
				s.publish(flashgate.Order{ID: got.OrderID, SaleID: sale.ID, UserID: user, Quantity: 1, CreatedAt: ms(now.UnixMilli()), ExpiresAt: ms(a.PayBy.UnixMilli())})
				mu.Lock()
				accepted = append(accepted, got.OrderID)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	// At least the 60 units Redis was given; more if MySQL refused some early
	// and their units came back to Redis while the admissions went on.
	n := int64(len(accepted))
	if n < 60 {
		t.Fatalf("Redis admitted %d, want at least 60", n)
	}
	eventually(t, 20*time.Second, "every accepted order has a row", func() bool {
		return s.queryInt(`SELECT COUNT(*) FROM orders WHERE sale_id = ?`, sale.ID) == n
	})
	eventually(t, 5*time.Second, "consumer drained", s.consumerIdle)
	r := check(t, s.env, sale.ID, accepted)
	// MySQL sold exactly its 50 and refused the rest; Redis ends with the 10
	// units it was given beyond MySQL's total (every refused unit went back).
	if r.Oversold != 0 || r.OverLimitUsers != 0 || r.Lost != 0 || r.Duplicated != 0 || r.Sold != 50 ||
		r.ByStatus["failed"] != n-50 || r.RedisReserved != 0 || r.LedgerDiff != 10 {
		t.Errorf("audit after %d admissions: %v", n, r)
	}
}

// TestRefusedUnitsAreAnnouncedRestocked: Redis over-admitted (it thought 3
// units were left; MySQL has 1); the orders MySQL refuses give their units back
// to Redis, and the backend tells the gateways so they clear sold-out marks.
func TestRefusedUnitsAreAnnouncedRestocked(t *testing.T) {
	s := start(t, testenv.RedisAddrs(), nil)
	sale := spec(1, 1, nil)
	if err := insertSale(ctx(t), s.db, sale, sale.StartsAt); err != nil {
		t.Fatal(err)
	}
	k := s.warmWith(sale, map[string]int64{"": 3})
	events := make(chan bus.SaleEvent, 16)
	sub, err := bus.SubscribeEvents(s.nc, s.cfg.NATS, func(ev bus.SaleEvent) {
		if ev.SaleID == sale.ID && ev.Type == bus.EventRestocked {
			events <- ev
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	_ = s.nc.Flush()
	for i := range 3 {
		s.publish(admit(t, s.rc, k, "r"+strconv.Itoa(i), 1, ""))
	}
	eventually(t, 10*time.Second, "1 confirmed, 2 failed", func() bool {
		return s.rows(sale.ID, "confirmed") == 1 && s.rows(sale.ID, "failed") == 2
	})
	for range 2 {
		if ev := nextEvent(t, events); ev.Region != "" {
			t.Fatalf("restocked event for region %q", ev.Region)
		}
	}
}

// Without mysql.auto_migrate a backend refuses a schema older than it needs,
// naming the command that fixes it, before it dials anything else; with it,
// the same database is brought up to date.
func TestStartRefusesOldSchema(t *testing.T) {
	t.Parallel()
	cfg := testenv.Config(t)
	cfg.MySQL.AutoMigrate = false
	_, err := dialAndStart(t, cfg)
	if err == nil || !strings.Contains(err.Error(), "schema at version 0, this binary needs 12: run `flashgate migrate up`") {
		t.Fatalf("Start on an empty schema without auto_migrate: %v", err)
	}
	cfg.MySQL.AutoMigrate = true
	b, err := dialAndStart(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Shutdown(ctx(t)); err != nil {
		t.Error(err)
	}
}
