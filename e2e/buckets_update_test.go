package e2e

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/loadgen"
)

// TestBucketedSaleRestockedByPatch: a sale of 24 units over 12 buckets on the
// Cluster sells out through a gateway, whose sold-out mark then answers 409
// from memory; a PATCH raising the total to 36 clears the mark (the purchase
// reaches the token check again) and new buyers buy exactly the 12 units that
// came back, from whichever buckets hold them; MySQL and Redis agree at the
// end (36 sold, nothing stranded, the ledger holds).
func TestBucketedSaleRestockedByPatch(t *testing.T) {
	cfg := e2eConfig(t)
	cfg.Redis.Addrs = testenv.ClusterAddrs()
	be := startBackend(t, cfg)
	gw := startGateway(t, cfg)
	s := newSale(24, 1)
	s.Buckets = 12
	createSale(t, cfg, be.AdminAddr(), s)
	awaitSale(t, gw, s.ID)

	// The mark answers before the token is read: 409 with a token that is
	// not one, 401 without the mark.
	marked := func() int {
		req, _ := http.NewRequest("POST", "http://"+gw.Addr()+"/v1/sales/"+s.ID+"/orders", strings.NewReader(`{"quantity":1}`))
		req.Header.Set("Authorization", "Bearer not-a-token")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	awaitStatus := func(want int, what string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for marked() != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: a purchase with a bad token answers %d, want %d", what, marked(), want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if got := marked(); got != 401 {
		t.Fatalf("before the sale sold out: %d, want 401", got)
	}
	run := func(prefix string, n int, wantAccepted int) []uint64 {
		t.Helper()
		res, err := loadgen.Run(context.Background(), loadgen.Config{Target: "http://" + gw.Addr(), Sale: s.ID,
			Tokens: tokens(t, cfg, prefix, n), Quantity: 1, Concurrency: 32, Requests: int64(n)})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Accepted) != wantAccepted || res.ByStatus[503] != 0 || res.Errors != 0 {
			t.Fatalf("%s: accepted %d, statuses %v, errors %d; want %d accepted", prefix, len(res.Accepted), res.ByStatus, res.Errors, wantAccepted)
		}
		return res.Accepted
	}
	accepted := run("rp", 200, 24)
	awaitStatus(409, "sold out")

	req, _ := http.NewRequest("PATCH", "http://"+be.AdminAddr()+"/admin/v1/sales/"+s.ID, strings.NewReader(`{"total":36}`))
	req.Header.Set("Authorization", "Bearer "+cfg.Admin.Token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("PATCH: %d %s", res.StatusCode, raw)
	}
	awaitStatus(401, "after the restock")
	accepted = append(accepted, run("rq", 200, 12)...)
	awaitStatus(409, "sold out again")

	rep := drain(t, cfg, s.ID, accepted)
	assertInvariants(t, rep)
	if rep.Sold != 36 || rep.Total != 36 || rep.RedisRemaining != 0 || rep.OverLimitUsers != 0 || rep.DistinctBuyers != 36 {
		t.Fatalf("want 36 sold to 36 buyers, nothing stranded: %+v", rep)
	}
}
