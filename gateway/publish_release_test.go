package gateway

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

// TestPublishTimeoutReleasesBeforeAnswering: NATS is stopped, so the publish
// times out; just then Redis holds writes back (CLIENT PAUSE WRITE) for
// longer than one release attempt may wait. The 503 must not leave before
// the release is done: a release still pending when the buyer reads 503 may
// come after the backend has claimed the order, once NATS is back, and the
// 503 would become an order. When the 503 arrives the order is released.
func TestPublishTimeoutReleasesBeforeAnswering(t *testing.T) {
	red := testenv.StartRedis(t)
	nsrv := testenv.StartNATS(t)
	e := start(t, func(c *config.Config) {
		c.Redis.Addrs = []string{red.Addr}
		c.NATS.URL = nsrv.URL()
		c.Gateway.AdmitTimeout = 200 * time.Millisecond
		c.Gateway.PublishTimeout = time.Second
		c.Gateway.BreakerFailures = 1000
	})
	s := e.sale(bigSale)
	k := lua.KeysFor(s.ID, nil)

	nsrv.Pause()
	defer nsrv.Resume()
	other := testenv.Redis(t, []string{red.Addr})
	go func() {
		// The publish gives up at 1 s; the first release attempt meets the pause.
		time.Sleep(700 * time.Millisecond)
		_ = other.Do(context.Background(), other.B().ClientPause().Timeout(900).Write().Build()).Error()
	}()
	a := buyOnce(&http.Client{Timeout: 20 * time.Second}, e.url+"/v1/sales/"+s.ID+"/orders", e.token("u1"), "u1")
	if a.status != 503 {
		t.Fatalf("purchase with NATS stopped: %d %s (err %v), want 503", a.status, a.code, a.err)
	}
	orders, err := e.rc.Do(context.Background(), e.rc.B().Hgetall().Key(k.Orders).Build()).AsStrMap()
	if err != nil {
		t.Fatal(err)
	}
	if len(orders) != 1 {
		t.Fatalf("%d orders in Redis, want the one admitted: %v", len(orders), orders)
	}
	for id, v := range orders {
		if !strings.HasPrefix(v, "released|") {
			t.Errorf("order %s is %q when its 503 arrived (after %v): its release was still open", id, v, a.took())
		}
	}
	t.Logf("503 after %v", a.took().Round(time.Millisecond))
}
