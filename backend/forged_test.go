package backend

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/orderid"
)

// A publisher that lies about an order's charges (a compromised gateway: it
// admits and publishes with charges of its own making) gets nothing: the
// backend works the charges out from the order's facts and the sale's limits
// in MySQL, refuses the order (failed, bad_charges), gives its units and its
// counted charges back to Redis, and counts it in charges_refused_total. An
// honest order beside it is confirmed.
func TestForgedChargesRefused(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	sale := limitedSpec(20)
	k := s.createSale(sale)
	t.Cleanup(func() { dropLimitKeys(t, s.rc, k, "sale", today()) })
	loc, _ := sale.Location()

	// forge admits for sub with charges cs, and publishes what a gateway
	// would, facts and all, with charges sent.
	forge := func(sub flashgate.Subjects, cs, sent []flashgate.Charge) flashgate.Order {
		t.Helper()
		now := time.Now()
		a := lua.AdmitArgs{User: sub.User, Quantity: 1, OrderID: nextID.Add(1), Now: now, PayBy: now.Add(15 * time.Minute),
			Charges: cs, Limits: sale.Limits}
		got, err := s.scripts.Admit(ctx(t), s.rc, k, a)
		if err != nil || got.Outcome != lua.Admitted {
			t.Fatalf("admit %+v: %+v, %v", sub, got, err)
		}
		m := flashgate.Order{ID: got.OrderID, SaleID: sale.ID, UserID: sub.User, Quantity: 1, CreatedAt: ms(now.UnixMilli()),
			ExpiresAt: ms(a.PayBy.UnixMilli()), Charges: flashgate.EncodeCharges(sent),
			Phone: sub.Phone, Device: sub.Device, IP: sub.IP, Address: sub.Address}
		s.publish(m)
		return m
	}
	charges := func(sub flashgate.Subjects) []flashgate.Charge {
		cs, err := sale.Charges(sub, 1, time.Now(), loc)
		if err != nil {
			t.Fatal(err)
		}
		return cs
	}

	// The address limit left out of the message: MySQL would not count the
	// address's one order.
	omit := flashgate.Subjects{User: "f1", Phone: "+8613800000001", Address: "addr1"}
	omitted := forge(omit, charges(omit), charges(omit)[:1])
	// Charged to somebody else's phone than the one the order is by.
	other := flashgate.Subjects{User: "f2", Phone: "+8613800000002", Address: "addr2"}
	cs := charges(other)
	cs[0].Subject = "+8613800000099"
	elsewhere := forge(other, cs, cs)
	honest := admitSub(t, s.rc, k, sale, flashgate.Subjects{User: "h", Phone: "+8613800000003", Address: "addr3"}, 1)
	s.publish(honest)

	eventually(t, 15*time.Second, "3 orders decided", func() bool {
		return s.rows(sale.ID, "confirmed")+s.rows(sale.ID, "failed") == 3
	})
	for _, m := range []flashgate.Order{omitted, elsewhere} {
		if st, why, _ := s.order(m.ID); st != "failed" || why != flashgate.ReasonBadCharges {
			t.Fatalf("forged order %d: %s/%s", m.ID, st, why)
		}
		eventually(t, 10*time.Second, "failed in Redis", func() bool {
			st, why := redisStatus(t, s.rc, k, m.ID)
			return st == "failed" && why == flashgate.ReasonBadCharges
		})
	}
	if st, _, _ := s.order(honest.ID); st != "confirmed" {
		t.Fatalf("honest order: %s", st)
	}
	// Units and counted charges back: only the honest order holds any.
	if got := remaining(t, s.rc, k, ""); got != 19 {
		t.Fatalf("remaining %d, want 19", got)
	}
	day := today()
	for _, c := range []struct {
		lim             int
		window, subject string
	}{{0, day, "+8613800000001"}, {1, "sale", "addr1"}, {0, day, "+8613800000099"}, {1, "sale", "addr2"}} {
		if n := redisCounter(t, s.rc, k, c.window, c.lim, c.subject); n != 0 {
			t.Errorf("Redis counter %d/%s/%s = %d after the refusal", c.lim, c.window, c.subject, n)
		}
		if n := s.used(sale.ID, c.lim, c.window, c.subject); n != 0 {
			t.Errorf("limit_usage %d/%s/%s = %d", c.lim, c.window, c.subject, n)
		}
	}
	if n := s.sold(sale.ID); n != 1 {
		t.Fatalf("MySQL sold %d", n)
	}
	if n := metric(s.scrape(), "flashgate_backend_charges_refused_total"); n != 2 {
		t.Fatalf("charges_refused_total %v, want 2", n)
	}
}

// A publisher holding the gateway's NATS credential mints nothing: every
// message it makes up ends failed (unadmitted, or unknown_region) and takes
// nothing, in MySQL or in Redis, whatever it says. Each forgery below passes
// MySQL's guards (stock, per-user limit), so only the message checks stop it.
// Beside them an honest order is confirmed, and a known order that claims to
// be payable until 9999 gets the backend's own pay-by time.
func TestForgedOrdersUnadmitted(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	sale := spec(20, 3, nil) // opened an hour ago; per_user_limit 3
	sale.PerOrderMax = 2
	k := s.createSale(sale)
	payBy := s.cfg.Orders.PaymentTimeout

	// made is an order a gateway would publish for an id of its clock at t.
	made := func(user string, qty int64, at time.Time) flashgate.Order {
		id := orderid.NewClock(rand.IntN(orderid.MaxNode+1), func() time.Time { return at }).Next()
		return flashgate.Order{ID: id, SaleID: sale.ID, UserID: user, Quantity: qty,
			CreatedAt: ms(at.UnixMilli()), ExpiresAt: ms(at.Add(payBy).UnixMilli())}
	}
	now := time.Now()
	forged := map[string]flashgate.Order{
		// Never admitted by Redis, honest in every other way: the plain mint.
		"never admitted": made("f1", 1, now),
		// Before the sale opened, as a message published ahead of the start
		// would say (its id of that time too).
		"before the window": made("f2", 1, sale.StartsAt.Add(-10*time.Minute)),
		// Created an hour after its id was made.
		"created far from its id": func() flashgate.Order {
			m := made("f3", 1, now.Add(-30*time.Minute))
			m.CreatedAt = ms(now.UnixMilli())
			return m
		}(),
		// Created in the future: published before it was admitted.
		"created after its message": made("f4", 1, now.Add(30*time.Second)),
		// A region the sale does not have.
		"unknown region": func() flashgate.Order { m := made("f5", 1, now); m.Region = "zz"; return m }(),
	}
	// Admitted by Redis for 1 unit, published for 3: over per_order_max,
	// within per_user_limit.
	over := admit(t, s.rc, k, "f6", 1, "")
	over.Quantity = sale.PerOrderMax + 1
	forged["over per_order_max"] = over
	// Admitted and honest but for its pay-by time.
	forever := admit(t, s.rc, k, "h2", 1, "")
	forever.ExpiresAt = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)
	honest := admit(t, s.rc, k, "h1", 1, "")

	for _, m := range forged {
		s.publish(m)
	}
	s.publish(forever)
	s.publish(honest)
	eventually(t, 15*time.Second, "every order decided", func() bool {
		return s.rows(sale.ID, "confirmed")+s.rows(sale.ID, "failed") == int64(len(forged))+2
	})

	for name, m := range forged {
		want := flashgate.ReasonUnadmitted
		if name == "unknown region" {
			want = reasonUnknownRegion
		}
		if st, why, _ := s.order(m.ID); st != "failed" || why != want {
			t.Errorf("%s: order %d %s/%s, want failed/%s", name, m.ID, st, why, want)
		}
		if n := heldUnits(s.env, sale.ID, m.UserID); n != 0 {
			t.Errorf("%s: user %s holds %d units in MySQL", name, m.UserID, n)
		}
	}
	for _, m := range []flashgate.Order{honest, forever} {
		if st, _, _ := s.order(m.ID); st != "confirmed" {
			t.Errorf("honest order %d: %s", m.ID, st)
		}
	}
	var expires time.Time
	if err := s.db.QueryRowContext(ctx(t), `SELECT expires_at FROM orders WHERE id = ?`, forever.ID).Scan(&expires); err != nil {
		t.Fatal(err)
	}
	if want := forever.CreatedAt.Add(payBy); !expires.Equal(want) {
		t.Errorf("expires_at %v, want created + payment_timeout = %v", expires, want)
	}
	// Only the two honest units are taken, in MySQL and in Redis; the
	// over-quantity order's reservation is given back.
	if n := s.sold(sale.ID); n != 2 {
		t.Errorf("MySQL sold %d, want 2", n)
	}
	eventually(t, 10*time.Second, "Redis settled", func() bool {
		return remaining(t, s.rc, k, "") == 18 && reservations(t, s.rc, k) == 0
	})
	if r := check(t, s.env, sale.ID, []uint64{honest.ID, forever.ID}); !r.OK() || r.Sold != 2 {
		t.Errorf("invariants: %s", r)
	}
	if n := metric(s.scrape(), "flashgate_backend_orders_total", "status", "failed", "reason", flashgate.ReasonUnadmitted); n != float64(len(forged)-1) {
		t.Errorf("orders_total{failed,unadmitted} = %v, want %d", n, len(forged)-1)
	}
}

// An order Redis admitted and then lost (its master lost its data and the
// sale was rebuilt from MySQL and the stream before its message landed) is
// still written: its id is older than the rebuild. An order Redis does not
// know whose id is newer than the rebuild was never admitted: it fails,
// unadmitted, and takes nothing.
func TestUnknownOrderAndTheRebuild(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	sale := spec(10, 2, nil)
	k := s.createSale(sale)

	before := admit(t, s.rc, k, "u1", 1, "")
	// Redis loses everything it had of the sale, the admission included.
	keys := []string{k.Meta, k.Users, k.Resv, k.Orders, k.Idem}
	_, stock := k.StockKeys()
	if err := s.rc.Do(ctx(t), s.rc.B().Del().Key(append(keys, stock...)...).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // the rebuild's time is past the id's millisecond
	if did, err := s.b.warmer.warm(ctx(t), sale.ID); err != nil || !did {
		t.Fatalf("rebuild: %v %v", did, err)
	}
	time.Sleep(5 * time.Millisecond)
	after := admit(t, s.rc, k, "u2", 1, "") // admitted: known
	forged := flashgate.Order{ID: nextID.Add(1), SaleID: sale.ID, UserID: "u3", Quantity: 1,
		CreatedAt: ms(time.Now().UnixMilli()), ExpiresAt: ms(time.Now().Add(time.Minute).UnixMilli())}
	for _, m := range []flashgate.Order{before, after, forged} {
		s.publish(m)
	}
	eventually(t, 15*time.Second, "3 orders decided", func() bool {
		return s.rows(sale.ID, "confirmed")+s.rows(sale.ID, "failed") == 3
	})
	for _, c := range []struct {
		m          flashgate.Order
		st, reason string
	}{{before, "confirmed", ""}, {after, "confirmed", ""}, {forged, "failed", flashgate.ReasonUnadmitted}} {
		if st, why, _ := s.order(c.m.ID); st != c.st || why != c.reason {
			t.Errorf("order of %s: %s/%s, want %s/%s", c.m.UserID, st, why, c.st, c.reason)
		}
	}
	if n := heldUnits(s.env, sale.ID, "u3"); n != 0 {
		t.Errorf("the unadmitted order's buyer holds %d units", n)
	}
	if n := s.sold(sale.ID); n != 2 {
		t.Errorf("MySQL sold %d, want 2", n)
	}
	// The unadmitted order's record in Redis says failed: its id is spent
	// (an admission reusing it meets the record, duplicate_id).
	eventually(t, 10*time.Second, "failed in Redis", func() bool {
		rec, ok, err := lua.Order(ctx(t), s.rc, k, forged.ID)
		return err == nil && ok && rec.Status == flashgate.OrderFailed && rec.Reason == flashgate.ReasonUnadmitted
	})
	// Redis sold the lost order's unit again (its stock was rebuilt without
	// it): reconcile repairs the books, and every invariant holds.
	rep := reconcileNow(t, s.b, sale.ID, ReconcileOptions{})
	if r := check(t, s.env, sale.ID, []uint64{before.ID, after.ID}); !r.OK() || r.Sold != 2 {
		t.Errorf("invariants after reconcile (%+v): %s", rep.After, r)
	}
}

// heldUnits is what MySQL counts user holding of sale: 0 without a row.
func heldUnits(e *env, sale, user string) int64 {
	return e.queryInt(`SELECT COALESCE(SUM(units), 0) FROM user_purchases WHERE sale_id = ? AND user_id = ?`, sale, user)
}

// Each message check alone: an order that fits everything else and breaks
// one bound is doubted by that check, and by no other (pure logic).
func TestDoubtEachCheck(t *testing.T) {
	now := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	sale := &flashgate.Sale{ID: "s", StartsAt: now.Add(-time.Hour), EndsAt: now.Add(time.Hour), PerUserLimit: 3, PerOrderMax: 2}
	shape := &saleShape{spec: sale, regions: map[string]bool{}}
	tr := trust{skew: 5 * time.Second, publish: 2 * time.Second, payBy: 15 * time.Minute}
	rebuilt := now.Add(-time.Minute)
	order := func(idAt, created time.Time) flashgate.Order {
		id := orderid.NewClock(7, func() time.Time { return idAt }).Next()
		return flashgate.Order{ID: id, SaleID: "s", UserID: "u", Quantity: 1, CreatedAt: created}
	}
	stored := func(o flashgate.Order, at time.Time, unknown bool) *inflow {
		in := &inflow{stored: map[uint64]time.Time{o.ID: at}, unknown: map[uint64]bool{}}
		in.unknown[o.ID] = unknown
		return in
	}
	for _, c := range []struct {
		name    string
		o       flashgate.Order
		stored  time.Time
		unknown bool
		check   string
	}{
		{"honest", order(now, now.Add(3*time.Millisecond)), now.Add(5 * time.Millisecond), false, ""},
		{"honest, republished an hour later", order(now, now), now.Add(time.Hour), false, ""},
		{"lost by Redis before the rebuild", order(rebuilt.Add(-time.Second), rebuilt.Add(-time.Second)), rebuilt.Add(time.Second), true, ""},
		{"region", func() flashgate.Order { o := order(now, now); o.Region = "bj"; return o }(), now, false, "region"},
		{"quantity 0", func() flashgate.Order { o := order(now, now); o.Quantity = 0; return o }(), now, false, "quantity"},
		{"over per_order_max", func() flashgate.Order { o := order(now, now); o.Quantity = 3; return o }(), now, false, "quantity"},
		{"before the start", order(sale.StartsAt.Add(-time.Minute), sale.StartsAt.Add(-time.Minute)), now, false, "window"},
		{"after the end", order(sale.EndsAt.Add(time.Minute), sale.EndsAt.Add(time.Minute)), sale.EndsAt.Add(time.Minute), false, "window"},
		{"created before its id", order(now, now.Add(-6*time.Second)), now, false, "id time"},
		{"created after its id", order(now.Add(-6*time.Second), now), now, false, "id time"},
		{"created after its message", order(now, now), now.Add(-6 * time.Second), false, "created after its message"},
		{"unknown, published late", order(rebuilt.Add(-time.Second), rebuilt.Add(-time.Second)), rebuilt.Add(7 * time.Second), true, "unknown, published late"},
		{"unknown, newer than the rebuild", order(now, now), now, true, "unknown, newer than the rebuild"},
	} {
		_, check := tr.doubt(shape, c.o, stored(c.o, c.stored, c.unknown), now, rebuilt)
		if check != c.check {
			t.Errorf("%s: doubted by %q, want %q", c.name, check, c.check)
		}
	}
	// Never rebuilt since the column came: no unknown order is written.
	o := order(now.Add(-time.Hour), now.Add(-time.Hour))
	if _, check := tr.doubt(shape, o, stored(o, now.Add(-time.Hour), true), now, time.Time{}); check == "" {
		t.Error("an unknown order of a sale without a rebuild time passed")
	}
}

// TestClaimsDecidedInTheirEpoch: a batch's claims hold in the epoch they were
// read in. A rebuild that commits between the claims and the decision (it
// may have installed what they did not see: an order 'unknown' then is in
// flight now, one 'released' then may be pending again after a failover)
// makes the decision refuse with errClaimStale, deciding nothing, which the
// consumer treats as an outage (the batch is claimed again); claimed again,
// in the new epoch, the order is decided. The model's BUG_NO_CLAIM_EPOCH.
func TestClaimsDecidedInTheirEpoch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.RedisAddrs())
	sale := spec(10, 2, nil)
	k := e.createSale(sale)
	o := admit(t, e.rc, k, "u1", 1, "")
	st, epoch, err := e.scripts.ClaimEpoch(ctx(t), e.rc, k, []uint64{o.ID})
	if err != nil || st[0] != lua.ClaimOK || epoch == "" {
		t.Fatalf("claim: %v %q %v", st, epoch, err)
	}
	if _, err := e.warmer.rebuild(ctx(t), sale.ID, nil); err != nil {
		t.Fatal(err)
	}
	_, err = e.w.writeIn(ctx(t), sale.ID, []flashgate.Order{o}, &inflow{epoch: epoch})
	if !errors.Is(err, errClaimStale) || !unavailable(err) {
		t.Fatalf("a decision on claims of epoch %s after a rebuild: %v, want errClaimStale (an outage)", epoch, err)
	}
	if n := e.rows(sale.ID, "confirmed") + e.rows(sale.ID, "failed"); n != 0 {
		t.Fatalf("%d orders decided on stale claims", n)
	}
	st, now, err := e.scripts.ClaimEpoch(ctx(t), e.rc, k, []uint64{o.ID})
	if err != nil || st[0] != lua.ClaimOK || now == epoch {
		t.Fatalf("claim again: %v %q (was %q) %v", st, now, epoch, err)
	}
	res, err := e.w.writeIn(ctx(t), sale.ID, []flashgate.Order{o}, &inflow{epoch: now})
	if err != nil || res[o.ID].status != flashgate.OrderConfirmed {
		t.Fatalf("the decision in the claims' epoch: %+v %v", res, err)
	}
	// Tags that answered different epochs (one master failed over to a
	// replica from before the rebuild) decide nothing either.
	if _, err := e.w.writeIn(ctx(t), sale.ID, []flashgate.Order{admit(t, e.rc, k, "u2", 1, "")}, &inflow{epoch: now, split: true}); !errors.Is(err, errClaimStale) {
		t.Fatalf("claims of two epochs: %v, want errClaimStale", err)
	}
}
