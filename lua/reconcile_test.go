package lua_test

import (
	"errors"
	"strconv"
	"testing"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/lua"
)

func (s *sale) setStock(region string, n int64) {
	s.t.Helper()
	key, _ := s.k.Stock(region)
	if err := s.c.Do(ctx(s.t), s.c.B().Set().Key(key).Value(strconv.FormatInt(n, 10)).Build()).Error(); err != nil {
		s.t.Fatal(err)
	}
}

func (s *sale) delStock(region string) {
	s.t.Helper()
	key, _ := s.k.Stock(region)
	if err := s.c.Do(ctx(s.t), s.c.B().Del().Key(key).Build()).Error(); err != nil {
		s.t.Fatal(err)
	}
}

func val(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}

// ResetStock sets every stock key to avail − extra − reserved, counting the
// reservations itself, and writes nothing when they moved since the caller
// read them.
func TestResetStockAll(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newSale(t, c, nil)
		s.mustAdmit(lua.AdmitArgs{User: "a", Quantity: 2})
		s.mustAdmit(lua.AdmitArgs{User: "b", Quantity: 1})
		s.setStock("", 100) // a ledger gone wrong

		// The caller expected 2 reserved units: 3 are: nothing is written.
		_, err := scripts.ResetStock(ctx(t), c, s.k, false, []lua.StockPlan{{Avail: 10, Reserved: 2}})
		if !errors.Is(err, lua.ErrReservationsChanged) {
			t.Fatalf("err = %v, want ErrReservationsChanged", err)
		}
		if got := s.remaining(""); got != 100 {
			t.Fatalf("remaining %d after a refused reset", got)
		}

		ch, err := scripts.ResetStock(ctx(t), c, s.k, false, []lua.StockPlan{{Avail: 10, Extra: 1, Reserved: 3}})
		if err != nil {
			t.Fatal(err)
		}
		if len(ch) != 1 || val(ch[0].Before) != int64(100) || val(ch[0].After) != int64(6) {
			t.Fatalf("changes %+v", ch)
		}
		if got := s.remaining(""); got != 6 {
			t.Fatalf("remaining %d, want 10 - 1 - 3", got)
		}
		// Unchecked (Reserved < 0), and a total below the reservations: the
		// stock goes negative, which admits nothing and is what the releases
		// to come bring back to the truth.
		if _, err := scripts.ResetStock(ctx(t), c, s.k, false, []lua.StockPlan{{Avail: 1, Reserved: -1}}); err != nil {
			t.Fatal(err)
		}
		if got := s.remaining(""); got != -2 {
			t.Fatalf("remaining %d, want 1 - 3", got)
		}
		if res, _ := s.admit(lua.AdmitArgs{User: "c"}); res.Outcome != lua.SoldOut {
			t.Fatalf("admit on negative stock: %v", res.Outcome)
		}
	})
}

// Only the absent keys of a sale with regions are set in 'missing' mode, each
// with its own region's reservations.
func TestResetStockMissing(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		s := newSale(t, c, func(sp *flashgate.Sale) { sp.Regions = map[string]int64{"bj": 6, "sh": 4} })
		s.mustAdmit(lua.AdmitArgs{User: "a", Quantity: 2, Region: "bj"})
		s.mustAdmit(lua.AdmitArgs{User: "b", Quantity: 1, Region: "sh"})
		s.delStock("bj")
		plans := []lua.StockPlan{{Region: "bj", Avail: 6, Reserved: 2}, {Region: "sh", Avail: 4, Reserved: 99}}
		ch, err := scripts.ResetStock(ctx(t), c, s.k, true, plans)
		if err != nil {
			t.Fatal(err) // sh's expectation is wrong, but sh is not set: not checked
		}
		if ch[0].Region != "bj" || ch[0].Before != nil || val(ch[0].After) != int64(4) {
			t.Fatalf("bj: %+v", ch[0])
		}
		if ch[1].Region != "sh" || val(ch[1].Before) != int64(3) || ch[1].After != nil {
			t.Fatalf("sh: %+v", ch[1])
		}
		if s.remaining("bj") != 4 || s.remaining("sh") != 3 {
			t.Fatalf("remaining bj %d sh %d", s.remaining("bj"), s.remaining("sh"))
		}
		if _, err := scripts.ResetStock(ctx(t), c, s.k, false, []lua.StockPlan{{Region: "xx"}}); !errors.Is(err, lua.ErrUnknownRegion) {
			t.Fatalf("unknown region: %v", err)
		}
	})
}
