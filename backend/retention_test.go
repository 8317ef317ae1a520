package backend

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

// The tests drive retention with their own clock.
func init() { retireEvery = 0 }

// saleKeys lists the keys Redis holds under the sale's hash tag (a SCAN of the
// standalone test Redis).
func saleKeys(t testing.TB, rc rueidis.Client, sale string) []string {
	t.Helper()
	var out []string
	cursor := uint64(0)
	for {
		e, err := rc.Do(ctx(t), rc.B().Scan().Cursor(cursor).Match("fg:{s:"+sale+"}:*").Count(1000).Build()).AsScanEntry()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e.Elements...)
		if cursor = e.Cursor; cursor == 0 {
			return out
		}
	}
}

func indexed(t testing.TB, rc rueidis.Client, sale string) (set, live bool) {
	t.Helper()
	set, err := rc.Do(ctx(t), rc.B().Sismember().Key(lua.SalesIndex).Member(sale).Build()).AsBool()
	if err != nil {
		t.Fatal(err)
	}
	_, err = rc.Do(ctx(t), rc.B().Zscore().Key(lua.LiveIndex).Member(sale).Build()).AsFloat64()
	if err != nil && !rueidis.IsRedisNil(err) {
		t.Fatal(err)
	}
	return set, err == nil
}

// end moves the sale's end into the past (in MySQL, which retention reads).
func (e *env) end(sale string, ago time.Duration) {
	e.t.Helper()
	if _, err := e.db.ExecContext(ctx(e.t), `UPDATE sales SET ends_at = ? WHERE id = ?`,
		time.Now().UTC().Add(-ago), sale); err != nil {
		e.t.Fatal(err)
	}
}

func TestRetention(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	retention := s.cfg.Sales.Retention

	// Ended and settled: one order paid, one canceled by its buyer.
	settled := spec(10, 2, map[string]int64{"bj": 6, "sh": 4})
	ks := s.lifecycleSale(settled)
	paid := s.confirmed(ks, "u1", 2, "bj")
	wantReply(t, "pay", s.command(bus.CmdPay, paid, "u1"), bus.ReplyOK, "paid", "")
	canceled := s.confirmed(ks, "u2", 1, "sh")
	wantReply(t, "cancel", s.command(bus.CmdCancel, canceled, "u2"), bus.ReplyOK, "canceled", flashgate.ReasonCanceled)
	s.end(settled.ID, time.Minute)

	// Ended, one order still unpaid (the sweeper will restock it into Redis).
	unpaid := spec(10, 2, nil)
	ku := s.lifecycleSale(unpaid)
	s.confirmed(ku, "u1", 1, "")
	s.end(unpaid.ID, time.Minute)

	// Ended, one admission not yet written (its reservation is open).
	reserved := spec(10, 2, nil)
	kr := s.createSale(reserved)
	admit(t, s.rc, kr, "u1", 1, "")
	s.end(reserved.ID, time.Minute)

	// Closed early: it ends in an hour, retention counts from the close.
	closed := spec(10, 2, nil)
	s.lifecycleSale(closed)
	if code, body := s.call("POST", "/admin/v1/sales/"+closed.ID+"/close", s.cfg.Admin.Token, ""); code != http.StatusOK {
		t.Fatalf("close: %d %v", code, body)
	}

	for _, sale := range []*flashgate.Sale{settled, unpaid, reserved, closed} {
		if len(saleKeys(t, s.rc, sale.ID)) == 0 {
			t.Fatalf("sale %s has no keys before retention", sale.ID)
		}
		if set, live := indexed(t, s.rc, sale.ID); !set || !live {
			t.Fatalf("sale %s indexed: set %v live %v", sale.ID, set, live)
		}
	}

	// Within retention nothing leaves.
	rep, err := s.b.retain.retireSales(ctx(t), time.Now().Add(retention-time.Hour))
	if err != nil || len(rep.Retired) != 0 || len(rep.Held) != 0 {
		t.Fatalf("before retention: %+v, %v", rep, err)
	}

	events := make(chan bus.SaleEvent, 16)
	sub, err := bus.SubscribeEvents(s.nc, s.cfg.NATS, func(ev bus.SaleEvent) {
		if ev.Type == bus.EventRetired {
			events <- ev
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := s.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	rep, err = s.b.retain.retireSales(ctx(t), time.Now().Add(retention+time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case ev := <-events:
			if ev.SaleID != settled.ID && ev.SaleID != closed.ID {
				t.Errorf("retired event of %s", ev.SaleID)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no retired event for each retired sale")
		}
	}
	retired := map[string]bool{}
	for _, id := range rep.Retired {
		retired[id] = true
	}
	if len(rep.Retired) != 2 || !retired[settled.ID] || !retired[closed.ID] {
		t.Fatalf("retired %v, want %s and %s", rep.Retired, settled.ID, closed.ID)
	}
	if why := rep.Held[unpaid.ID]; !strings.Contains(why, "unpaid") {
		t.Errorf("unpaid sale held for %q", why)
	}
	if why := rep.Held[reserved.ID]; !strings.Contains(why, "reservations") {
		t.Errorf("reserved sale held for %q", why)
	}

	for _, sale := range []*flashgate.Sale{settled, closed} {
		if keys := saleKeys(t, s.rc, sale.ID); len(keys) != 0 {
			t.Errorf("retired sale %s left keys %v", sale.ID, keys)
		}
		if set, live := indexed(t, s.rc, sale.ID); set || live {
			t.Errorf("retired sale %s still indexed: set %v live %v", sale.ID, set, live)
		}
		if at, err := saleRetired(ctx(t), s.db, sale.ID); err != nil || at == nil {
			t.Errorf("retired_at of %s: %v %v", sale.ID, at, err)
		}
		// Never warmed again: not by a gateway's request, nor by reconcile.
		if did, err := s.b.warmer.warm(ctx(t), sale.ID); err != nil || did {
			t.Errorf("warm of retired %s: did %v err %v", sale.ID, did, err)
		}
		if _, err := s.b.Reconcile(ctx(t), sale.ID); err != nil {
			t.Errorf("reconcile of retired %s: %v", sale.ID, err)
		}
		if keys := saleKeys(t, s.rc, sale.ID); len(keys) != 0 {
			t.Errorf("retired sale %s came back to Redis: %v", sale.ID, keys)
		}
	}
	for _, sale := range []*flashgate.Sale{unpaid, reserved} {
		if _, err := lua.LoadSale(ctx(t), s.rc, sale.ID); err != nil {
			t.Errorf("unsettled sale %s lost its meta: %v", sale.ID, err)
		}
		if set, live := indexed(t, s.rc, sale.ID); !set || !live {
			t.Errorf("unsettled sale %s unindexed: set %v live %v", sale.ID, set, live)
		}
	}

	// A buyer paying or canceling again gets MySQL's answer; nothing is
	// written back to Redis.
	wantReply(t, "pay again", s.command(bus.CmdPay, paid, "u1"), bus.ReplyOK, "paid", "")
	wantReply(t, "cancel again", s.command(bus.CmdCancel, canceled, "u2"), bus.ReplyOK, "canceled", flashgate.ReasonCanceled)
	if keys := saleKeys(t, s.rc, settled.ID); len(keys) != 0 {
		t.Errorf("a repeated pay or cancel wrote the retired sale back: %v", keys)
	}

	// MySQL keeps the history: the admin view answers from it.
	code, body := s.call("GET", "/admin/v1/sales/"+settled.ID, s.cfg.Admin.Token, "")
	if code != http.StatusOK || body["retired_at"] == nil || body["sold"] != float64(2) {
		t.Errorf("admin view of a retired sale: %d %v", code, body)
	}
	byStatus, _ := body["orders_by_status"].(map[string]any)
	if p, _ := byStatus["paid"].(map[string]any); p["orders"] != float64(1) {
		t.Errorf("orders by status of a retired sale: %v", byStatus)
	}
	if inv, _ := body["invariant3"].(map[string]any); inv["holds"] != true {
		t.Errorf("invariant 3 of a retired sale: %v", inv)
	}

	// A second pass finds nothing new; the unsettled ones stay held.
	rep, err = s.b.retain.retireSales(ctx(t), time.Now().Add(retention+time.Minute))
	if err != nil || len(rep.Retired) != 0 || len(rep.Held) != 2 {
		t.Fatalf("second pass: %+v, %v", rep, err)
	}
}

// An order message still in the stream (admitted, not yet written) holds its
// sale in Redis, even when Redis has no reservation of it (it lost its data).
func TestRetentionWaitsForTheStream(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.RedisAddrs())
	js, err := jetstream.New(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bus.EnsureStream(ctx(t), js, e.cfg.NATS); err != nil {
		t.Fatal(err)
	}
	// A backend's retention without a consumer: the message stays in the stream.
	r := &retainer{db: e.db, rc: e.rc, nats: e.cfg.NATS, retention: e.cfg.Sales.Retention, log: quiet, stream: &orderStream{js: js, nats: e.cfg.NATS}}
	sale := spec(10, 2, nil)
	e.createSale(sale)
	e.end(sale.ID, time.Minute)
	m := flashgate.Order{ID: nextID.Add(1), SaleID: sale.ID, UserID: "u1", Quantity: 1,
		CreatedAt: ms(time.Now().UnixMilli()), ExpiresAt: ms(time.Now().Add(time.Minute).UnixMilli())}
	if _, err := js.Publish(ctx(t), bus.OrderSubject(e.cfg.NATS, sale.ID), bus.AppendOrder(nil, &m)); err != nil {
		t.Fatal(err)
	}
	rep, err := r.retireSales(ctx(t), time.Now().Add(e.cfg.Sales.Retention+time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if why := rep.Held[sale.ID]; len(rep.Retired) != 0 || !strings.Contains(why, "stream") {
		t.Fatalf("retired %v, held for %q; want held for the stream", rep.Retired, why)
	}
	if len(saleKeys(t, e.rc, sale.ID)) == 0 {
		t.Fatal("the sale left Redis with an order in the stream")
	}
}
