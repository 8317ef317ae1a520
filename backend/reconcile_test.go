package backend

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/metrics"
)

// idleBackend is a Backend with its clients and no consumer, no leader: what
// reconcile needs while the orders it looks at stay in the stream.
func idleBackend(t *testing.T, e *env) *Backend {
	t.Helper()
	nc := testenv.NATS(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bus.EnsureStream(ctx(t), js, e.cfg.NATS); err != nil {
		t.Fatal(err)
	}
	b := &Backend{opts: e.cfg.BackendOptions(), log: quiet, db: e.db, rc: e.rc, nc: nc, js: js, scripts: e.scripts,
		writer: e.w, warmer: e.warmer, metrics: metrics.NewBackend(), procCtx: context.Background()}
	b.ops = newOpsMetrics(b.metrics.Registry())
	b.events = &saleEvents{nc: nc, cfg: e.cfg.NATS, log: quiet}
	b.life = &lifecycle{db: e.db, rc: e.rc, nc: nc, nats: e.cfg.NATS, scripts: e.scripts, log: quiet, events: b.events, procCtx: b.procCtx}
	b.rec = &reconciler{cfg: reconcileConfig{NATS: e.cfg.NATS, PublishTimeout: e.cfg.Gateway.PublishTimeout}, log: quiet,
		db: e.db, rc: e.rc, js: js, stream: &orderStream{js: js, nats: e.cfg.NATS}, scripts: e.scripts, ops: b.ops, writer: e.w, warmer: e.warmer, life: b.life, events: b.events}
	b.warmer.stream = b.rec.stream
	return b
}

// publishTo sends an order like a gateway: Nats-Msg-Id = order id.
func publishTo(t *testing.T, js jetstream.JetStream, e *env, m flashgate.Order) {
	t.Helper()
	if _, err := js.Publish(ctx(t), bus.OrderSubject(e.cfg.NATS, m.SaleID), bus.AppendOrder(nil, &m),
		jetstream.WithMsgID(strconv.FormatUint(m.ID, 10))); err != nil {
		t.Fatal(err)
	}
}

func reconcileNow(t *testing.T, b *Backend, sale string, opt ReconcileOptions) ReconcileReport {
	t.Helper()
	rep, err := b.ReconcileWith(ctx(t), sale, opt)
	if err != nil {
		t.Fatalf("reconcile %s: %v", sale, err)
	}
	return rep
}

func userUnits(t *testing.T, e *env, k *lua.Keys, user string) int64 {
	t.Helper()
	n, err := e.rc.Do(ctx(t), e.rc.B().Hget().Key(k.Users).Field(user).Build()).AsInt64()
	if err != nil {
		t.Fatalf("users %s: %v", user, err)
	}
	return n
}

// Redis restarts empty while orders are in flight. Reconcile warms the sale
// as total − sold − in flight (read from the stream), counting the buyers'
// units in flight and making each in-flight order a reservation again; the
// unit of an in-flight order MySQL refused goes back when the refusal is
// written back, so the ledger holds once the stream drained.
func TestReconcileAfterRedisLoss(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	e := newEnv(t, []string{srv.Addr})
	r := idleBackend(t, e)
	sale := spec(10, 2, nil)
	k := e.createSale(sale)

	done := []flashgate.Order{admit(t, e.rc, k, "u1", 2, ""), admit(t, e.rc, k, "u2", 1, "")}
	e.process(sale.ID, done) // sold 3
	inFlight := []flashgate.Order{admit(t, e.rc, k, "u3", 1, ""), admit(t, e.rc, k, "u4", 2, "")}
	// And one MySQL will refuse: u1 holds the limit already.
	now := time.Now()
	refused := flashgate.Order{ID: nextID.Add(1), SaleID: sale.ID, UserID: "u1", Quantity: 1, CreatedAt: ms(now.UnixMilli()), ExpiresAt: ms(now.Add(time.Hour).UnixMilli())}
	for _, m := range append(inFlight, refused) {
		publishTo(t, r.js, e, m)
	}

	srv.Kill()
	srv.Start() // empty: no persistence
	eventually(t, 10*time.Second, "redis back", func() bool {
		return e.rc.Do(context.Background(), e.rc.B().Ping().Build()).Error() == nil
	})

	// The first commands on connections the restart broke fail: the leader's
	// periodic reconcile retries like this.
	var rep ReconcileReport
	eventually(t, 10*time.Second, "a reconcile on the restarted Redis", func() bool {
		var err error
		rep, err = r.Reconcile(ctx(t), sale.ID)
		return err == nil
	})
	t.Logf("after the loss: %+v", rep)
	if !rep.Rewarmed || rep.Before.Warm || !rep.After.Warm {
		t.Fatalf("not rewarmed: %+v", rep)
	}
	if got := remaining(t, e.rc, k, ""); got != 10-3-4 {
		t.Fatalf("remaining after rewarm %d, want total 10 - sold 3 - in flight 4", got)
	}
	if rep.Repair.Done || rep.Repair.Skipped == "" {
		t.Fatalf("repaired with orders in flight: %+v", rep.Repair)
	}
	if u1, u4 := userUnits(t, e, k, "u1"), userUnits(t, e, k, "u4"); u1 != 3 || u4 != 2 {
		t.Fatalf("users hash: u1 %d (want 2 sold + 1 in flight), u4 %d", u1, u4)
	}
	// Admissions resume on the rebuilt stock.
	later := admit(t, e.rc, k, "u5", 1, "")
	publishTo(t, r.js, e, later)

	// A backend drains the stream.
	s, err := dialAndStart(t, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	eventually(t, 15*time.Second, "in-flight orders written", func() bool {
		return e.queryInt(`SELECT COUNT(*) FROM orders WHERE sale_id = ?`, sale.ID) == 6
	})
	eventually(t, 10*time.Second, "stream drained", func() bool {
		n, err := r.rec.stream.streamCount(ctx(t), sale.ID)
		return err == nil && n == 0
	})
	if st, why, _ := e.order(refused.ID); st != "failed" || why != "limit_reached" {
		t.Fatalf("refused order: %s/%s", st, why)
	}
	// The warm made the in-flight orders reservations again, so the unit of
	// the one MySQL refused went back when its failure was written back: the
	// ledger holds without a repair.
	before := check(t, e, sale.ID, nil)
	if before.LedgerDiff != 0 || before.RedisReserved != 0 {
		t.Fatalf("ledger after the drain: %v (want diff 0: the refused order's unit back)", before)
	}

	rep = reconcileNow(t, r, sale.ID, ReconcileOptions{})
	t.Logf("after the drain: %+v", rep)
	if rep.Repair.Done || !rep.Invariant3Holds || rep.Before.Diff != 0 {
		t.Fatalf("repair: %+v, ledger before %+v", rep.Repair, rep.Before)
	}
	accepted := append(ids(done), ids(inFlight)...)
	accepted = append(accepted, refused.ID, later.ID)
	if r := check(t, e, sale.ID, accepted); !r.OK() || r.Sold != 7 {
		t.Fatalf("audit: %v", r)
	}
	// Idempotent: nothing more to do.
	if rep := reconcileNow(t, r, sale.ID, ReconcileOptions{}); rep.changed() || !rep.Invariant3Holds {
		t.Fatalf("second reconcile: %+v", rep)
	}
}

// Stale reservations: one whose order never reached NATS is republished (same
// message id) and written; one MySQL decided but whose write-back never
// happened gets MySQL's word; a young one is left alone, and holds back the
// ledger repair until it settles.
func TestReconcileStaleReservations(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	sale := spec(10, 2, nil)
	k := s.createSale(sale)
	old := time.Now().Add(-time.Minute)
	// admitAt admits as if Redis's clock had read at: admit.lua stamps the
	// reservation with Redis's TIME (the clock its age is judged by), so an
	// old one is the reservation with its created time set back.
	admitAt := func(user string, at time.Time) flashgate.Order {
		a := lua.AdmitArgs{User: user, Quantity: 1, OrderID: idAt(at), Now: at, PayBy: at.Add(15 * time.Minute)}
		if got, err := s.scripts.Admit(ctx(t), s.rc, k, a); err != nil || got.Outcome != lua.Admitted {
			t.Fatalf("admit: %v %v", got, err)
		}
		o := flashgate.Order{ID: a.OrderID, SaleID: sale.ID, UserID: user, Quantity: 1, Status: flashgate.OrderPending,
			CreatedAt: ms(at.UnixMilli()), ExpiresAt: ms(a.PayBy.UnixMilli())}
		sid := strconv.FormatUint(o.ID, 10)
		if err := s.rc.Do(ctx(t), s.rc.B().Hset().Key(k.Resv).FieldValue().FieldValue(sid, lua.EncodeResv(&o)).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		if err := s.rc.Do(ctx(t), s.rc.B().Hset().Key(k.Orders).FieldValue().FieldValue(sid, lua.EncodeRecord(&o)).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		o.Status = ""
		return o
	}
	orphan := admitAt("orphan", old)   // its gateway died before publishing
	decided := admitAt("decided", old) // written, not written back
	if _, err := s.w.writeRetrying(ctx(t), sale.ID, []flashgate.Order{decided}); err != nil {
		t.Fatal(err)
	}
	young := admitAt("young", time.Now())

	rep := reconcileNow(t, s.b, sale.ID, ReconcileOptions{})
	t.Logf("%+v", rep)
	if rep.Stale != 2 || rep.Republished != 1 || rep.RepublishDeduplicated != 0 || rep.Settled != 1 {
		t.Fatalf("report: %+v", rep)
	}
	if st, _ := redisStatus(t, s.rc, k, decided.ID); st != "confirmed" {
		t.Fatalf("decided order in Redis: %s", st)
	}
	eventually(t, 10*time.Second, "orphan written", func() bool {
		st, _, ok := s.order(orphan.ID)
		return ok && st == "confirmed"
	})
	eventually(t, 5*time.Second, "orphan settled", func() bool { return reservations(t, s.rc, k) == 1 })

	// A ledger gone wrong is repaired while a young reservation is open: the
	// rebuild keeps it (it is in flight), and sets the stock from MySQL.
	key, _ := k.Stock("")
	if err := s.rc.Do(ctx(t), s.rc.B().Set().Key(key).Value("100").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	// The leader's periodic run waits for a quiet sale; an operator's does not.
	waiting := reconcileNow(t, s.b, sale.ID, ReconcileOptions{quiet: func(string) bool { return false }})
	if waiting.Repair.Done || !strings.HasPrefix(waiting.Repair.Skipped, "waiting for the sale to be quiet") {
		t.Fatalf("not quiet: %+v", waiting.Repair)
	}
	rep = reconcileNow(t, s.b, sale.ID, ReconcileOptions{})
	if !rep.Repair.Done || rep.Republished != 0 || rep.Stale != 0 || rep.After.Reservations != 1 || !rep.Invariant3Holds {
		t.Fatalf("with a young reservation: %+v", rep)
	}
	if got := remaining(t, s.rc, k, ""); got != 10-2-1 {
		t.Fatalf("remaining after the repair %d, want 7", got)
	}

	// The young order's gateway gives up on it: its unit goes back.
	if r, err := s.scripts.Release(ctx(t), s.rc, k, young.ID, "", "", lua.ReleaseGateway, "publish_failed"); err != nil || !r.Released {
		t.Fatalf("release: %+v %v", r, err)
	}
	if status, _ := s.call("POST", "/admin/v1/sales/"+sale.ID+"/reconcile?older_than=soon", s.cfg.Admin.Token, ""); status != 400 {
		t.Fatalf("reconcile with a bad older_than: %d", status)
	}
	status, body := s.call("POST", "/admin/v1/sales/"+sale.ID+"/reconcile?older_than=2s", s.cfg.Admin.Token, "")
	if status != 200 || body["invariant3_holds"] != true || body["stale_after"] != "2s" {
		t.Fatalf("reconcile endpoint: %d %v", status, body)
	}
	if got := remaining(t, s.rc, k, ""); got != 8 {
		t.Fatalf("remaining after the release %d, want 8", got)
	}
	if r := check(t, s.env, sale.ID, []uint64{orphan.ID, decided.ID}); !r.OK() || r.Sold != 2 {
		t.Fatalf("audit: %v", r)
	}
	if status, _ := s.call("POST", "/admin/v1/sales/nosuchsale/reconcile", s.cfg.Admin.Token, ""); status != 404 {
		t.Fatalf("reconcile of an unknown sale: %d", status)
	}
}

// Redis lost one region's stock key but kept the rest: the key is restored
// as region total − sold − reserved there − in flight there; the other region
// is left alone.
func TestReconcileRestoresLostStockKey(t *testing.T) {
	t.Parallel()
	for _, target := range []struct {
		name  string
		addrs []string
	}{{"standalone", testenv.RedisAddrs()}, {"cluster", testenv.ClusterAddrs()}} {
		t.Run(target.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, target.addrs)
			r := idleBackend(t, e)
			sale := spec(10, 3, map[string]int64{"bj": 6, "sh": 4})
			k := e.createSale(sale)
			e.process(sale.ID, []flashgate.Order{admit(t, e.rc, k, "u1", 1, "bj")}) // bj sold 1
			admit(t, e.rc, k, "u2", 2, "bj")                                        // bj reserved 2
			admit(t, e.rc, k, "u3", 1, "sh")                                        // sh reserved 1
			// In flight in bj, unknown to Redis (it lost the reservation too).
			now := time.Now()
			publishTo(t, r.js, e, flashgate.Order{ID: nextID.Add(1), SaleID: sale.ID, UserID: "u4", Quantity: 1, Region: "bj",
				CreatedAt: ms(now.UnixMilli()), ExpiresAt: ms(now.Add(time.Hour).UnixMilli())})
			bj, _ := k.Stock("bj")
			if err := e.rc.Do(ctx(t), e.rc.B().Del().Key(bj).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			rep := reconcileNow(t, r, sale.ID, ReconcileOptions{})
			if !rep.Rewarmed {
				t.Fatalf("report: %+v", rep)
			}
			if got := remaining(t, e.rc, k, "sh"); got != 4-1 {
				t.Fatalf("sh remaining %d, want 3", got)
			}
			if got := remaining(t, e.rc, k, "bj"); got != 2 {
				t.Fatalf("bj remaining %d", got)
			}
		})
	}
}

// An order canceled in MySQL whose Redis half never ran (the backend died
// after the commit) gets its units back from reconcile, once.
func TestReconcileRestocksCanceled(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.RedisAddrs())
	r := idleBackend(t, e)
	sale := spec(10, 2, nil)
	k := e.createSale(sale)
	msgs := []flashgate.Order{admit(t, e.rc, k, "u1", 2, ""), admit(t, e.rc, k, "u2", 1, "")}
	e.process(sale.ID, msgs)
	// MySQL's half of a cancel of u1's order (mysql.ReturnUnits: the units
	// back, u1's quota kept in user_purchases), and nothing in Redis.
	tx, err := e.db.BeginTx(ctx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`UPDATE sales SET sold = sold - 2 WHERE id = ?`,
	} {
		if _, err := tx.ExecContext(ctx(t), q, sale.ID); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tx.ExecContext(ctx(t), `UPDATE orders SET status = 'canceled', reason = 'canceled', updated_at = ? WHERE id = ?`,
		time.Now().UTC(), msgs[0].ID); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if r := check(t, e, sale.ID, nil); r.LedgerDiff != -2 {
		t.Fatalf("ledger before: %v", r)
	}
	rep := reconcileNow(t, r, sale.ID, ReconcileOptions{})
	if rep.Restocked != 1 || !rep.Invariant3Holds || rep.Repair.Done {
		t.Fatalf("report: %+v", rep)
	}
	if st, why := redisStatus(t, e.rc, k, msgs[0].ID); st != "canceled" || why != "canceled" {
		t.Fatalf("redis: %s/%s", st, why)
	}
	if got := remaining(t, e.rc, k, ""); got != 9 {
		t.Fatalf("remaining %d", got)
	}
	if rep := reconcileNow(t, r, sale.ID, ReconcileOptions{}); rep.Restocked != 0 || rep.changed() {
		t.Fatalf("second reconcile: %+v", rep)
	}
	if r := check(t, e, sale.ID, ids(msgs)); !r.OK() {
		t.Fatalf("audit: %v", r)
	}
}
