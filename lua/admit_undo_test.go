package lua_test

import (
	"fmt"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/lua"
)

// admit.lua counts the buyer first (HINCRBY) and takes the count back on a later
// refusal: every refusal must
// leave the sale's keys exactly as they were, a buyer's count that did not exist
// included.

// snapshot is everything of the sale an admission could touch: each key's type,
// value and whether it expires.
func (s *sale) snapshot() map[string]string {
	s.t.Helper()
	_, stock := s.k.StockKeys()
	return s.keysState(append([]string{s.k.Meta, s.k.Users, s.k.Resv, s.k.Orders, s.k.Idem, s.k.Limit("sale")}, stock...))
}

// keysState is each key's type, value and whether it expires.
func (s *sale) keysState(keys []string) map[string]string {
	s.t.Helper()
	out := map[string]string{}
	for _, key := range keys {
		typ, err := s.c.Do(ctx(s.t), s.c.B().Type().Key(key).Build()).ToString()
		if err != nil {
			s.t.Fatal(err)
		}
		ttl, err := s.c.Do(ctx(s.t), s.c.B().Pttl().Key(key).Build()).AsInt64()
		if err != nil {
			s.t.Fatal(err)
		}
		var val any
		switch typ {
		case "none":
		case "string":
			val, err = s.c.Do(ctx(s.t), s.c.B().Get().Key(key).Build()).ToString()
		case "hash":
			val, err = s.c.Do(ctx(s.t), s.c.B().Hgetall().Key(key).Build()).AsStrMap()
		default:
			s.t.Fatalf("%s is a %s", key, typ)
		}
		if err != nil {
			s.t.Fatal(err)
		}
		out[key] = fmt.Sprintf("%s expires:%v %v", typ, ttl >= 0, val)
	}
	return out
}

func (s *sale) unchanged(what string, before map[string]string) {
	s.t.Helper()
	if after := s.snapshot(); !reflect.DeepEqual(before, after) {
		s.t.Fatalf("%s changed Redis:\nbefore %v\nafter  %v", what, before, after)
	}
}

func TestRefusalLeavesRedisAsItWas(t *testing.T) {
	eachTarget(t, func(t *testing.T, c rueidis.Client) {
		t.Run("per-user limit, buyer counted before", func(t *testing.T) {
			s := newSale(t, c, func(s *flashgate.Sale) { s.PerUserLimit, s.PerOrderMax = 3, 2 })
			s.mustAdmit(lua.AdmitArgs{User: "alice", Quantity: 2})
			before := s.snapshot()
			if res, _ := s.admit(lua.AdmitArgs{User: "alice", Quantity: 2}); res.Outcome != lua.LimitReached || res.Held != 2 || res.Limit != -1 {
				t.Fatalf("admit = %+v, want limit_reached holding 2 (per_user_limit)", res)
			}
			s.unchanged("a per-user refusal", before)
			s.mustAdmit(lua.AdmitArgs{User: "alice", Quantity: 1})
			if s.held("alice") != 3 {
				t.Fatalf("alice holds %d, want 3", s.held("alice"))
			}
		})
		t.Run("duplicate id, buyer and users key new", func(t *testing.T) {
			s := newSale(t, c, nil)
			id := nextID()
			if err := c.Do(ctx(t), c.B().Hset().Key(s.k.Orders).FieldValue().FieldValue(strconv.FormatUint(id, 10), "taken").Build()).Error(); err != nil {
				t.Fatal(err)
			}
			before := s.snapshot()
			if res, _ := s.admit(lua.AdmitArgs{User: "bob", OrderID: id}); res.Outcome != lua.DuplicateID {
				t.Fatalf("admit = %+v, want duplicate_id", res)
			}
			s.unchanged("a duplicate id", before)
		})
		t.Run("a limit of the sale, buyer new", func(t *testing.T) {
			s := limited(t, c, 100, "", flashgate.Limit{Dimension: flashgate.DimPhone, Max: 1})
			now := time.Now()
			if res := s.buy(flashgate.Subjects{User: "carol", Phone: "p1"}, 1, now); res.Outcome != lua.Admitted {
				t.Fatalf("carol: %+v, want admitted", res)
			}
			before := s.snapshot()
			if res := s.buy(flashgate.Subjects{User: "dave", Phone: "p1"}, 1, now); res.Outcome != lua.LimitReached || res.Limit != 0 {
				t.Fatalf("dave: %+v, want limit_reached by limit 0", res)
			}
			s.unchanged("a phone limit's refusal", before)
			if s.held("dave") != 0 {
				t.Fatalf("dave holds %d", s.held("dave"))
			}
		})
		t.Run("no stock key", func(t *testing.T) {
			s := newSale(t, c, func(s *flashgate.Sale) { s.Regions = map[string]int64{"bj": 6, "sh": 4} })
			s.mustAdmit(lua.AdmitArgs{User: "gina", Region: "bj"})
			sh, _ := s.k.Stock("sh")
			if err := c.Do(ctx(t), c.B().Del().Key(sh).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			before := s.snapshot()
			for _, u := range []string{"gina", "hank"} {
				if res, _ := s.admit(lua.AdmitArgs{User: u, Region: "sh"}); res.Outcome != lua.NotWarmed {
					t.Fatalf("%s: %+v, want not_warmed", u, res)
				}
			}
			s.unchanged("a not-warmed refusal", before)
		})
		t.Run("sold out", func(t *testing.T) {
			s := newSale(t, c, func(s *flashgate.Sale) { s.Total, s.PerUserLimit, s.PerOrderMax = 1, 1, 1 })
			s.mustAdmit(lua.AdmitArgs{User: "erin"})
			before := s.snapshot()
			if res, _ := s.admit(lua.AdmitArgs{User: "frank"}); res.Outcome != lua.SoldOut {
				t.Fatalf("admit = %+v, want sold_out", res)
			}
			s.unchanged("a sold-out refusal", before)
		})
	})
}
