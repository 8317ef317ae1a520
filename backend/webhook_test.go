package backend

import (
	"crypto/hmac"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
)

func TestSign(t *testing.T) {
	at := time.Unix(1700000000, 0)
	// printf '1700000000.{"a":1}' | openssl dgst -sha256 -hmac secret
	want := "t=1700000000,v1=49f24e537407743fa4a0242bb63b94b9a47ee99cbbe071ccd8a22550ae411686"
	got := Sign([]byte("secret"), at, []byte(`{"a":1}`))
	if got != want {
		t.Fatalf("Sign = %q, want %q", got, want)
	}
	if Sign([]byte("secret"), at, []byte(`{"a":2}`)) == got || Sign([]byte("other"), at, []byte(`{"a":1}`)) == got {
		t.Fatal("the signature does not depend on the body and the secret")
	}
}

// shop is a webhook endpoint: it checks each delivery's signature, refuses
// the first tries of some events and every try of others, and keeps what it
// took in the order it took it.
type shop struct {
	t      *testing.T
	secret []byte
	mu     sync.Mutex
	tries  map[string]int
	flaky  func(flashgate.OrderEvent) int // tries to refuse (< 0: all)
	took   []flashgate.OrderEvent
	forged int
}

func (s *shop) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	sig := r.Header.Get(SignatureHeader)
	ts, v1, _ := strings.Cut(strings.TrimPrefix(sig, "t="), ",v1=")
	sec, err := strconv.ParseInt(ts, 10, 64)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil || !hmac.Equal([]byte(Sign(s.secret, time.Unix(sec, 0), body)), []byte("t="+ts+",v1="+v1)) {
		s.forged++
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	var ev flashgate.OrderEvent
	if err := json.Unmarshal(body, &ev); err != nil {
		s.t.Errorf("webhook body %q: %v", body, err)
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	s.tries[ev.ID]++
	if n := s.flaky(ev); n < 0 || s.tries[ev.ID] <= n {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	s.took = append(s.took, ev)
}

// The webhook delivers every event, signed, in order per order; an event
// refused twice is delivered on its third try (the ones after it wait), one
// refused every time goes to the dead-letter stream after max_attempts and
// the next ones are still delivered.
func TestWebhook(t *testing.T) {
	t.Parallel()
	secret := testenv.Secret("webhook-secret-0123456789abcdef-")
	sh := &shop{t: t, secret: []byte(secret), tries: map[string]int{}}
	srv := httptest.NewServer(sh)
	t.Cleanup(srv.Close)
	var refused string // the event id refused every time
	sh.flaky = func(ev flashgate.OrderEvent) int {
		switch {
		case ev.ID == refused:
			return -1
		case ev.Seq == 1 && ev.OrderID%3 == 0:
			return 2
		}
		return 0
	}
	s := start(t, testenv.RedisAddrs(), func(c *config.Config) {
		c.Events.Webhook = config.Webhook{URL: srv.URL, Secret: secret, MaxAttempts: 3, Timeout: 2 * time.Second,
			RetryMin: 10 * time.Millisecond, RetryMax: 40 * time.Millisecond, Consumer: "webhook"}
	})
	sale := spec(6, 1, nil)
	k := s.createSale(sale)
	var orders []flashgate.Order
	for i := range 6 {
		o := admit(t, s.rc, k, "u"+strconv.Itoa(i), 1, "")
		orders = append(orders, o)
	}
	sh.mu.Lock()
	refused = strconv.FormatUint(orders[1].ID, 10) + "-2" // order 1's payment
	sh.mu.Unlock()
	for _, o := range orders {
		s.publish(o)
	}
	eventually(t, 10*time.Second, "6 confirmed rows", func() bool { return s.rows(sale.ID, "confirmed") == 6 })
	for _, o := range orders[:3] {
		if r := s.command(bus.CmdPay, o, o.UserID); r.Status != "paid" {
			t.Fatalf("pay: %+v", r)
		}
	}
	if r := s.command(bus.CmdCancel, orders[3], orders[3].UserID); r.Status != "canceled" {
		t.Fatalf("cancel: %+v", r)
	}
	// 6 confirmed, 3 paid, 1 canceled: 10 changes; 9 delivered, 1 dead letter.
	eventually(t, 20*time.Second, "9 events delivered", func() bool {
		sh.mu.Lock()
		defer sh.mu.Unlock()
		return len(sh.took) >= 9
	})
	dlq, err := s.js.Stream(ctx(t), bus.OrderEventDeadLetterStream(s.cfg.Events))
	if err != nil {
		t.Fatal(err)
	}
	var dead *jetstream.RawStreamMsg
	eventually(t, 10*time.Second, "the refused event dead-lettered", func() bool {
		dead, err = dlq.GetLastMsgForSubject(ctx(t), bus.OrderEventDeadLetterSubject(s.cfg.Events, sale.ID))
		return err == nil
	})
	if got := dead.Header.Get(jetstream.MsgIDHeader); got != "dlq-"+refused || dead.Header.Get(bus.HdrWebhookAttempts) != "3" {
		t.Errorf("dead letter %q attempts %q, want dlq-%s after 3", got, dead.Header.Get(bus.HdrWebhookAttempts), refused)
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	seen := map[string]bool{}
	last := map[uint64]uint32{}
	for _, ev := range sh.took {
		if seen[ev.ID] {
			continue // a consumer dedupes on the event id
		}
		seen[ev.ID] = true
		if ev.Seq <= last[ev.OrderID] {
			t.Errorf("order %d: event %d after %d", ev.OrderID, ev.Seq, last[ev.OrderID])
		}
		last[ev.OrderID] = ev.Seq
	}
	if len(seen) != 9 || seen[refused] || sh.forged != 0 {
		t.Errorf("the shop took %d distinct events (want 9), the refused one: %v, forged: %d", len(seen), seen[refused], sh.forged)
	}
	if sh.tries[refused] != 3 {
		t.Errorf("the refused event was tried %d times, want 3", sh.tries[refused])
	}
	t.Logf("delivered %d (distinct %d), tries %v", len(sh.took), len(seen), sh.tries)
}
