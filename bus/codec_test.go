package bus

import (
	"bytes"
	"encoding/json"
	"errors"
	"github.com/flashgate/flashgate"
	"math"
	"strings"
	"testing"
	"time"
)

func TestOrderMsgRoundTrip(t *testing.T) {
	long := strings.Repeat("z", 64)
	for _, m := range []OrderMsg{
		{ID: 1, Sale: "s", User: "u", Qty: 1},
		{ID: 7345119871795200001, Sale: "sale-1", User: "user_42", Qty: 2, Region: "bj", Created: 1767225600000, Expires: 1767226500000, Idem: "K-1_a"},
		{ID: 42, Sale: "s", User: "u", Qty: 3, Region: "sh-2"},                                                            // region, no idem
		{ID: 42, Sale: "s", User: "u", Qty: 3, Idem: "only-idem"},                                                         // idem, no region
		{ID: math.MaxUint64, Sale: long, User: long, Qty: flashgate.MaxSaleUnits, Idem: long, Region: "abcdefghijklmnop"}, // the edges
		{ID: 9, Sale: "S", User: "U", Qty: 1, Created: -1, Expires: math.MinInt64},
		// the facts the backend works the charges out from
		{ID: 10, Sale: "s", User: "u", Qty: 1, Charges: "0/d20261124/1/+8613800000001,1/sale/1/2001:db8::/64",
			Phone: "+8613800000001", Device: "dev-1.a:b", IP: "2001:db8::/64", Addr: "0123456789abcdef0123456789abcdef"},
		{ID: 11, Sale: "s", User: "u", Qty: 1, IP: "10.0.0.1"},
	} {
		b := m.Append(nil)
		// Append writes what encoding/json would, byte for byte.
		want, err := json.Marshal(&m)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, want) {
			t.Errorf("Append = %s\n  json = %s", b, want)
		}
		got, err := DecodeOrder(b)
		if err != nil {
			t.Errorf("DecodeOrder(%s): %v", b, err)
			continue
		}
		if got != m {
			t.Errorf("round trip: %+v, want %+v", got, m)
		}
	}
}

func TestAppendKeepsPrefix(t *testing.T) {
	m := OrderMsg{ID: 5, Sale: "s", User: "u", Qty: 1}
	buf := append(make([]byte, 0, 256), "prefix"...)
	b := m.Append(buf)
	if !bytes.HasPrefix(b, []byte("prefix{")) || &b[0] != &buf[:1][0] {
		t.Fatalf("Append = %q (reallocated: %v)", b, &b[0] != &buf[:1][0])
	}
	// A reused buffer holds only the new message.
	b = m.Append(b[:0])
	if got, err := DecodeOrder(b); err != nil || got != m {
		t.Fatalf("reused buffer: %+v, %v", got, err)
	}
}

func TestDecodeOrderRejects(t *testing.T) {
	for _, tc := range []struct{ name, body string }{
		{"empty", ``},
		{"not json", `order 1`},
		{"truncated", `{"id":"1","sale":"s","user":"u","qty":1`},
		{"array", `[1]`},
		{"null", `null`},
		{"empty object", `{}`},
		{"missing id", `{"sale":"s","user":"u","qty":1}`},
		{"id 0", `{"id":"0","sale":"s","user":"u","qty":1}`},
		{"id unquoted", `{"id":1,"sale":"s","user":"u","qty":1}`},
		{"id not a number", `{"id":"x","sale":"s","user":"u","qty":1}`},
		{"id negative", `{"id":"-1","sale":"s","user":"u","qty":1}`},
		{"id too big", `{"id":"18446744073709551616","sale":"s","user":"u","qty":1}`},
		{"missing sale", `{"id":"1","user":"u","qty":1}`},
		{"sale with a space", `{"id":"1","sale":"s 1","user":"u","qty":1}`},
		{"sale with a dot", `{"id":"1","sale":"s.1","user":"u","qty":1}`},
		{"sale of 65", `{"id":"1","sale":"` + strings.Repeat("s", 65) + `","user":"u","qty":1}`},
		{"missing user", `{"id":"1","sale":"s","qty":1}`},
		{"user with a pipe", `{"id":"1","sale":"s","user":"u|2","qty":1}`},
		{"user with a quote", `{"id":"1","sale":"s","user":"u\"","qty":1}`},
		{"user not ascii", `{"id":"1","sale":"s","user":"ü","qty":1}`},
		{"qty 0", `{"id":"1","sale":"s","user":"u","qty":0}`},
		{"qty past any sale", `{"id":"1","sale":"s","user":"u","qty":1099511627777}`},
		{"qty missing", `{"id":"1","sale":"s","user":"u"}`},
		{"qty negative", `{"id":"1","sale":"s","user":"u","qty":-2}`},
		{"qty fractional", `{"id":"1","sale":"s","user":"u","qty":1.5}`},
		{"qty string", `{"id":"1","sale":"s","user":"u","qty":"1"}`},
		{"region upper case", `{"id":"1","sale":"s","user":"u","qty":1,"region":"BJ"}`},
		{"region too long", `{"id":"1","sale":"s","user":"u","qty":1,"region":"abcdefghijklmnopq"}`},
		{"idem with a space", `{"id":"1","sale":"s","user":"u","qty":1,"idem":"a b"}`},
		{"idem of 65", `{"id":"1","sale":"s","user":"u","qty":1,"idem":"` + strings.Repeat("k", 65) + `"}`},
		{"phone with a comma", `{"id":"1","sale":"s","user":"u","qty":1,"phone":"+86,1"}`},
		{"device with a quote", `{"id":"1","sale":"s","user":"u","qty":1,"device":"d\""}`},
		{"ip with a pipe", `{"id":"1","sale":"s","user":"u","qty":1,"ip":"1.2.3.4|x"}`},
		{"addr of 65", `{"id":"1","sale":"s","user":"u","qty":1,"addr":"` + strings.Repeat("a", 65) + `"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if m, err := DecodeOrder([]byte(tc.body)); !errors.Is(err, ErrBadMsg) {
				t.Fatalf("DecodeOrder(%s) = %+v, %v; want ErrBadMsg", tc.body, m, err)
			}
		})
	}
}

func TestDecodeOrderAccepts(t *testing.T) {
	// What other writers may send: fields in any order, spaces, unknown fields
	// (a newer gateway), an empty idem.
	body := `{ "qty": 2, "user": "u", "sale": "s", "id": "77", "extra": {"x": [1]}, "idem": "", "region": "" }`
	m, err := DecodeOrder([]byte(body))
	if err != nil || m != (OrderMsg{ID: 77, Sale: "s", User: "u", Qty: 2}) {
		t.Fatalf("DecodeOrder = %+v, %v", m, err)
	}
}

func TestAppendDoesNotAllocate(t *testing.T) {
	m := OrderMsg{ID: 7345119871795200001, Sale: "sale-1", User: "user_42", Qty: 2, Region: "bj",
		Created: 1767225600000, Expires: 1767226500000, Idem: "K-1"}
	buf := make([]byte, 0, 512)
	if n := testing.AllocsPerRun(1000, func() { buf = m.Append(buf[:0]) }); n != 0 {
		t.Fatalf("Append allocates %v times with a reused buffer", n)
	}
}

func FuzzDecodeOrder(f *testing.F) {
	f.Add([]byte(`{"id":"1","sale":"s","user":"u","qty":1}`))
	f.Add((&OrderMsg{ID: 3, Sale: "s", User: "u", Qty: 2, Region: "bj", Created: 1, Expires: 2, Idem: "k"}).Append(nil))
	f.Add((&OrderMsg{ID: 4, Sale: "s", User: "u", Qty: 1, Charges: "0/sale/1/10.0.0.1", IP: "10.0.0.1", Phone: "+8613800000001",
		Device: "d-1", Addr: "0123456789abcdef"}).Append(nil))
	f.Add([]byte(`{"id":"0"}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"id":1e400}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeOrder(b)
		if err != nil {
			if !errors.Is(err, ErrBadMsg) {
				t.Fatalf("DecodeOrder(%q): %v is not ErrBadMsg", b, err)
			}
			return
		}
		// Whatever is accepted survives a round trip through Append unchanged:
		// its strings need no escaping.
		again, err := DecodeOrder(m.Append(nil))
		if err != nil || again != m {
			t.Fatalf("DecodeOrder(%q) = %+v; Append/Decode = %+v, %v", b, m, again, err)
		}
	})
}

func BenchmarkAppend(b *testing.B) {
	m := OrderMsg{ID: 7345119871795200001, Sale: "sale-1", User: "user_42", Qty: 2, Region: "bj",
		Created: 1767225600000, Expires: 1767226500000, Idem: "K-1"}
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		buf = m.Append(buf[:0])
	}
}

func BenchmarkDecodeOrder(b *testing.B) {
	body := (&OrderMsg{ID: 7345119871795200001, Sale: "sale-1", User: "user_42", Qty: 2, Region: "bj",
		Created: 1767225600000, Expires: 1767226500000, Idem: "K-1"}).Append(nil)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeOrder(body); err != nil {
			b.Fatal(err)
		}
	}
}

// A message rebuilt from a Redis record gets its facts back from its charges,
// and the charges the sale's limits make from those facts are the same.
func TestSubjectsFromCharges(t *testing.T) {
	s := flashgate.Sale{ID: "s", Title: "t", Total: 10, PerUserLimit: 5, PerOrderMax: 5, TimeZone: "Asia/Shanghai",
		Limits: []flashgate.Limit{
			{Dimension: flashgate.DimUser, Max: 3},
			{Dimension: flashgate.DimPhone, Max: 2, Per: flashgate.PerDay},
			{Dimension: flashgate.DimDevice, Max: 2, Of: flashgate.OfOrders},
			{Dimension: flashgate.DimIP, Max: 4, Per: flashgate.PerMonth},
			{Dimension: flashgate.DimAddress, Max: 1},
		}}
	s.StartsAt = time.Now().Add(-time.Hour)
	s.EndsAt = time.Now().Add(time.Hour)
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	loc, _ := s.Location()
	now := time.UnixMilli(time.Now().UnixMilli())
	sub := flashgate.Subjects{User: "u", Phone: "+8613800000001", Device: "dev:1", IP: "2001:db8:1:2::/64", Address: "0123456789abcdef"}
	cs, err := s.Charges(sub, 2, now, loc)
	if err != nil {
		t.Fatal(err)
	}
	m := OrderMsg{ID: 1, Sale: "s", User: "u", Qty: 2, Created: now.UnixMilli(), Charges: flashgate.EncodeCharges(cs)}
	m.SubjectsFromCharges(s.Limits)
	if got := m.Subjects(); got != sub {
		t.Fatalf("subjects %+v, want %+v", got, sub)
	}
	again, err := s.Charges(m.Subjects(), m.Qty, time.UnixMilli(m.Created), loc)
	if err != nil || flashgate.EncodeCharges(again) != m.Charges {
		t.Fatalf("charges again %q, %v; want %q", flashgate.EncodeCharges(again), err, m.Charges)
	}
}
