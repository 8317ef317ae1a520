package mysql

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
)

// Every change of an order's status writes its event in the same
// transaction: a rolled-back change leaves none, a committed one exactly one,
// with the order's next seq, its type (expired for a cancel by the
// deadline), its amount, and MySQL's time.
func TestOrderEventsFollowEveryChange(t *testing.T) {
	t.Parallel()
	db, s := migrated(t)
	c := ctx(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	order := func(id uint64, user, region string, st flashgate.OrderStatus, reason string) flashgate.Order {
		return flashgate.Order{ID: id, SaleID: s.ID, UserID: user, Quantity: 1, Region: region, Status: st, Reason: reason,
			CreatedAt: now, ExpiresAt: now.Add(time.Minute)}
	}
	tx, err := Begin(c, db)
	if err != nil {
		t.Fatal(err)
	}
	if err := InsertOrders(c, tx, []flashgate.Order{order(1, "u1", "a", flashgate.OrderConfirmed, "")}, now); err != nil {
		t.Fatal(err)
	}
	tx.Rollback() // no order, no event
	tx, err = Begin(c, db)
	if err != nil {
		t.Fatal(err)
	}
	orders := []flashgate.Order{order(1, "u1", "a", flashgate.OrderConfirmed, ""), order(2, "u2", "a", flashgate.OrderConfirmed, ""),
		order(3, "u3", "b", flashgate.OrderConfirmed, ""), order(4, "u4", "b", flashgate.OrderFailed, flashgate.ReasonSoldOut)}
	if err := InsertOrders(c, tx, orders, now); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	// Pay 1; cancel 2; expire 3; the dead-letter path fails 5 (and not 1 again).
	inTx := func(f func(tx Querier) error) {
		t.Helper()
		tx, err := Begin(c, db)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if err := f(tx); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	// The sale's counters first, as the writer would have counted them.
	inTx(func(tx Querier) error {
		_, err := tx.ExecContext(c, `UPDATE sales SET sold = 3 WHERE id = ?`, s.ID)
		if err == nil {
			_, err = tx.ExecContext(c, `UPDATE sale_regions SET sold = CASE region WHEN 'a' THEN 2 ELSE 1 END WHERE sale_id = ?`, s.ID)
		}
		if err == nil {
			_, err = tx.ExecContext(c, `INSERT INTO user_purchases (sale_id, user_id, units) VALUES (?, 'u1', 1), (?, 'u2', 1), (?, 'u3', 1)`, s.ID, s.ID, s.ID)
		}
		return err
	})
	inTx(func(tx Querier) error { return MarkPaid(c, tx, 1, Payment{ID: "pay-1", AmountCents: 100}, now) })
	inTx(func(tx Querier) error {
		return ReturnUnits(c, tx, s.ID, []flashgate.Order{orders[1]}, flashgate.ReasonCanceled, now)
	})
	inTx(func(tx Querier) error {
		return ReturnUnits(c, tx, s.ID, []flashgate.Order{orders[2]}, flashgate.ReasonExpired, now)
	})
	for _, o := range []flashgate.Order{order(5, "u5", "a", flashgate.OrderFailed, flashgate.ReasonDeadLetter),
		order(1, "u1", "a", flashgate.OrderFailed, flashgate.ReasonDeadLetter)} {
		if _, err := InsertFailed(c, db, o, now); err != nil {
			t.Fatal(err)
		}
	}

	evs, err := PendingEvents(c, db, 100)
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		order uint64
		seq   uint32
		typ   flashgate.EventType
		st    flashgate.OrderStatus
		why   string
	}
	wants := []want{
		{1, 1, flashgate.EventConfirmed, flashgate.OrderConfirmed, ""},
		{2, 1, flashgate.EventConfirmed, flashgate.OrderConfirmed, ""},
		{3, 1, flashgate.EventConfirmed, flashgate.OrderConfirmed, ""},
		{4, 1, flashgate.EventFailed, flashgate.OrderFailed, flashgate.ReasonSoldOut},
		{1, 2, flashgate.EventPaid, flashgate.OrderPaid, ""},
		{2, 2, flashgate.EventCanceled, flashgate.OrderCanceled, flashgate.ReasonCanceled},
		{3, 2, flashgate.EventExpired, flashgate.OrderCanceled, flashgate.ReasonExpired},
		{5, 1, flashgate.EventFailed, flashgate.OrderFailed, flashgate.ReasonDeadLetter},
	}
	if len(evs) != len(wants) {
		t.Fatalf("%d events, want %d: %+v", len(evs), len(wants), evs)
	}
	var dbNow time.Time
	if err := db.QueryRowContext(c, `SELECT UTC_TIMESTAMP(6)`).Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	for i, w := range wants {
		e := evs[i]
		if e.OrderID != w.order || e.Seq != w.seq || e.Type != w.typ || e.Status != w.st || e.Reason != w.why ||
			e.ID != strconv.FormatUint(w.order, 10)+"-"+strconv.FormatUint(uint64(w.seq), 10) || e.SaleID != s.ID ||
			e.Quantity != 1 || e.AmountCents == nil || *e.AmountCents != s.PriceCents {
			t.Errorf("event %d = %+v, want %+v", i, e, w)
		}
		if i > 0 && e.Pos <= evs[i-1].Pos {
			t.Errorf("event %d at pos %d after %d", i, e.Pos, evs[i-1].Pos)
		}
		if e.At.IsZero() || e.At.After(dbNow) {
			t.Errorf("event %d at %v, MySQL's now %v", i, e.At, dbNow)
		}
	}
	n, _, err := EventBacklog(c, db)
	if err != nil || n != int64(len(wants)) {
		t.Fatalf("backlog %d (%v), want %d", n, err, len(wants))
	}
	if err := DeleteEvents(c, db, []uint64{evs[0].Pos, evs[1].Pos}); err != nil {
		t.Fatal(err)
	}
	rest, err := PendingEvents(c, db, 100)
	if err != nil || len(rest) != len(wants)-2 || rest[0].Pos != evs[2].Pos {
		t.Fatalf("after delete: %d events (%v)", len(rest), err)
	}
}

// Every statement of this package that writes an order's status raises its
// event_seq, and the function that runs it records the event: a new way to
// change an order cannot forget its event without this test failing.
func TestEveryStatusWriteRecordsItsEvent(t *testing.T) {
	writes := regexp.MustCompile(`(?is)^\s*(INSERT\s+INTO\s+orders\s|UPDATE\s+orders\s+SET\s+[^;]*\bstatus\s*=)`)
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, path := range files {
		if filepath.Ext(path) != ".go" || len(path) > 8 && path[len(path)-8:] == "_test.go" {
			continue
		}
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			var statements []string
			records := false
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				switch x := n.(type) {
				case *ast.BasicLit:
					if x.Kind == token.STRING {
						if s, err := strconv.Unquote(x.Value); err == nil && writes.MatchString(s) {
							statements = append(statements, s)
						}
					}
				case *ast.CallExpr:
					if id, ok := x.Fun.(*ast.Ident); ok && id.Name == "recordEvents" {
						records = true
					}
				}
				return true
			})
			for _, s := range statements {
				found++
				if !regexp.MustCompile(`event_seq`).MatchString(s) {
					t.Errorf("%s: %s writes orders without raising event_seq: %q", path, fn.Name.Name, s)
				}
				// RestoreDeadLettered puts a row back as it was (a redrive the
				// stream refused): no status changes, so no event.
				if !records && fn.Name.Name != "RestoreDeadLettered" {
					t.Errorf("%s: %s writes an order's status and records no event (recordEvents)", path, fn.Name.Name)
				}
			}
		}
	}
	if found < 4 {
		t.Fatalf("found %d statements that write orders' status: the search is broken", found)
	}
}
