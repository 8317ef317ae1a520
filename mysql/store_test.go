package mysql

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
)

// migrated is a new database with the current schema and one sale: 5 units,
// 2 per buyer, regions a (3) and b (2).
func migrated(t *testing.T) (*sql.DB, *flashgate.Sale) {
	t.Helper()
	db := openTest(t)
	if err := Migrate(ctx(t), db); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	s := &flashgate.Sale{ID: "s1", Title: "t", PriceCents: 100, Total: 5, StartsAt: now, EndsAt: now.Add(time.Hour),
		PerUserLimit: 2, PerOrderMax: 2, Regions: map[string]int64{"a": 3, "b": 2}}
	if err := InsertSale(ctx(t), db, s, now); err != nil {
		t.Fatal(err)
	}
	if err := InsertSale(ctx(t), db, s, now); !errors.Is(err, ErrSaleExists) {
		t.Fatalf("second insert: %v", err)
	}
	return db, s
}

// mustFor is a check of a guard's (passed, err) for t: an error ends the test.
func mustFor(t *testing.T) func(bool, error) bool {
	return func(ok bool, err error) bool {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
}

// The guards refuse what would pass a bound and change nothing then; what
// they let through is counted, and ReturnUnits takes it all back, so the
// ledger balances with the orders at every step.
func TestGuardsAndLedger(t *testing.T) {
	t.Parallel()
	db, s := migrated(t)
	c := ctx(t)
	must, mustHeld := mustFor(t), heldFor(t)
	now := time.Now().UTC()
	tx, err := Begin(c, db)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if !must(LockSale(c, tx, s.ID)) {
		t.Fatal("LockSale: no sale")
	}
	if must(GuardSold(c, tx, s.ID, 6, now, true)) {
		t.Error("GuardSold let 6 of 5 through")
	}
	if !must(GuardSold(c, tx, s.ID, 3, now, true)) || !must(GuardRegion(c, tx, s.ID, "a", 3)) {
		t.Fatal("a batch of 3 in region a refused")
	}
	if must(GuardRegion(c, tx, s.ID, "a", 1)) {
		t.Error("region a took a 4th unit")
	}
	if held := mustHeld(LockBuyers(c, tx, s.ID, []string{"u1", "u2"})); len(held) != 0 {
		t.Errorf("new buyers hold %v", held)
	}
	if err := AddBuyerUnits(c, tx, s.ID, map[string]int64{"u1": 2, "u2": 1}); err != nil {
		t.Fatal(err)
	}
	if must(GuardBuyer(c, tx, s.ID, "u1", 1, s.PerUserLimit)) {
		t.Error("u1 went past the limit")
	}
	orders := []flashgate.Order{
		{ID: 1, SaleID: s.ID, UserID: "u1", Quantity: 2, Region: "a", Status: flashgate.OrderConfirmed, IdemKey: "k1", CreatedAt: now, ExpiresAt: now.Add(time.Minute)},
		{ID: 2, SaleID: s.ID, UserID: "u2", Quantity: 1, Region: "a", Status: flashgate.OrderConfirmed, CreatedAt: now, ExpiresAt: now.Add(time.Minute)},
	}
	if err := InsertOrders(c, tx, orders, now); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	l := mustLedger(t, db, s.ID)
	if l.Sold != 3 || l.Regions["a"].Sold != 3 || l.Regions["a"].Live != 3 || l.Buyers["u1"].Counted != 2 || l.Buyers["u1"].Live != 2 {
		t.Errorf("ledger after the batch: sold %d, region a %+v, u1 %+v", l.Sold, *l.Regions["a"], *l.Buyers["u1"])
	}
	if st := l.ByStatus[string(flashgate.OrderConfirmed)]; st.Orders != 2 || st.Units != 3 {
		t.Errorf("confirmed: %+v", st)
	}
	if n, err := CountOrders(c, db, []uint64{1, 2, 3}); n != 2 || err != nil {
		t.Errorf("CountOrders = %d, %v", n, err)
	}
	holders, err := KeyHolders(c, db, s.ID, []IdemKey{{"u1", "k1"}, {"u2", "k1"}})
	if err != nil || len(holders) != 1 || holders[IdemKey{"u1", "k1"}] != 1 {
		t.Errorf("KeyHolders = %v, %v", holders, err)
	}

	tx, err = Begin(c, db)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	o, err := LockOrder(c, tx, s.ID, 1)
	if err != nil || o.UserID != "u1" || o.IdemKey != "k1" {
		t.Fatalf("LockOrder = %+v, %v", o, err)
	}
	if _, err := LockOrder(c, tx, s.ID, 9); !errors.Is(err, ErrNoOrder) {
		t.Errorf("LockOrder of no order: %v", err)
	}
	if err := ReturnUnits(c, tx, s.ID, []flashgate.Order{o}, flashgate.ReasonCanceled, now); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	l = mustLedger(t, db, s.ID)
	// The buyer's cancel: the units go back, the buyer's quota stays counted (and Kept says why).
	if l.Sold != 1 || l.Regions["a"].Sold != 1 || l.Buyers["u1"].Counted != 2 || l.Buyers["u1"].Live != 0 || l.Buyers["u1"].Kept != 2 {
		t.Errorf("ledger after the cancel: sold %d, region a %+v, u1 %+v", l.Sold, *l.Regions["a"], *l.Buyers["u1"])
	}
	if st, err := OrderStateOf(c, db, s.ID, 1); err != nil || st.Status != flashgate.OrderCanceled || st.Reason != flashgate.ReasonCanceled {
		t.Errorf("order 1: %+v, %v", st, err)
	}
}

// One order's guards run after a savepoint: a refusal rolls back to it and
// leaves the batch's earlier orders counted.
func TestSavepointRollsBackOneOrder(t *testing.T) {
	t.Parallel()
	db, s := migrated(t)
	c := ctx(t)
	must, mustHeld := mustFor(t), heldFor(t)
	tx, err := Begin(c, db)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	limit, closedAt, found, err := LockSaleLimit(c, tx, s.ID)
	if err != nil || !found || !closedAt.IsZero() || limit != 2 {
		t.Fatalf("LockSaleLimit = %d %v %t %v", limit, closedAt, found, err)
	}
	if err := Savepoint(c, tx); err != nil {
		t.Fatal(err)
	}
	if !must(GuardBuyer(c, tx, s.ID, "u1", 2, limit)) {
		t.Fatal("u1's first 2 refused")
	}
	if err := Savepoint(c, tx); err != nil {
		t.Fatal(err)
	}
	if !must(GuardBuyer(c, tx, s.ID, "u2", 2, limit)) || must(GuardRegion(c, tx, s.ID, "b", 3)) {
		t.Fatal("u2's guards")
	}
	if err := RollbackOrder(c, tx); err != nil {
		t.Fatal(err)
	}
	held := mustHeld(LockBuyers(c, tx, s.ID, []string{"u1", "u2"}))
	if held["u1"] != 2 || held["u2"] != 0 {
		t.Errorf("after the rollback to u2's savepoint: %v", held)
	}
}

// A closed sale refuses the batch guard; CloseSale of an unknown sale says so.
func TestCloseSale(t *testing.T) {
	t.Parallel()
	db, s := migrated(t)
	c := ctx(t)
	must := mustFor(t)
	first := time.Now().UTC().Truncate(time.Millisecond)
	if err := CloseSale(c, db, s.ID, first); err != nil {
		t.Fatal(err)
	}
	if err := CloseSale(c, db, s.ID, first.Add(time.Minute)); err != nil {
		t.Errorf("closing twice: %v", err)
	}
	tx, err := Begin(c, db)
	if err != nil {
		t.Fatal(err)
	}
	if _, closedAt, found, err := LockSaleLimit(c, tx, s.ID); err != nil || !found || !closedAt.Equal(first) {
		t.Errorf("LockSaleLimit of the closed sale: closed at %v (want the first close, %v), found %t, %v", closedAt, first, found, err)
	}
	tx.Rollback()
	if err := CloseSale(c, db, "nope", time.Now().UTC()); !errors.Is(err, ErrSaleNotFound) {
		t.Errorf("closing an unknown sale: %v", err)
	}
	if must(GuardSold(c, db, s.ID, 1, time.Now().UTC(), true)) {
		t.Error("a closed sale sold a unit")
	}
	if ids, err := OpenSaleIDs(c, db, time.Now().UTC()); err != nil || len(ids) != 0 {
		t.Errorf("open sales after the close: %v %v", ids, err)
	}
	if _, err := SaleLedger(c, db, "nope"); !errors.Is(err, ErrSaleNotFound) {
		t.Errorf("ledger of an unknown sale: %v", err)
	}
}

func heldFor(t *testing.T) func(map[string]int64, error) map[string]int64 {
	return func(held map[string]int64, err error) map[string]int64 {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return held
	}
}

func mustLedger(t *testing.T, db *sql.DB, sale string) *Ledger {
	t.Helper()
	l, err := SaleLedger(context.Background(), db, sale)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// The batch guard holds only while the sale row has the limits the caller
// read: after UpdateSale changed them, the old ones are refused (and sell
// nothing), LockSaleLimits reads the new ones, and those pass.
func TestGuardSoldAtLimits(t *testing.T) {
	t.Parallel()
	db, s := migrated(t)
	c := ctx(t)
	must := mustFor(t)
	row, err := LoadSale(c, db, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if row.LimitsText != "" {
		t.Fatalf("limits text of a sale without limits: %q", row.LimitsText)
	}
	now := time.Now().UTC()
	if !must(GuardSoldAt(c, db, s.ID, 1, now, row.PerUserLimit, row.LimitsText)) {
		t.Fatal("the current limits refused")
	}
	s.PerUserLimit, s.PerOrderMax = 1, 1
	s.Limits = []flashgate.Limit{{Dimension: flashgate.DimPhone, Max: 3, Per: flashgate.PerDay}}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := UpdateSale(c, db, s, now); err != nil {
		t.Fatal(err)
	}
	if must(GuardSoldAt(c, db, s.ID, 1, now, row.PerUserLimit, row.LimitsText)) {
		t.Error("limits MySQL no longer has passed the guard")
	}
	tx, err := Begin(c, db)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	l, found, err := LockSaleLimits(c, tx, s.ID)
	if err != nil || !found || l.PerUser != 1 || l.Text == "" || !l.ClosedAt.IsZero() {
		t.Fatalf("LockSaleLimits = %+v %t %v", l, found, err)
	}
	if !must(GuardSoldAt(c, tx, s.ID, 1, now, l.PerUser, l.Text)) {
		t.Fatal("the new limits refused")
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	row, err = LoadSale(c, db, s.ID)
	if err != nil || row.Sold != 2 || row.LimitsText != l.Text || len(row.Limits) != 1 || row.Limits[0].Max != 3 {
		t.Fatalf("after: %+v %v", row, err)
	}
	if _, found, err := LockSaleLimits(c, db, "nope"); found || err != nil {
		t.Errorf("LockSaleLimits of an unknown sale: %t %v", found, err)
	}
}
