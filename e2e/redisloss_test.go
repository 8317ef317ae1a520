package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

// getOrder is GET of an order as token's holder: the status code and the
// order's status.
func getOrder(t *testing.T, addr, sale, order, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+addr+"/v1/sales/"+sale+"/orders/"+order, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	var body struct {
		Status string `json:"status"`
	}
	_ = json.Unmarshal(raw, &body)
	return res.StatusCode, body.Status
}

// TestOrderAndKeySurviveRedisLoss: Redis loses everything (FLUSHALL) after an
// order with an Idempotency-Key was confirmed. GET of the order never says
// 404 to its owner: 503 while the sale is not warm, then 200 confirmed from
// what the warm brought back from MySQL; another user still gets 404. A retry
// with the same key answers the first order, and no second order is made.
func TestOrderAndKeySurviveRedisLoss(t *testing.T) {
	red := testenv.StartRedis(t)
	cfg := e2eConfig(t)
	cfg.Redis.Addrs = []string{red.Addr}
	b := startBackend(t, cfg)
	gw := startGateway(t, cfg)
	s := newSale(10, 1)
	createSale(t, cfg, b.AdminAddr(), s)
	awaitSale(t, gw, s.ID)
	tok, _ := auth.MintHS256(cfg.Auth.JWTSecret, "owner", auth.MintOptions{})
	other, _ := auth.MintHS256(cfg.Auth.JWTSecret, "other", auth.MintOptions{})

	first := buyAt(http.DefaultClient, gw.Addr(), s.ID, tok, "key-1")
	if first.status != 202 {
		t.Fatalf("purchase: %+v", first)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if code, st := getOrder(t, gw.Addr(), s.ID, first.order, tok); code == 200 && st == "confirmed" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the order was never confirmed")
		}
		time.Sleep(50 * time.Millisecond)
	}

	rc := testenv.Redis(t, cfg.Redis.Addrs)
	if err := rc.Do(context.Background(), rc.B().Flushall().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	var seen []int
	deadline = time.Now().Add(30 * time.Second)
	for {
		code, st := getOrder(t, gw.Addr(), s.ID, first.order, tok)
		if len(seen) == 0 || seen[len(seen)-1] != code {
			seen = append(seen, code)
		}
		if code == 404 {
			t.Fatalf("GET of a confirmed order answered 404 to its owner after the loss (answers so far %v)", seen)
		}
		if code == 200 {
			if st != "confirmed" {
				t.Fatalf("after the loss: status %q, want confirmed", st)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET never answered 200 after the loss: %v", seen)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, _ := getOrder(t, gw.Addr(), s.ID, first.order, other); code != 404 {
		t.Errorf("another user's GET: %d, want 404", code)
	}
	// The records come back a moment before the sale answers again: a retry
	// may meet 503 first, as a buyer's would.
	retry := buyAt(http.DefaultClient, gw.Addr(), s.ID, tok, "key-1")
	for deadline := time.Now().Add(30 * time.Second); retry.status == 503 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		retry = buyAt(http.DefaultClient, gw.Addr(), s.ID, tok, "key-1")
	}
	if retry.status != 202 || retry.order != first.order {
		t.Errorf("retry with the same key: %+v, want 202 of order %s", retry, first.order)
	}
	// Redis loses only the order's record, the sale staying warm: GET asks a
	// backend, which answers from MySQL (and writes the record back).
	k := lua.KeysFor(s.ID, nil)
	if err := rc.Do(context.Background(), rc.B().Hdel().Key(k.Orders).Field(first.order).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if code, _ := getOrder(t, gw.Addr(), s.ID, first.order, other); code != 404 {
		t.Errorf("another user's GET of an order Redis lost: %d, want 404", code)
	}
	if code, st := getOrder(t, gw.Addr(), s.ID, first.order, tok); code != 200 || st != "confirmed" {
		t.Errorf("owner's GET of an order Redis lost, sale warm: %d %q, want 200 confirmed", code, st)
	}
	id, _ := strconv.ParseUint(first.order, 10, 64)
	if rec, ok, err := lua.Order(context.Background(), rc, k, id); err != nil || !ok || rec.Status != "confirmed" {
		t.Errorf("record not written back: %+v ok=%v err=%v", rec, ok, err)
	}
	rep := drain(t, cfg, s.ID, []uint64{id})
	assertInvariants(t, rep)
	if rep.Orders != 1 {
		t.Errorf("%d orders after the retry, want 1: %v", rep.Orders, rep)
	}
	t.Logf("GET answers after the loss: %v; %v", seen, rep)
}
