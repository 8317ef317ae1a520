package backend

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/clip"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/mysql"
)

// rawCall is one request to the admin port with the headers given, answering
// the status, the headers and the body.
func (s *started) rawCall(method, path string, hdr map[string]string) (int, http.Header, string) {
	s.t.Helper()
	req, err := http.NewRequestWithContext(ctx(s.t), method, "http://"+s.b.AdminAddr()+path, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header, string(b)
}

// TestAdminPortHostOriginFraming: the admin port answers only its own Host
// names (421 for another: DNS rebinding), refuses a browser's foreign Origin
// (403), and forbids framing on every answer; the probes answer any Host.
func TestAdminPortHostOriginFraming(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	bearer := "Bearer " + s.cfg.Admin.Token
	port := s.b.AdminAddr()[strings.LastIndexByte(s.b.AdminAddr(), ':'):]
	for _, tc := range []struct {
		name string
		path string
		hdr  map[string]string
		want int
	}{
		{"own address", "/admin/v1/sales", map[string]string{"Authorization": bearer}, 200},
		{"localhost", "/admin/v1/sales", map[string]string{"Authorization": bearer, "Host": "localhost" + port}, 200},
		{"a rebound name", "/admin/v1/sales", map[string]string{"Authorization": bearer, "Host": "evil.example" + port}, 421},
		{"a rebound name, live view", "/ui/", map[string]string{"Host": "evil.example" + port}, 421},
		{"another port", "/admin/v1/sales", map[string]string{"Authorization": bearer, "Host": "127.0.0.1:1"}, 421},
		{"foreign Origin", "/admin/v1/sales", map[string]string{"Authorization": bearer, "Origin": "https://evil.example"}, 403},
		{"Origin null", "/admin/v1/sales", map[string]string{"Authorization": bearer, "Origin": "null"}, 403},
		{"own Origin", "/admin/v1/sales", map[string]string{"Authorization": bearer, "Origin": "http://" + s.b.AdminAddr()}, 200},
		{"probe by any address", "/healthz", map[string]string{"Host": "10.1.2.3" + port}, 200},
	} {
		status, h, body := s.rawCall("GET", tc.path, tc.hdr)
		if status != tc.want {
			t.Errorf("%s: %d %s, want %d", tc.name, status, body, tc.want)
		}
		if status == 421 && !strings.Contains(body, `"misdirected_request"`) {
			t.Errorf("%s: 421 body %s", tc.name, body)
		}
		if h.Get("Content-Security-Policy") != "frame-ancestors 'none'" || h.Get("X-Frame-Options") != "DENY" {
			t.Errorf("%s: framing headers CSP %q XFO %q", tc.name, h.Get("Content-Security-Policy"), h.Get("X-Frame-Options"))
		}
	}
}

// TestPprofSecondsCapped: a profile longer than the cap is refused before it
// starts.
func TestPprofSecondsCapped(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	bearer := map[string]string{"Authorization": "Bearer " + s.cfg.Admin.Token}
	for _, p := range []string{"/debug/pprof/profile?seconds=3600", "/debug/pprof/trace?seconds=61", "/debug/pprof/heap?seconds=100000", "/debug/pprof/profile?seconds=NaN"} {
		begun := time.Now()
		if status, _, body := s.rawCall("GET", p, bearer); status != 400 || time.Since(begun) > 5*time.Second {
			t.Errorf("%s: %d %q after %v, want 400 at once", p, status, body, time.Since(begun))
		}
	}
	if status, _, _ := s.rawCall("GET", "/debug/pprof/heap?seconds=1", bearer); status != 200 {
		t.Errorf("a 1 s delta heap profile: %d", status)
	}
}

// TestReconcileOlderThanFloor: older_than below a second is refused 400
// (it would release reservations whose orders are on their way).
func TestReconcileOlderThanFloor(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	id := testenv.ID("floor")
	cleanRedisID(t, s.rc, id)
	op := s.cfg.Admin.Token
	if status, body := s.call("POST", "/admin/v1/sales", op, saleBody(id, 10, 1, "")); status != 201 {
		t.Fatalf("create: %d %v", status, body)
	}
	for _, d := range []string{"1ns", "999ms", "0s", "-5s"} {
		if status, body := s.call("POST", "/admin/v1/sales/"+id+"/reconcile?older_than="+d, op, ""); status != 400 || body["code"] != "invalid_request" {
			t.Errorf("older_than=%s: %d %v, want 400", d, status, body)
		}
	}
	if n := s.b.admin.flights.reconcileRuns.Load(); n != 0 {
		t.Errorf("%d reconciles ran for refused requests", n)
	}
	if status, body := s.call("POST", "/admin/v1/sales/"+id+"/reconcile?older_than=1s", op, ""); status != 200 {
		t.Errorf("older_than=1s: %d %v", status, body)
	}
}

// TestLedgerSingleFlight: ledger requests for one sale that arrive together
// share one read of MySQL and Redis; reconciles too.
func TestLedgerSingleFlight(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	id := testenv.ID("flight")
	cleanRedisID(t, s.rc, id)
	op := s.cfg.Admin.Token
	if status, body := s.call("POST", "/admin/v1/sales", op, saleBody(id, 10, 1, "")); status != 201 {
		t.Fatalf("create: %d %v", status, body)
	}
	f := &s.b.admin.flights
	release := make(chan struct{})
	f.ledgerHook = func() { <-release }
	const n = 20
	calls0, reads0 := f.ledgerCalls.Load(), f.ledgerReads.Load()
	var wg sync.WaitGroup
	statuses := make([]int, n)
	totals := make([]any, n)
	for i := range n {
		wg.Go(func() {
			statuses[i], _ = s.call("GET", "/admin/v1/sales/"+id, op, "")
			_, body := s.call("GET", "/admin/v1/sales/"+id, op, "") // after the flight: a read of its own
			totals[i] = body["total"]
		})
	}
	eventually(t, 5*time.Second, "every ledger request in", func() bool { return f.ledgerCalls.Load()-calls0 >= n })
	time.Sleep(50 * time.Millisecond) // from the counter to the flight's wait: microseconds
	close(release)
	wg.Wait()
	for i := range n {
		if statuses[i] != 200 || totals[i] != float64(10) {
			t.Fatalf("request %d: %d, total %v", i, statuses[i], totals[i])
		}
	}
	// n concurrent first requests: one read; the n second ones came after
	// it, some together: at most n more.
	if got := f.ledgerReads.Load() - reads0; got < 2 || got > n+1 {
		t.Errorf("%d reads for %d concurrent and %d later requests, want 1 + at most %d", got, n, n, n)
	}
	t.Logf("%d ledger requests, %d reads", 2*n, f.ledgerReads.Load()-reads0)

	// The first n shared one read exactly: count them alone.
	f.ledgerHook = nil
	reads0 = f.ledgerReads.Load()
	release = make(chan struct{})
	f.ledgerHook = func() { <-release }
	calls0 = f.ledgerCalls.Load()
	for range n {
		wg.Go(func() { s.call("GET", "/admin/v1/sales/"+id, op, "") })
	}
	eventually(t, 5*time.Second, "every ledger request in", func() bool { return f.ledgerCalls.Load()-calls0 >= n })
	time.Sleep(50 * time.Millisecond)
	close(release)
	wg.Wait()
	if got := f.ledgerReads.Load() - reads0; got != 1 {
		t.Errorf("%d concurrent ledger requests made %d reads, want 1", n, got)
	}
}

// TestLiveViewOneSnapshotPerSecond: many viewers polling live.json cost one
// snapshot a second between them.
func TestLiveViewOneSnapshotPerSecond(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	op := s.cfg.Admin.Token
	snaps := s.b.admin.liveSnaps
	taken0 := snaps.taken.Load()
	const viewers, window = 25, 2500 * time.Millisecond
	begun := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	polls := 0
	for range viewers {
		wg.Go(func() {
			for time.Since(begun) < window {
				if status, body := s.call("GET", "/ui/live.json", op, ""); status != 200 {
					t.Errorf("live.json: %d %v", status, body)
					return
				}
				mu.Lock()
				polls++
				mu.Unlock()
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	took := time.Since(begun)
	taken := snaps.taken.Load() - taken0
	t.Logf("%d polls by %d viewers in %v: %d snapshots", polls, viewers, took.Round(time.Millisecond), taken)
	if max := int64(took/time.Second) + 1; taken > max || taken < 1 {
		t.Errorf("%d snapshots in %v for %d polls, want at most %d (one a second)", taken, took, polls, max)
	}
	if polls < 10*viewers {
		t.Errorf("only %d polls: the test did not poll enough to tell", polls)
	}
}

// TestDenylistAdmin: an operator revokes and lifts through the admin API,
// each change in the audit log; a viewer only reads; the entry is where the
// gateways read it (Redis) and lapses when told.
func TestDenylistAdmin(t *testing.T) {
	t.Parallel()
	viewer := testenv.Secret("viewer-")
	s := start(t, testenv.RedisAddrs(), func(c *config.Config) {
		c.Admin.Keys = []config.AdminKey{{ID: "ann", Role: config.RoleViewer, Token: viewer}}
	})
	op := s.cfg.Admin.Token
	user := testenv.ID("bot")
	entry := auth.DenyEntry(auth.DenySubject, user)
	t.Cleanup(func() { _, _ = lua.Undeny(ctx(t), s.rc, entry) })
	body := `{"kind":"sub","id":"` + user + `","for":"10m"}`
	if status, out := s.call("POST", "/admin/v1/denylist", viewer, body); status != 403 {
		t.Fatalf("viewer adds: %d %v", status, out)
	}
	for _, bad := range []string{`{"kind":"sub"}`, `{"kind":"usr","id":"x"}`, `{"kind":"sub","id":"a b"}`,
		`{"kind":"sub","id":"x","for":"-1m"}`, `{"kind":"sub","id":"x","until":"2001-01-01T00:00:00Z"}`, `{"kind":"sub","id":"x","extra":1}`} {
		if status, out := s.call("POST", "/admin/v1/denylist", op, bad); status != 400 {
			t.Errorf("%s: %d %v, want 400", bad, status, out)
		}
	}
	status, out := s.call("POST", "/admin/v1/denylist", op, body)
	if status != 200 || out["id"] != user {
		t.Fatalf("operator adds: %d %v", status, out)
	}
	all, _, err := lua.LoadDenylist(ctx(t), s.rc)
	if err != nil {
		t.Fatal(err)
	}
	if until := all[entry]; until < time.Now().Add(9*time.Minute).Unix() || until > time.Now().Add(11*time.Minute).Unix() {
		t.Fatalf("Redis has %s until %d, want in 10 minutes", entry, until)
	}
	status, out = s.call("GET", "/admin/v1/denylist", viewer, "")
	if status != 200 || !strings.Contains(mustJSON(t, out), user) {
		t.Fatalf("viewer lists: %d %v", status, out)
	}
	if status, out := s.call("DELETE", "/admin/v1/denylist/sub/"+user, op, ""); status != 200 {
		t.Fatalf("remove: %d %v", status, out)
	}
	if status, _ := s.call("DELETE", "/admin/v1/denylist/sub/"+user, op, ""); status != 404 {
		t.Errorf("remove again: %d, want 404", status)
	}
	changes, err := mysql.AdminChanges(ctx(t), s.db, "", 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var actions []string
	for _, c := range changes {
		if c.Target == entry {
			actions = append(actions, c.Action+"/"+c.KeyID)
		}
	}
	if strings.Join(actions, ",") != "undeny/default,deny/default" {
		t.Errorf("audit log of %s: %v, want undeny then deny by the operator key", entry, actions)
	}
}

func mustJSON(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestDeadLetterQuotesAtMost256Bytes: an unparseable message's error, which
// quotes the message, reaches the dead letter's header bounded (clip.Max
// bytes, escaped: its CR and LF cannot end the header or forge another).
func TestDeadLetterQuotesAtMost256Bytes(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), fewDeliveries)
	sale := spec(10, 5, nil)
	s.createSale(sale)
	body := "{\"id\":\"1\",\r\n\"sale\":\"not a sale id\",\"user\":\"u\",\"qty\":1,\r\n\"pad\":\"" + strings.Repeat("x", 10000) + "\"}"
	if _, err := s.js.Publish(ctx(t), bus.OrderSubject(s.cfg.NATS, sale.ID), []byte(body)); err != nil {
		t.Fatal(err)
	}
	var dl []*jetstream.RawStreamMsg
	eventually(t, 10*time.Second, "dead-lettered", func() bool { dl = s.deadLetters(); return len(dl) == 1 })
	e := dl[0].Header.Get(bus.HdrDeadError)
	t.Logf("%s: %d bytes: %.120s…", bus.HdrDeadError, len(e), e)
	if len(e) > 4*clip.Max+100 || strings.ContainsAny(e, "\r\n") || !strings.Contains(e, "more bytes") {
		t.Errorf("%s is %d bytes (CR/LF: %v), want the message quoted to at most %d bytes", bus.HdrDeadError, len(e), strings.ContainsAny(e, "\r\n"), clip.Max)
	}
	if string(dl[0].Data) != body {
		t.Errorf("the dead letter's body is not the message")
	}
}
