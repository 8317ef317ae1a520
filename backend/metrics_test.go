package backend

import (
	"net/http"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/metrics"
	"github.com/flashgate/flashgate/metrics/metricstest"
)

func (s *started) scrape() metricstest.Families {
	s.t.Helper()
	return metricstest.URL(s.t, "http://"+s.b.AdminAddr()+"/metrics")
}

func metric(fs metricstest.Families, name string, pairs ...string) float64 {
	v, _ := fs.Value(name, pairs...)
	return v
}

// A batch through the running backend moves the order, batch and existing
// counters; /metrics needs no token, /debug/pprof/ does.
func TestMetrics(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	// MySQL holds 2 units, Redis was told 4: one order fails sold_out, one is
	// dropped.
	sale := spec(2, 1, nil)
	if err := insertSale(ctx(t), s.db, sale, sale.StartsAt); err != nil {
		t.Fatal(err)
	}
	k := s.warmWith(sale, map[string]int64{"": 4})
	var msgs []flashgate.Order
	for _, u := range []string{"u0", "u1", "u2"} {
		msgs = append(msgs, admit(t, s.rc, k, u, 1, ""))
	}
	// One order the gateway released after its publish "failed": dropped.
	gone := admit(t, s.rc, k, "g", 1, "")
	if r, err := s.scripts.Release(ctx(t), s.rc, k, gone.ID, "", "", lua.ReleaseGateway, flashgate.ReasonPublishFailed); err != nil || !r.Released {
		t.Fatalf("release: %+v %v", r, err)
	}
	for _, m := range append(msgs, gone) {
		s.publish(m)
	}
	eventually(t, 10*time.Second, "3 orders written", func() bool {
		return s.rows(sale.ID, "confirmed")+s.rows(sale.ID, "failed") == 3
	})
	eventually(t, 10*time.Second, "consumer drained", s.consumerIdle)
	// A republish outside JetStream's dedup (no msg id): MySQL has the order.
	if _, err := s.js.Publish(ctx(t), bus.OrderSubject(s.cfg.NATS, sale.ID), bus.AppendOrder(nil, &msgs[0])); err != nil {
		t.Fatal(err)
	}

	const orders = "flashgate_backend_orders_total"
	var fs metricstest.Families
	eventually(t, 10*time.Second, "metrics of 5 messages", func() bool {
		fs = s.scrape()
		n, _, _ := fs.Histogram("flashgate_backend_batch_orders")
		_, sum, _ := fs.Histogram("flashgate_backend_batch_orders")
		return n >= 2 && sum == 5 && metric(fs, "flashgate_backend_orders_existing_total") == 1
	})
	for _, c := range []struct {
		pairs []string
		want  float64
	}{
		{[]string{"status", "confirmed"}, 2},
		{[]string{"status", "failed", "reason", "sold_out"}, 1},
		{[]string{"status", "dropped"}, 1},
		{nil, 4},
	} {
		if got := metric(fs, orders, c.pairs...); got != c.want {
			t.Errorf("%s%v = %v, want %v", orders, c.pairs, got, c.want)
		}
	}
	n, _, _ := fs.Histogram("flashgate_backend_batch_orders")
	if d, _, _ := fs.Histogram("flashgate_backend_batch_duration_seconds"); d != n {
		t.Errorf("%d batch durations for %d batch sizes", d, n)
	}
	if got := metric(fs, "flashgate_backend_mysql_errors_total"); got != 0 {
		t.Errorf("mysql errors %v, want 0", got)
	}
	if _, ok := fs["go_goroutines"]; !ok {
		t.Error("no go_goroutines")
	}
	// Its clock against Redis's (the stack's processes share one host clock).
	if v, ok := fs.Value("flashgate_redis_clock_skew_seconds"); !ok || v > 1 || v < -1 {
		t.Errorf("flashgate_redis_clock_skew_seconds = %v (%v), want a measure within 1 s", v, ok)
	}

	get := func(path, token string) int {
		req, _ := http.NewRequestWithContext(ctx(t), "GET", "http://"+s.b.AdminAddr()+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	for _, c := range []struct {
		path, token string
		want        int
	}{
		{"/metrics", "", 200},
		{"/debug/pprof/", "", 401},
		{"/debug/pprof/heap", "wrong", 401},
		{"/debug/pprof/", s.cfg.Admin.Token, 200},
		{"/debug/pprof/goroutine?debug=1", s.cfg.Admin.Token, 200},
	} {
		if got := get(c.path, c.token); got != c.want {
			t.Errorf("GET %s with token %q: %d, want %d", c.path, c.token, got, c.want)
		}
	}
}

// While MySQL cannot write, the failures, the consumer's lag and the
// redeliveries show; once it is back the order is counted once.
func TestMetricsDuringMySQLOutage(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	sale := spec(10, 2, nil)
	k := s.createSale(sale)
	if _, err := s.db.ExecContext(ctx(t), `RENAME TABLE orders TO orders_away`); err != nil {
		t.Fatal(err)
	}
	s.publish(admit(t, s.rc, k, "u1", 1, ""))
	// The order waits in the backend (no redelivery: the outage spends no
	// delivery of it).
	eventually(t, 10*time.Second, "failures, lag and a waiting order in the metrics", func() bool {
		fs := s.scrape()
		return metric(fs, "flashgate_backend_mysql_errors_total") >= 1 &&
			metric(fs, "flashgate_backend_batches_failed_total") >= 1 &&
			metric(fs, "flashgate_backend_consumer_num_pending")+metric(fs, "flashgate_backend_consumer_num_ack_pending") >= 1 &&
			metric(fs, "flashgate_backend_orders_waiting") == 1 && metric(fs, "flashgate_backend_outage_probes_total") >= 1
	})
	if _, err := s.db.ExecContext(ctx(t), `RENAME TABLE orders_away TO orders`); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "order written after the outage", func() bool { return s.rows(sale.ID, "confirmed") == 1 })
	eventually(t, 10*time.Second, "counted once, lag back to 0", func() bool {
		fs := s.scrape()
		return metric(fs, "flashgate_backend_orders_total", "status", "confirmed") == 1 &&
			metric(fs, "flashgate_backend_consumer_num_pending") == 0 &&
			metric(fs, "flashgate_backend_consumer_num_ack_pending") == 0 &&
			metric(fs, "flashgate_backend_orders_waiting") == 0 && metric(fs, "flashgate_backend_redeliveries_total") == 0
	})
}

// Every reason the backend fails an order with has a series of its own in
// metrics, not "other".
func TestReasonsKnownToMetrics(t *testing.T) {
	m := metrics.NewBackend()
	reasons := []string{reasonUnknownRegion, flashgate.ReasonSoldOut, flashgate.ReasonLimitReached,
		flashgate.ReasonSaleClosed, flashgate.ReasonUnknownSale, flashgate.ReasonDeadLetter, flashgate.ReasonCanceled, flashgate.ReasonExpired,
		flashgate.ReasonIDTaken}
	for _, r := range reasons {
		m.Outcome(flashgate.OrderFailed, r)
	}
	fs := metricstest.Handler(t, m.Handler())
	for _, r := range reasons {
		if got := metric(fs, "flashgate_backend_orders_total", "status", "failed", "reason", r); got != 1 {
			t.Errorf("failed/%s = %v, want 1", r, got)
		}
	}
	if got := metric(fs, "flashgate_backend_orders_total", "reason", "other"); got != 0 {
		t.Errorf("%v orders counted with reason other", got)
	}
}
