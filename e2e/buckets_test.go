package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/loadgen"
)

// TestBucketedSaleThroughTheGateway: a sale of 240 units split over 12
// buckets on the Cluster, 3,000 buyers of 2 units each (per_user_limit 2),
// through a gateway and a backend: exactly 240 units sold, no buyer over the
// limit, nothing stranded in any bucket, the ledger holds, GET shows the
// buckets and the sale sold out; a second pass of the same buyers (each at
// the limit or refused) sells nothing more.
func TestBucketedSaleThroughTheGateway(t *testing.T) {
	cfg := e2eConfig(t)
	cfg.Redis.Addrs = testenv.ClusterAddrs()
	be := startBackend(t, cfg)
	gw := startGateway(t, cfg)
	s := newSale(240, 2)
	s.PerOrderMax, s.Buckets = 2, 12
	createSale(t, cfg, be.AdminAddr(), s)
	awaitSale(t, gw, s.ID)

	const buyers = 3000
	toks := tokens(t, cfg, "bk", buyers)
	var accepted []uint64
	for pass := range 2 {
		res, err := loadgen.Run(context.Background(), loadgen.Config{
			Target: "http://" + gw.Addr(), Sale: s.ID, Tokens: toks, Quantity: 2,
			Concurrency: 200, Requests: buyers,
		})
		if err != nil {
			t.Fatal(err)
		}
		if res.Errors != 0 || res.ByStatus[503] != 0 {
			t.Errorf("pass %d: %d transport errors, statuses %v", pass, res.Errors, res.ByStatus)
		}
		if pass == 0 && (len(res.Accepted) != 120 || res.ByStatus[409] != buyers-120) {
			t.Fatalf("accepted %d, statuses %v: want 120 orders of 2 and the rest sold out", len(res.Accepted), res.ByStatus)
		}
		if pass == 1 && len(res.Accepted) != 0 {
			t.Fatalf("second pass accepted %d", len(res.Accepted))
		}
		accepted = append(accepted, res.Accepted...)
	}
	rep := drain(t, cfg, s.ID, accepted)
	assertInvariants(t, rep)
	if rep.Sold != 240 || rep.LiveUnits != 240 || rep.RedisRemaining != 0 || rep.OverLimitUsers != 0 || rep.DistinctBuyers != 120 {
		t.Fatalf("want 240 sold to 120 buyers, none over the limit, Redis stock 0: %+v", rep)
	}
	res, err := http.Get("http://" + gw.Addr() + "/v1/sales/" + s.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	var view struct {
		Buckets int    `json:"buckets"`
		State   string `json:"state"`
	}
	if err := json.Unmarshal(raw, &view); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
	deadline := time.Now().Add(10 * time.Second)
	for view.State != "sold_out" && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		res, err := http.Get("http://" + gw.Addr() + "/v1/sales/" + s.ID)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ = io.ReadAll(res.Body)
		res.Body.Close()
		_ = json.Unmarshal(raw, &view)
	}
	if view.Buckets != 12 || view.State != "sold_out" {
		t.Fatalf("GET: %s", raw)
	}
}
