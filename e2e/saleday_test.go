package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashgate/flashgate/audit"
	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/mysql"
)

// TestPauseThroughTheGateway: while a sale is paused, a crowd of buyers gets
// 503 paused with a Retry-After and nothing is reserved (Redis stock, buyers
// and reservations untouched, no order); after resume the same buyers get
// 202s, and the sale drains with every invariant holding.
func TestPauseThroughTheGateway(t *testing.T) {
	cfg := e2eConfig(t)
	be := startBackend(t, cfg)
	gw := startGateway(t, cfg)
	s := newSale(20, 1)
	createSale(t, cfg, be.AdminAddr(), s)
	awaitSale(t, gw, s.ID)
	adminPost(t, cfg, be.AdminAddr(), "/admin/v1/sales/"+s.ID+"/pause")

	orders := "http://" + gw.Addr() + "/v1/sales/" + s.ID + "/orders"
	buy := func(user string) (int, string, string) {
		a, hdr := callHdr(t, cfg, orders, user)
		return a.status, a.Code, hdr.Get("Retry-After")
	}
	// The gateway hears of the pause by event: until then admit.lua answers it.
	const buyers = 40
	var mu sync.Mutex
	var wg sync.WaitGroup
	got := map[string]int{}
	for i := range buyers {
		wg.Go(func() {
			st, code, retry := buy("p" + strconv.Itoa(i))
			mu.Lock()
			defer mu.Unlock()
			got[fmt.Sprintf("%d %s retry=%t", st, code, retry != "")]++
		})
	}
	wg.Wait()
	if got["503 paused retry=true"] != buyers {
		t.Fatalf("purchases of a paused sale: %v, want %d × 503 paused with Retry-After", got, buyers)
	}
	rc := testenv.Redis(t, cfg.Redis.Addrs)
	red, err := audit.RedisLedger(context.Background(), rc, s.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if red.Remaining != 20 || red.Reserved != 0 || red.Reservations != 0 {
		t.Fatalf("Redis of the paused sale: %+v, want all 20 units and nothing reserved", red)
	}
	db, err := mysql.OpenDB(cfg.MySQL.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if n := rows(t, db, s.ID); n != 0 {
		t.Fatalf("%d orders of a paused sale", n)
	}

	adminPost(t, cfg, be.AdminAddr(), "/admin/v1/sales/"+s.ID+"/resume")
	var accepted []uint64
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; i < 5; {
		a, _ := callHdr(t, cfg, orders, "p"+strconv.Itoa(i))
		switch {
		case a.status == http.StatusAccepted:
			id, _ := strconv.ParseUint(a.Order, 10, 64)
			accepted = append(accepted, id)
			i++
		case a.status == http.StatusServiceUnavailable && a.Code == "paused" && time.Now().Before(deadline):
			time.Sleep(20 * time.Millisecond) // the resumed event is on its way
		default:
			t.Fatalf("purchase after resume: %d %s", a.status, a.Code)
		}
	}
	rep := drain(t, cfg, s.ID, accepted)
	assertInvariants(t, rep)
	if rep.Sold != 5 {
		t.Fatalf("sold %d after resume, want 5", rep.Sold)
	}
}

// callHdr is call's purchase with the answer's headers.
func callHdr(t *testing.T, cfg config.Config, url, user string) (answer, http.Header) {
	t.Helper()
	tok, _ := auth.MintHS256(cfg.Auth.JWTSecret, user, auth.MintOptions{})
	req, _ := http.NewRequest("POST", url, strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer "+tok)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var a answer
	_ = json.NewDecoder(res.Body).Decode(&a)
	a.status = res.StatusCode
	return a, res.Header
}
