package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/metrics"
	"github.com/flashgate/flashgate/metrics/metricstest"
	"github.com/flashgate/flashgate/orderid"
)

// These tests inject faults into the gateway's dependencies (issue 3, item 4):
// they kill (or stall) a Redis or a NATS of the test's own while buyers keep
// coming, and check docs/design.md §2.5 "fail closed" from the outside: every
// request returns, the answer is 503 unavailable with Retry-After, an open
// breaker answers at once without touching its dependency, no 503 leaves a
// reservation behind, and service comes back by itself.

// answer is one purchase as a buyer saw it.
type answer struct {
	user       string
	start, end time.Time
	status     int
	code       string
	orderID    string
	retryAfter string
	err        error // transport error (a hang past the client timeout is one)
}

func (a answer) took() time.Duration { return a.end.Sub(a.start) }

// buyers buy a sale continuously, each request as a fresh user, until stopped.
type buyers struct {
	mu   sync.Mutex
	got  []answer
	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

// buyers starts n goroutines buying s, one unit per request, each request as a
// new user, until stop (or a hard bound of 20 s and 20,000 requests each, so a
// broken test cannot spin forever).
func (e *env) buyers(s *flashgate.Sale, n int, prefix string) *buyers {
	e.t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: n, MaxConnsPerHost: n}
	client := &http.Client{Transport: tr,
		// Far above anything the gateway may legitimately take: a request that
		// reaches this timeout hung.
		Timeout: e.cfg.Gateway.AdmitTimeout + e.cfg.Gateway.PublishTimeout + 10*time.Second}
	b := &buyers{stop: make(chan struct{})}
	deadline := time.Now().Add(20 * time.Second)
	url := e.url + "/v1/sales/" + s.ID + "/orders"
	for w := range n {
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			for i := 0; i < 20000 && time.Now().Before(deadline); i++ {
				select {
				case <-b.stop:
					return
				default:
				}
				user := prefix + strconv.Itoa(w) + "-" + strconv.Itoa(i)
				tok, err := auth.MintHS256(e.cfg.Auth.JWTSecret, user, auth.MintOptions{})
				if err != nil {
					b.add(answer{user: user, err: err})
					return
				}
				b.add(buyOnce(client, url, tok, user))
			}
		}()
	}
	e.t.Cleanup(func() { b.halt(); tr.CloseIdleConnections() })
	return b
}

func buyOnce(client *http.Client, url, tok, user string) answer {
	a := answer{user: user, start: time.Now()}
	req, _ := http.NewRequest("POST", url, strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer "+tok)
	res, err := client.Do(req)
	if err != nil {
		a.end, a.err = time.Now(), err
		return a
	}
	raw, err := io.ReadAll(res.Body)
	res.Body.Close()
	a.end, a.status, a.retryAfter = time.Now(), res.StatusCode, res.Header.Get("Retry-After")
	var body struct {
		Code    string `json:"code"`
		OrderID string `json:"order_id"`
	}
	if err == nil {
		err = json.Unmarshal(raw, &body)
	}
	if err != nil {
		a.err = fmt.Errorf("status %d body %q: %w", res.StatusCode, raw, err)
	}
	a.code, a.orderID = body.Code, body.OrderID
	return a
}

func (b *buyers) add(a answer) {
	b.mu.Lock()
	b.got = append(b.got, a)
	b.mu.Unlock()
}

// halt stops the buyers and waits until every request in flight has returned.
func (b *buyers) halt() {
	b.once.Do(func() { close(b.stop) })
	b.wg.Wait()
}

func (b *buyers) answers() []answer {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]answer(nil), b.got...)
}

// await waits (for liveness, not speed) until some answer satisfies ok and
// returns the first one.
func (b *buyers) await(t *testing.T, what string, within time.Duration, ok func(answer) bool) answer {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		for _, a := range b.answers() {
			if ok(a) {
				return a
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v: %s", what, within, summary(b.answers()))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// summary counts answers by status and code.
func summary(as []answer) string {
	n := map[string]int{}
	for _, a := range as {
		k := strconv.Itoa(a.status) + " " + a.code
		if a.err != nil {
			k = "transport error"
		}
		n[k]++
	}
	return fmt.Sprint(len(as), " answers ", n)
}

// checkAnswers holds every answer to the fault contract: it returned (no
// transport error, so no hang past the client timeout) within bound, and it is
// a 202 or a 503 unavailable with Retry-After. Anything else (a 409 sold_out,
// a 500) would be the gateway guessing about a dependency it could not ask.
func checkAnswers(t *testing.T, as []answer, bound time.Duration) {
	t.Helper()
	for _, a := range as {
		switch {
		case a.err != nil:
			t.Errorf("%s: %v (after %v)", a.user, a.err, a.took())
		case a.took() > bound:
			t.Errorf("%s: %d %s took %v, over the no-hang bound %v", a.user, a.status, a.code, a.took(), bound)
		case a.status == 202 && a.code == "accepted" && a.orderID != "":
		case a.status == 503 && a.code == string(flashgate.CodeUnavailable) && a.retryAfter != "":
		default:
			t.Errorf("%s: %d %q Retry-After %q: want 202, or 503 unavailable with Retry-After", a.user, a.status, a.code, a.retryAfter)
		}
	}
}

// scrape reads the gateway's own /metrics over HTTP, as Prometheus would.
func (e *env) scrape() metricstest.Families {
	e.t.Helper()
	return metricstest.URL(e.t, "http://"+e.g.AdminAddr()+"/metrics")
}

func breakerState(fs metricstest.Families, name string) (float64, bool) {
	return fs.Value("flashgate_gateway_breaker_state", "breaker", name)
}

// admissionsTried is how many admissions went past the Redis breaker to Redis
// (the gateway times each one; a request the breaker refused is not timed).
func admissionsTried(fs metricstest.Families) uint64 {
	n, _, _ := fs.Histogram("flashgate_gateway_admit_duration_seconds")
	return n
}

// awaitBreaker polls /metrics until breaker name reports state, and returns
// when it first saw it and the scrape that showed it.
func (e *env) awaitBreaker(name string, state float64, within time.Duration) (time.Time, metricstest.Families) {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		fs := e.scrape()
		if v, ok := breakerState(fs, name); ok && v == state {
			return time.Now(), fs
		}
		if time.Now().After(deadline) {
			v, ok := breakerState(fs, name)
			e.t.Fatalf("breaker %q never reported state %v within %v (last %v, present %v)", name, state, within, v, ok)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// redisBreaker is the label of the breaker_state series of the standalone
// Redis at addr: breaker="redis" (or "redis <addr>"). breakers.go names every
// shard's breaker "redis " + addr, and a standalone's addr is the constant
// "redis", which makes breaker="redis redis". The test fails on that, but
// follows the series it finds so that the rest of it still runs.
func (e *env) redisBreaker(t *testing.T, addr string) string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		fs := e.scrape()
		for _, name := range []string{standalone, "redis " + addr} {
			if _, ok := breakerState(fs, name); ok {
				return name
			}
		}
		if _, ok := breakerState(fs, "redis "+standalone); ok {
			t.Errorf(`the standalone Redis breaker is exported as breaker="redis redis", want breaker="redis" or "redis %s" (gateway/breakers.go forSlot)`, addr)
			return "redis " + standalone
		}
		if time.Now().After(deadline) {
			t.Fatalf("no breaker_state series for the standalone Redis: %v", fs["flashgate_gateway_breaker_state"])
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ledger is the sale's reservations in Redis and the units gone from stock.
func (e *env) ledger(s *flashgate.Sale) (taken int64, resv map[uint64]flashgate.Order) {
	e.t.Helper()
	rem, n := e.stock(s)
	k := lua.KeysFor(s.ID, s.RegionNames())
	resv, err := lua.Reservations(context.Background(), e.rc, k)
	if err != nil {
		e.t.Fatal(err)
	}
	if len(resv) != n {
		e.t.Fatalf("reservations changed under the test: %d then %d", n, len(resv))
	}
	return s.Total - rem, resv
}

// awaitBalanced waits until Redis holds exactly one reservation, and one unit
// out of stock, for each order id in accepted: nothing reserved by a refusal,
// nothing lost of a 202. Refusals whose admission failed on our side are undone
// in the background, hence the (liveness) wait.
func (e *env) awaitBalanced(s *flashgate.Sale, accepted map[uint64]bool, within time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		taken, resv := e.ledger(s)
		extra, missing := 0, 0
		for id := range resv {
			if !accepted[id] {
				extra++
			}
		}
		for id := range accepted {
			if _, ok := resv[id]; !ok {
				missing++
			}
		}
		if taken == int64(len(accepted)) && len(resv) == len(accepted) && extra == 0 && missing == 0 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("Redis does not match the 202s: %d accepted, %d units taken, %d reservations, "+
				"%d reservations without a 202, %d 202s without a reservation", len(accepted), taken, len(resv), extra, missing)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func acceptedIDs(t *testing.T, as []answer, keep func(answer) bool) map[uint64]bool {
	t.Helper()
	ids := map[uint64]bool{}
	for _, a := range as {
		if a.status == 202 && keep(a) {
			id, err := strconv.ParseUint(a.orderID, 10, 64)
			if err != nil {
				t.Fatalf("order id %q: %v", a.orderID, err)
			}
			ids[id] = true
		}
	}
	return ids
}

func count(as []answer, f func(answer) bool) int {
	n := 0
	for _, a := range as {
		if f(a) {
			n++
		}
	}
	return n
}

// shutdown stops the gateway now and says how long it took to drain.
func (e *env) shutdown() {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := e.g.Shutdown(ctx); err != nil {
		e.t.Errorf("shutdown: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		e.t.Errorf("shutdown took %v", d)
	}
}

// auditStream reads every order message of sale in the stream: each 202 must
// be there, and a message of an order that was not accepted (a 503 whose
// publish got through after all, late) must find the order released in Redis,
// so the backend drops it (claim answers 'released'). It returns how many
// such late messages there were.
func (e *env) auditStream(url string, s *flashgate.Sale, accepted map[uint64]bool) int {
	e.t.Helper()
	nc, err := nats.Connect(url, testenv.NATSOptions()...)
	if err != nil {
		e.t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	str, err := js.Stream(ctx, e.cfg.NATS.Stream)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := str.Info(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	seen, late := map[uint64]bool{}, 0
	k := lua.KeysFor(s.ID, nil)
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := str.GetMsg(ctx, seq)
		if err != nil {
			continue // deleted
		}
		o, err := bus.DecodeOrder(m.Data)
		if err != nil || o.SaleID != s.ID {
			e.t.Fatalf("stream message %d: %v %s", seq, err, m.Data)
		}
		seen[o.ID] = true
		if accepted[o.ID] {
			continue
		}
		late++
		rec, ok, err := lua.Order(ctx, e.rc, k, o.ID)
		if err != nil || !ok || rec.Status != "released" {
			e.t.Errorf("order %d is in the stream without a 202, and Redis has it as %q (found %v, err %v), want released",
				o.ID, rec.Status, ok, err)
		}
	}
	for id := range accepted {
		if !seen[id] {
			e.t.Errorf("order %d got a 202 but is not in the stream", id)
		}
	}
	return late
}

func bigSale(s *flashgate.Sale) { s.Total, s.PerUserLimit, s.PerOrderMax = 1_000_000, 1, 1 }

const faultBuyers = 8

// probeBound is the most admissions a breaker that opened lets through over
// window: the requests in flight when it opened, plus up to MaxRequests (3)
// half-open probes each time it reopens after open.
func probeBound(window, open time.Duration) uint64 {
	return faultBuyers + 3*(uint64(math.Ceil(float64(window)/float64(open)))+1)
}

// TestRedisKilledMidLoad kills the sale's Redis while buyers keep coming, then
// starts it again (empty: it lost its data, as after a crash without AOF) and
// re-warms the sale, as a backend would.
func TestRedisKilledMidLoad(t *testing.T) {
	red := testenv.StartRedis(t)
	e := start(t, func(c *config.Config) {
		c.Redis.Addrs = []string{red.Addr}
		// Long, so that an answer which waited out an admission stands apart
		// from a breaker-refused 503, which waits for nothing.
		c.Gateway.AdmitTimeout = 2 * time.Second
		c.Gateway.BreakerFailures = 3
		c.Gateway.BreakerOpen = 300 * time.Millisecond
	})
	s := e.sale(bigSale)
	bound := e.cfg.Gateway.AdmitTimeout + 2*time.Second
	b := e.buyers(s, faultBuyers, "r")
	b.await(t, "202 before the fault", 5*time.Second, func(a answer) bool { return a.status == 202 })

	killed := time.Now()
	red.Kill()
	breaker := e.redisBreaker(t, red.Addr) // the series appears at the first state change
	opened, fs := e.awaitBreaker(breaker, metrics.BreakerOpen, 5*time.Second)
	triedAtOpen := admissionsTried(fs)
	time.Sleep(time.Second) // an outage of several open / half-open cycles
	fs = e.scrape()
	triedBeforeRestart := admissionsTried(fs)
	restarted := time.Now()
	red.Start()

	// Redis came back empty: warm the sale again, as the backend does on the
	// gateways' warm request (here without the backend).
	deadline := time.Now().Add(5 * time.Second)
	// warming is when the first warm attempt began: an attempt that errored
	// on our side (a reply lost to a reconnect) may still have run, and a
	// purchase may be admitted and answered as soon as a script has run, before
	// this goroutine reads the clock again. So only a 202 that ended before the
	// first attempt proves an admission on an empty Redis.
	warming := time.Now()
	for {
		_, err := lua.Load().Warm(context.Background(), e.rc, s, map[string]int64{"": s.Total})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("re-warm: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	rewarmed := time.Now()
	resumed := b.await(t, "202 after the restart", 10*time.Second, func(a answer) bool {
		return a.status == 202 && a.start.After(rewarmed)
	})
	// Redis lost the order-id node lease with everything else; the gateway
	// learns it at its next renewal (NodeLeaseTTL/3). Until then it makes ids
	// with a node that another gateway may lease. Shown, not asserted: see the
	// report of issue 3.
	id, _ := strconv.ParseUint(resumed.orderID, 10, 64)
	nodeKey := orderid.KeyPrefix + strconv.Itoa(orderid.NodeOf(id))
	leased, err := e.rc.Do(context.Background(), e.rc.B().Exists().Key(nodeKey).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	b.halt()
	as := b.answers()
	checkAnswers(t, as, bound)
	if leased == 0 {
		unleased := count(as, func(a answer) bool {
			n, _ := strconv.ParseUint(a.orderID, 10, 64)
			return a.status == 202 && a.start.After(restarted) && orderid.NodeOf(n) == orderid.NodeOf(id)
		})
		t.Logf("HAZARD: %d orders accepted after the restart with ids of node %d, whose lease %s the restarted Redis no longer holds",
			unleased, orderid.NodeOf(id), nodeKey)
	}

	// Fail closed: from the kill until the sale was warm again nothing was accepted.
	for _, a := range as {
		if a.status == 202 && a.start.After(killed) && a.end.Before(warming) {
			t.Errorf("accepted while Redis was down or empty: order %s, asked %v and answered %v after the restart (first warm attempt at %v)",
				a.orderID, a.start.Sub(restarted), a.end.Sub(restarted), warming.Sub(restarted))
		}
	}
	// The open breaker keeps requests off Redis: none waits out an admission
	// (one that did would take the whole AdmitTimeout; the answers of a loaded
	// machine may be slow, never that slow), and few reach for Redis at all.
	during := func(a answer) bool { return a.start.After(opened) && a.end.Before(restarted) }
	n503 := count(as, func(a answer) bool { return during(a) && a.status == 503 })
	slow := count(as, func(a answer) bool { return during(a) && a.took() >= e.cfg.Gateway.AdmitTimeout })
	tried := triedBeforeRestart - triedAtOpen
	if n503 == 0 || slow != 0 {
		t.Errorf("breaker open: %d answers of 503, %d of them waited out the admission timeout %v", n503, slow, e.cfg.Gateway.AdmitTimeout)
	}
	if max := probeBound(restarted.Sub(opened), e.cfg.Gateway.BreakerOpen); tried > max || int(tried) >= n503 {
		t.Errorf("breaker open for %v: %d admissions reached for Redis (want <= %d) for %d 503s",
			restarted.Sub(opened).Round(time.Millisecond), tried, max, n503)
	}
	// Nothing reserved by a 503: the restarted Redis holds exactly the 202s it admitted.
	e.awaitBalanced(s, acceptedIDs(t, as, func(a answer) bool { return a.start.After(restarted) }), 10*time.Second)
	e.awaitBreaker(breaker, metrics.BreakerClosed, 5*time.Second)
	e.shutdown() // now, while Redis is up: testenv kills a restarted server before the gateway's own cleanup

	t.Logf("%s", summary(as))
	t.Logf("breaker open %v after the kill; while open: %d 503s (none waited out %v), %d admissions tried Redis; "+
		"first 202 %v after the re-warm", opened.Sub(killed).Round(time.Millisecond), n503, e.cfg.Gateway.AdmitTimeout,
		tried, resumed.end.Sub(rewarmed).Round(time.Millisecond))
}

// TestRedisStalledBreakerAnswersAtOnce stalls the sale's Redis (DEBUG SLEEP):
// unlike a killed server, which refuses connections at once, a stalled one
// makes every admission wait its whole AdmitTimeout. Once the breaker opens
// the 503s come at once. The admissions Redis runs late are undone, so the
// 503s reserve nothing.
func TestRedisStalledBreakerAnswersAtOnce(t *testing.T) {
	red := testenv.StartRedis(t)
	e := start(t, func(c *config.Config) {
		c.Redis.Addrs = []string{red.Addr}
		c.Gateway.AdmitTimeout = 500 * time.Millisecond
		c.Gateway.BreakerFailures = 3
		c.Gateway.BreakerOpen = 300 * time.Millisecond
	})
	s := e.sale(bigSale)
	bound := e.cfg.Gateway.AdmitTimeout + 2*time.Second
	b := e.buyers(s, faultBuyers, "st")
	b.await(t, "202 before the fault", 5*time.Second, func(a answer) bool { return a.status == 202 })

	other := testenv.Redis(t, []string{red.Addr})
	const stall = 2 * time.Second // under the gateway's ConnWriteTimeout (3 s)
	stalled := make(chan error, 1)
	stallStart := time.Now()
	go func() {
		stalled <- other.Do(context.Background(), other.B().Arbitrary("DEBUG", "SLEEP").Args(strconv.FormatFloat(stall.Seconds(), 'f', -1, 64)).Build()).Error()
	}()
	e.awaitBreaker(e.redisBreaker(t, red.Addr), metrics.BreakerOpen, 5*time.Second)
	if err := <-stalled; err != nil {
		t.Fatalf("DEBUG SLEEP: %v", err)
	}
	stallEnd := time.Now()
	resumed := b.await(t, "202 after the stall", 10*time.Second, func(a answer) bool {
		return a.status == 202 && a.start.After(stallEnd)
	})
	b.halt()
	as := b.answers()
	checkAnswers(t, as, bound)

	in := func(a answer) bool { return a.start.After(stallStart) && a.end.Before(stallEnd) && a.status == 503 }
	slow := count(as, func(a answer) bool { return in(a) && a.took() >= e.cfg.Gateway.AdmitTimeout*9/10 })
	fast := count(as, func(a answer) bool { return in(a) && a.took() < e.cfg.Gateway.AdmitTimeout/5 })
	if slow == 0 {
		t.Errorf("no 503 waited AdmitTimeout during the stall: the stall did not reach the gateway")
	}
	if fast <= slow {
		t.Errorf("during a %v stall: %d 503s waited AdmitTimeout, only %d came at once (under %v): the breaker did not cut the wait",
			stall, slow, fast, e.cfg.Gateway.AdmitTimeout/5)
	}
	e.awaitBalanced(s, acceptedIDs(t, as, func(answer) bool { return true }), 10*time.Second)

	t.Logf("%s", summary(as))
	t.Logf("%v stall: %d 503s waited AdmitTimeout %v, %d came at once; first 202 %v after the stall",
		stall, slow, e.cfg.Gateway.AdmitTimeout, fast, resumed.end.Sub(stallEnd).Round(time.Millisecond))
}

// TestNATSKilledMidLoad kills NATS while buyers keep coming: publishes fail, their
// reservations are released and the answer is 503; the NATS breaker opens and
// then the gateway refuses before admitting, so not even a reservation to
// undo reaches Redis; started again (same data directory: the stream is still
// there), the connection comes back by itself and so does service.
func TestNATSKilledMidLoad(t *testing.T) {
	red := testenv.StartRedis(t) // the test's own, so INFO commandstats counts only this gateway
	nsrv := testenv.StartNATS(t)
	e := start(t, func(c *config.Config) {
		c.Redis.Addrs = []string{red.Addr}
		c.NATS.URL = nsrv.URL()
		c.Gateway.AdmitTimeout = 500 * time.Millisecond
		c.Gateway.PublishTimeout = time.Second
		c.Gateway.BreakerFailures = 3
		// Long enough to measure the open breaker alone (after the buyers in
		// flight have returned), short enough to recover in the test's time.
		c.Gateway.BreakerOpen = 3 * time.Second
		c.Gateway.NodeLeaseTTL = 10 * time.Minute // no lease renewal script in the count
	})
	s := e.sale(bigSale)
	bound := e.cfg.Gateway.AdmitTimeout + e.cfg.Gateway.PublishTimeout + 2*time.Second
	b := e.buyers(s, faultBuyers, "n")
	b.await(t, "202 before the fault", 5*time.Second, func(a answer) bool { return a.status == 202 })

	killed := time.Now()
	nsrv.Kill()
	opened, _ := e.awaitBreaker("nats", metrics.BreakerOpen, 10*time.Second)
	b.halt()
	as := b.answers()
	checkAnswers(t, as, bound)
	// With no reconnect buffer a publish to a dead NATS fails at once (or,
	// before the client notices, after PublishTimeout): either way a 503.
	failedPublish := count(as, func(a answer) bool {
		return a.end.After(killed) && a.status == 503 && a.took() >= e.cfg.Gateway.PublishTimeout*9/10
	})
	if n := count(as, func(a answer) bool { return a.end.After(killed) && a.status == 503 }); n == 0 {
		t.Errorf("no 503 after NATS died")
	}
	if n := count(as, func(a answer) bool { return a.status == 202 && a.start.After(killed) }); n != 0 {
		t.Logf("%d requests begun after the kill were accepted (their publish was acked before the server died)", n)
	}
	// Nothing reserved by any 503: Redis holds exactly the 202s.
	accepted := acceptedIDs(t, as, func(answer) bool { return true })
	e.awaitBalanced(s, accepted, 5*time.Second)

	// With the breaker open: 503 without waiting for a publish, and not one
	// admission tried on Redis (hence no release either). Counted from the
	// gateway's own admission histogram: Redis's script counters also count
	// the order-id lease's renewals, which go on meanwhile.
	client := &http.Client{Timeout: bound + 5*time.Second}
	url := e.url + "/v1/sales/" + s.ID + "/orders"
	before := admissionsTried(e.scrape())
	var open []answer
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				user := "o" + strconv.Itoa(w) + "-" + strconv.Itoa(i)
				tok, _ := auth.MintHS256(e.cfg.Auth.JWTSecret, user, auth.MintOptions{})
				a := buyOnce(client, url, tok, user)
				mu.Lock()
				open = append(open, a)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	fs := e.scrape()
	after := admissionsTried(fs)
	stillOpen, _ := breakerState(fs, "nats")
	checkAnswers(t, open, bound)
	if stillOpen != metrics.BreakerOpen {
		t.Fatalf("the NATS breaker left open (state %v) during the burst: the test measured nothing", stillOpen)
	}
	// A 503 that waited for a publish takes at least the publish timeout; one
	// the open breaker gave does not wait at all (a loaded machine may still
	// take a while to answer, never that long).
	if n := count(open, func(a answer) bool { return a.status != 503 || a.took() >= e.cfg.Gateway.PublishTimeout }); n != 0 {
		t.Errorf("open breaker: %d of %d answers were not a 503 that skipped the publish: %s", n, len(open), summary(open))
	}
	if after != before {
		t.Errorf("open NATS breaker: %d admissions tried on Redis for %d 503s, want 0", after-before, len(open))
	}
	e.awaitBalanced(s, accepted, 5*time.Second)

	// Back: the same server, port and store. The gateway reconnects by itself.
	restarted := time.Now()
	nsrv.Start()
	b2 := e.buyers(s, 2, "nr")
	resumed := b2.await(t, "202 after NATS came back", 10*time.Second, func(a answer) bool { return a.status == 202 })
	e.awaitBreaker("nats", metrics.BreakerClosed, 10*time.Second) // probes closed it: no restart
	b2.halt()
	as2 := b2.answers()
	checkAnswers(t, as2, bound)
	for id := range acceptedIDs(t, as2, func(answer) bool { return true }) {
		accepted[id] = true
	}
	e.awaitBalanced(s, accepted, 5*time.Second)
	late := e.auditStream(nsrv.URL(), s, accepted)

	t.Logf("load: %s", summary(as))
	t.Logf("stream: every 202 is in it; %d orders answered 503 reached it all the same "+
		"(published into the client's reconnect buffer), each with a released tombstone in Redis", late)
	t.Logf("breaker open %v after the kill, after %d 503s that waited for the publish; open breaker: %d 503s, "+
		"admissions tried %d -> %d; first 202 %v after the restart; after: %s",
		opened.Sub(killed).Round(time.Millisecond), failedPublish, len(open), before, after,
		resumed.end.Sub(restarted).Round(time.Millisecond), summary(as2))
}
