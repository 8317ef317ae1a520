package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/metrics/metricstest"
)

// gatewayProc is a gateway running as its own process.
type gatewayProc struct {
	name        string
	cmd         *exec.Cmd
	addr, admin string
	log         string
}

// spawnGateway runs `flashgate gateway` on cfg's Redis, NATS and subjects, with
// the rate limits off and an order-id lease long enough that no renewal script
// runs during the test.
func spawnGateway(t *testing.T, cfg config.Config, name string) *gatewayProc {
	t.Helper()
	p := &gatewayProc{name: name, addr: freeAddr(t), admin: freeAddr(t)}
	set := map[string]string{
		"FLASHGATE_GATEWAY_LISTEN":           p.addr,
		"FLASHGATE_GATEWAY_ADMIN_LISTEN":     p.admin,
		"FLASHGATE_GATEWAY_NODE_LEASE_TTL":   "10m",
		"FLASHGATE_RATELIMIT_PER_IP_RATE":    "0",
		"FLASHGATE_RATELIMIT_PER_USER_RATE":  "0",
		"FLASHGATE_RATELIMIT_PER_SALE_RATE":  "0",
		"FLASHGATE_RATELIMIT_MAX_INFLIGHT":   "0",
		"FLASHGATE_GATEWAY_MAX_CONNS_PER_IP": "0",
	}
	env := append(os.Environ(), config.Environ(cfg)...)
	for k, v := range set {
		env = append(env, k+"="+v) // the last of a duplicated name wins
	}
	p.cmd = exec.Command(binary, "gateway", "--config", "")
	p.cmd.Env = env
	logf, err := os.CreateTemp(t.TempDir(), "gateway-"+name+"-*.log")
	if err != nil {
		t.Fatal(err)
	}
	p.log = logf.Name()
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
		}
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("gateway %s log (tail):\n%s", name, b)
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if res, err := http.Get("http://" + p.admin + "/readyz"); err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return p
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	b, _ := os.ReadFile(p.log)
	t.Fatalf("gateway %s not ready:\n%s", name, b)
	return nil
}

// awaitSaleAt waits until the gateway at addr serves the sale.
func awaitSaleAt(t *testing.T, addr, id string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		res, err := http.Get("http://" + addr + "/v1/sales/" + id)
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("gateway %s never learnt of sale %s", addr, id)
}

// marks is the gateway's flashgate_gateway_soldout_marks (the refresh loop
// sets it every 500 ms).
func (p *gatewayProc) marks(t *testing.T) float64 {
	t.Helper()
	v, ok := metricstest.URL(t, "http://"+p.admin+"/metrics").Value("flashgate_gateway_soldout_marks")
	if !ok {
		t.Fatalf("gateway %s: no flashgate_gateway_soldout_marks series", p.name)
	}
	return v
}

// awaitMarks waits (for liveness) until every gateway holds want marks.
func awaitMarks(t *testing.T, want float64, within time.Duration, gws ...*gatewayProc) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(within)
	for {
		done := true
		for _, g := range gws {
			if g.marks(t) != want {
				done = false
			}
		}
		if done {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			for _, g := range gws {
				t.Logf("gateway %s: %v sold-out marks", g.name, g.marks(t))
			}
			t.Fatalf("the gateways did not all hold %v sold-out marks within %v", want, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type purchase struct {
	status int
	code   string
	order  string
	err    error
}

func buyAt(client *http.Client, addr, sale, token, idemKey string) purchase {
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/sales/"+sale+"/orders", strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer "+token)
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}
	res, err := client.Do(req)
	if err != nil {
		return purchase{err: err}
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	var body struct {
		Code    string `json:"code"`
		OrderID string `json:"order_id"`
	}
	err = json.Unmarshal(raw, &body)
	return purchase{status: res.StatusCode, code: body.Code, order: body.OrderID, err: err}
}

// scriptStats reads the Lua script calls a Redis has served (INFO
// commandstats): by command, calls plus rejected calls.
func scriptStats(t *testing.T, rc rueidis.Client) map[string]int64 {
	t.Helper()
	info, err := rc.Do(context.Background(), rc.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	out := map[string]int64{"evalsha": 0, "eval": 0}
	for _, line := range strings.Split(info, "\n") {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		cmd, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd || !(strings.HasPrefix(cmd, "eval") || strings.HasPrefix(cmd, "fcall")) {
			continue
		}
		for _, kv := range strings.Split(stats, ",") {
			k, v, _ := strings.Cut(kv, "=")
			if k == "calls" || k == "rejected_calls" {
				n, _ := strconv.ParseInt(v, 10, 64)
				out[cmd] += n
			}
		}
	}
	return out
}

// admissionsDuring counts the admission calls Redis at addr runs while fn
// runs, by watching MONITOR for the admit function's name. Lease renewals and
// other functions do not count.
func admissionsDuring(t *testing.T, addr string, fn func()) int {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if _, err := c.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "+OK") {
		t.Fatalf("MONITOR: %q %v", line, err)
	}
	admit := lua.AdmitFunction()
	marker := testenv.ID("monitor-end-")
	counted := make(chan int, 1)
	go func() {
		n := 0
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				counted <- -1
				return
			}
			switch {
			case strings.Contains(line, marker):
				counted <- n
				return
			case strings.Contains(line, `"`+admit+`"`):
				n++
			}
		}
	}()
	fn()
	// Everything fn caused was sent before the marker.
	m := testenv.Redis(t, []string{addr})
	if err := m.Do(context.Background(), m.B().Echo().Message(marker).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n := <-counted
	if n < 0 {
		t.Fatal("MONITOR ended before the marker")
	}
	return n
}

func total(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// soldOutStack is two gateway processes, A and B, that share only a Redis of
// the test's own and NATS, with a sale of 10 units (one per user) that a
// backend created through its admin API and that A then sold out.
type soldOutStack struct {
	t      *testing.T
	cfg    config.Config
	redis  *testenv.Server
	rc     rueidis.Client
	nc     *nats.Conn
	events *nats.Subscription
	a, b   *gatewayProc
	sale   *flashgate.Sale
	client *http.Client
	users  int
	keyed  map[string]purchase // Idempotency-Key → the 202 it got, for the first sold units
}

func newSoldOutStack(t *testing.T, keyed int) *soldOutStack {
	t.Helper()
	cfg := e2eConfig(t)
	red := testenv.StartRedis(t) // the test's own: its command stats count only this test
	cfg.Redis.Addrs = []string{red.Addr}
	st := &soldOutStack{t: t, cfg: cfg, redis: red, rc: testenv.Redis(t, cfg.Redis.Addrs), nc: testenv.NATS(t),
		client: &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 32}},
		keyed:  map[string]purchase{}}
	t.Cleanup(st.client.CloseIdleConnections)
	var err error
	if st.events, err = st.nc.SubscribeSync(cfg.NATS.EventSubject + ".>"); err != nil {
		t.Fatal(err)
	}
	st.a = spawnGateway(t, cfg, "A")
	st.b = spawnGateway(t, cfg, "B")
	admin := freeAddr(t)
	be := spawnBackend(t, cfg, admin)
	st.sale = newSale(10, 1)
	createSale(t, cfg, admin, st.sale) // the gateways learn it from the created event
	awaitSaleAt(t, st.a.addr, st.sale.ID)
	awaitSaleAt(t, st.b.addr, st.sale.ID)
	// The backend's work is done: without it, the only scripts Redis runs are
	// the gateways' admissions (its orders stay pending in JetStream).
	be.kill()

	// Sell out at A: 10 × 202 (the first `keyed` of them with an
	// Idempotency-Key), then a 409.
	for i := range st.sale.Total {
		if i < int64(keyed) {
			key := "bought-" + strconv.FormatInt(i, 10)
			st.keyed[key] = st.buyAs(st.a, "so-k"+strconv.FormatInt(i, 10), key, 202, "accepted")
		} else {
			st.buy(st.a, 202, "accepted")
		}
	}
	st.buy(st.a, 409, string(flashgate.CodeSoldOut))
	awaitEvent(t, st.events, st.sale.ID, bus.EventSoldOut)
	took := awaitMarks(t, 1, 5*time.Second, st.a, st.b)
	t.Logf("sold out at A; both gateways hold the mark %v later", took.Round(time.Millisecond))
	return st
}

// buy purchases as a fresh user and checks the answer.
func (st *soldOutStack) buy(g *gatewayProc, wantStatus int, wantCode string) purchase {
	st.t.Helper()
	st.users++
	return st.buyAs(g, "so"+strconv.Itoa(st.users), "", wantStatus, wantCode)
}

func (st *soldOutStack) buyAs(g *gatewayProc, user, key string, wantStatus int, wantCode string) purchase {
	st.t.Helper()
	tok, err := auth.MintHS256(st.cfg.Auth.JWTSecret, user, auth.MintOptions{})
	if err != nil {
		st.t.Fatal(err)
	}
	p := buyAt(st.client, g.addr, st.sale.ID, tok, key)
	if p.err != nil || p.status != wantStatus || p.code != wantCode {
		st.t.Fatalf("purchase by %s at %s: %d %q (%v), want %d %q", user, g.name, p.status, p.code, p.err, wantStatus, wantCode)
	}
	return p
}

// flood sends n purchases by fresh users, alternately to A and B, 20 at a
// time, with a fresh Idempotency-Key each if keyed; it counts the answers by
// gateway, status and code.
func (st *soldOutStack) flood(n int, prefix string, keyed bool) map[string]int {
	st.t.Helper()
	toks := tokens(st.t, st.cfg, prefix, n)
	var (
		mu   sync.Mutex
		got  = map[string]int{}
		wg   sync.WaitGroup
		work = make(chan int)
	)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				g := st.a
				if i%2 == 1 {
					g = st.b
				}
				key := ""
				if keyed {
					key = prefix + "-key-" + strconv.Itoa(i)
				}
				p := buyAt(st.client, g.addr, st.sale.ID, strings.TrimPrefix(string(toks[i]), "Bearer "), key)
				k := g.name + " " + strconv.Itoa(p.status) + " " + p.code
				if p.err != nil {
					k = g.name + " error " + p.err.Error()
				}
				mu.Lock()
				got[k]++
				mu.Unlock()
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	return got
}

// drainEvents drops the sale events received so far.
func (st *soldOutStack) drainEvents() {
	for {
		if _, err := st.events.NextMsg(10 * time.Millisecond); err != nil {
			return
		}
	}
}

// TestSoldOutFastPathTwoGateways (issue 3, item 5): once a sale sells out on
// gateway A, A and B — two processes that share only Redis and NATS — answer
// 409 from memory: 500 purchases over both reach Redis with not one script
// call. Units that come back clear the mark on both, by the restocked event
// or, when the event is lost, by the refresh that reads Redis.
func TestSoldOutFastPathTwoGateways(t *testing.T) {
	st := newSoldOutStack(t, 0)
	a, b, rc, nc, cfg, s := st.a, st.b, st.rc, st.nc, st.cfg, st.sale

	// 500 purchases over both gateways: all 409, not one script call on Redis.
	const n = 500
	before := scriptStats(t, rc)
	var got map[string]int
	admissions := admissionsDuring(t, st.redis.Addr, func() { got = st.flood(n, "late", false) })
	after := scriptStats(t, rc)
	t.Logf("%d purchases after the sell-out: %v", n, got)
	t.Logf("admission scripts on Redis (MONITOR): %d; all script calls (INFO commandstats, lease renewals included): before %v, after %v",
		admissions, before, after)
	if got["A 409 sold_out"] != n/2 || got["B 409 sold_out"] != n/2 {
		t.Errorf("want %d × 409 sold_out at each gateway, got %v", n/2, got)
	}
	if admissions != 0 {
		t.Errorf("%d admissions reached Redis after the sell-out, want 0", admissions)
	}

	// A restocked event alone clears the mark: B's next purchase reaches
	// Redis (and Redis, with no unit back, says sold out). Without the event
	// the mark would answer from memory until the refresh (which reads 0 and
	// keeps it).
	tries := 0
	for reached := false; !reached; {
		if tries++; tries > 5 {
			t.Fatalf("a restocked event did not clear B's sold-out mark: its purchases never reached Redis")
		}
		if err := bus.PublishEvent(nc, cfg.NATS, bus.SaleEvent{Type: bus.EventRestocked, SaleID: s.ID}); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // delivery; the refresh runs every 500 ms
		// This also shows the MONITOR count above could have counted: here
		// it sees the one admission.
		reached = admissionsDuring(t, st.redis.Addr, func() { st.buy(b, 409, string(flashgate.CodeSoldOut)) }) == 1
	}
	t.Logf("a restocked event (stock still 0) let B's next purchase reach Redis (try %d)", tries)
	awaitMarks(t, 1, 5*time.Second, a, b)

	// A unit comes back (as a backend's release would return it) with its
	// event: both gateways clear the mark, and the next purchase reaches Redis.
	stock, _ := lua.KeysFor(s.ID, nil).Stock("")
	if err := rc.Do(context.Background(), rc.B().Incrby().Key(stock).Increment(1).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := bus.PublishEvent(nc, cfg.NATS, bus.SaleEvent{Type: bus.EventRestocked, SaleID: s.ID}); err != nil {
		t.Fatal(err)
	}
	took := awaitMarks(t, 0, 5*time.Second, a, b)
	st.drainEvents()
	calls := total(scriptStats(t, rc))
	st.buy(b, 202, "accepted")
	if got := total(scriptStats(t, rc)); got <= calls {
		t.Errorf("the purchase after the restock did not reach Redis (script calls %d -> %d)", calls, got)
	}
	t.Logf("restocked event: both marks clear %v later (the metric moves every 500 ms); the next purchase reached Redis and got 202",
		took.Round(time.Millisecond))

	// That was the last unit again: B marks it and tells A.
	awaitEvent(t, st.events, s.ID, bus.EventSoldOut)
	awaitMarks(t, 1, 5*time.Second, a, b)
	st.buy(a, 409, string(flashgate.CodeSoldOut))

	// A lost event: a unit comes back in Redis and nobody says so. The refresh
	// loops (every 500 ms) read the stock and clear the marks.
	if err := rc.Do(context.Background(), rc.B().Set().Key(stock).Value("1").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	took = awaitMarks(t, 0, 3*time.Second, a, b)
	st.buy(a, 202, "accepted")
	t.Logf("lost event: the refresh cleared both marks %v after the stock came back", took.Round(time.Millisecond))
}

// TestSoldOutFastPathIdempotencyKeys: the same fast path for purchases that
// carry an Idempotency-Key, as the project's own page (nginx/html/sale.js)
// sends with every purchase. A replay of an order bought before the sell-out
// must still answer 202 with its order id (docs/design.md §3); a new key after the
// sell-out is a new purchase of nothing, and should not cost an admission
// script on Redis any more than one without a key.
func TestSoldOutFastPathIdempotencyKeys(t *testing.T) {
	st := newSoldOutStack(t, 2)

	// Replays of the keyed orders still answer 202 with the same id, at both gateways.
	users := map[string]string{"bought-0": "so-k0", "bought-1": "so-k1"}
	for key, first := range st.keyed {
		for _, g := range []*gatewayProc{st.a, st.b} {
			if p := st.buyAs(g, users[key], key, 202, "accepted"); p.order != first.order {
				t.Errorf("replay of %s at %s: order %s, want %s", key, g.name, p.order, first.order)
			}
		}
	}

	const n = 200
	var got map[string]int
	d := admissionsDuring(t, st.redis.Addr, func() { got = st.flood(n, "keyed", true) })
	t.Logf("%d purchases with fresh Idempotency-Keys after the sell-out: %v; admissions on Redis: %d", n, got, d)
	if got["A 409 sold_out"] != n/2 || got["B 409 sold_out"] != n/2 {
		t.Errorf("want %d × 409 sold_out at each gateway, got %v", n/2, got)
	}
	if d != 0 {
		t.Errorf("%d admission scripts reached Redis for %d keyed purchases after the sell-out, want 0: "+
			"gateway/purchase.go purchase skips the sold-out mark for any request with an Idempotency-Key", d, n)
	}
}

// awaitEvent waits for a sale event of type typ for sale on sub, skipping others.
func awaitEvent(t *testing.T, sub *nats.Subscription, sale, typ string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		m, err := sub.NextMsg(time.Until(deadline))
		if err != nil {
			t.Fatalf("no %s event for sale %s: %v", typ, sale, err)
		}
		var ev bus.SaleEvent
		if json.Unmarshal(m.Data, &ev) == nil && ev.SaleID == sale && ev.Type == typ {
			return
		}
	}
}
