package bus

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
)

// ms is a wire time: Unix milliseconds, in UTC.
func ms(v int64) time.Time { return time.UnixMilli(v).UTC() }

// back is what DecodeOrder gives for o: pending, and a time o lacks as the
// wire's 0 ms.
func back(o flashgate.Order) flashgate.Order {
	o.Status, o.Reason = flashgate.OrderPending, ""
	if o.CreatedAt.IsZero() {
		o.CreatedAt = ms(0)
	}
	if o.ExpiresAt.IsZero() {
		o.ExpiresAt = ms(0)
	}
	return o
}

// wireOf is o in the message's JSON shape, for encoding/json to write.
func wireOf(o *flashgate.Order) orderWire {
	return orderWire{ID: o.ID, Sale: o.SaleID, User: o.UserID, Qty: o.Quantity, Region: o.Region,
		Created: unixMilli(o.CreatedAt), Expires: unixMilli(o.ExpiresAt), Idem: o.IdemKey, Charges: o.Charges,
		Phone: o.Phone, Device: o.Device, IP: o.IP, Addr: o.Address}
}

func TestOrderRoundTrip(t *testing.T) {
	long := strings.Repeat("z", 64)
	for _, m := range []flashgate.Order{
		{ID: 1, SaleID: "s", UserID: "u", Quantity: 1},
		{ID: 7345119871795200001, SaleID: "sale-1", UserID: "user_42", Quantity: 2, Region: "bj", CreatedAt: ms(1767225600000), ExpiresAt: ms(1767226500000), IdemKey: "K-1_a"},
		{ID: 42, SaleID: "s", UserID: "u", Quantity: 3, Region: "sh-2"},                                                               // region, no idem
		{ID: 42, SaleID: "s", UserID: "u", Quantity: 3, IdemKey: "only-idem"},                                                         // idem, no region
		{ID: math.MaxUint64, SaleID: long, UserID: long, Quantity: flashgate.MaxSaleUnits, IdemKey: long, Region: "abcdefghijklmnop"}, // the edges
		{ID: 9, SaleID: "S", UserID: "U", Quantity: 1, CreatedAt: ms(-1), ExpiresAt: ms(math.MinInt64)},
		// the facts the backend works the charges out from
		{ID: 10, SaleID: "s", UserID: "u", Quantity: 1, Charges: "0/d20261124/1/+8613800000001,1/sale/1/2001:db8::/64",
			Phone: "+8613800000001", Device: "dev-1.a:b", IP: "2001:db8::/64", Address: "0123456789abcdef0123456789abcdef"},
		{ID: 11, SaleID: "s", UserID: "u", Quantity: 1, IP: "10.0.0.1"},
	} {
		b := EncodeOrder(&m)
		// AppendOrder writes what encoding/json would, byte for byte.
		want, err := json.Marshal(wireOf(&m))
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
		if got != back(m) {
			t.Errorf("round trip: %+v, want %+v", got, back(m))
		}
	}
}

func TestAppendKeepsPrefix(t *testing.T) {
	m := flashgate.Order{ID: 5, SaleID: "s", UserID: "u", Quantity: 1}
	buf := append(make([]byte, 0, 256), "prefix"...)
	b := AppendOrder(buf, &m)
	if !bytes.HasPrefix(b, []byte("prefix{")) || &b[0] != &buf[:1][0] {
		t.Fatalf("Append = %q (reallocated: %v)", b, &b[0] != &buf[:1][0])
	}
	// A reused buffer holds only the new message.
	b = AppendOrder(b[:0], &m)
	if got, err := DecodeOrder(b); err != nil || got != back(m) {
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
	if err != nil || m != back(flashgate.Order{ID: 77, SaleID: "s", UserID: "u", Quantity: 2}) {
		t.Fatalf("DecodeOrder = %+v, %v", m, err)
	}
}

func TestAppendDoesNotAllocate(t *testing.T) {
	m := flashgate.Order{ID: 7345119871795200001, SaleID: "sale-1", UserID: "user_42", Quantity: 2, Region: "bj",
		CreatedAt: ms(1767225600000), ExpiresAt: ms(1767226500000), IdemKey: "K-1"}
	buf := make([]byte, 0, 512)
	if n := testing.AllocsPerRun(1000, func() { buf = AppendOrder(buf[:0], &m) }); n != 0 {
		t.Fatalf("Append allocates %v times with a reused buffer", n)
	}
}

func FuzzDecodeOrder(f *testing.F) {
	f.Add([]byte(`{"id":"1","sale":"s","user":"u","qty":1}`))
	f.Add(EncodeOrder(&flashgate.Order{ID: 3, SaleID: "s", UserID: "u", Quantity: 2, Region: "bj", CreatedAt: ms(1), ExpiresAt: ms(2), IdemKey: "k"}))
	f.Add(EncodeOrder(&flashgate.Order{ID: 4, SaleID: "s", UserID: "u", Quantity: 1, Charges: "0/sale/1/10.0.0.1", IP: "10.0.0.1", Phone: "+8613800000001",
		Device: "d-1", Address: "0123456789abcdef"}))
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
		// Whatever is accepted survives a round trip through AppendOrder unchanged:
		// its strings need no escaping.
		again, err := DecodeOrder(EncodeOrder(&m))
		if err != nil || again != m {
			t.Fatalf("DecodeOrder(%q) = %+v; EncodeOrder/DecodeOrder = %+v, %v", b, m, again, err)
		}
	})
}

func BenchmarkAppend(b *testing.B) {
	m := flashgate.Order{ID: 7345119871795200001, SaleID: "sale-1", UserID: "user_42", Quantity: 2, Region: "bj",
		CreatedAt: ms(1767225600000), ExpiresAt: ms(1767226500000), IdemKey: "K-1"}
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendOrder(buf[:0], &m)
	}
}

func BenchmarkDecodeOrder(b *testing.B) {
	body := EncodeOrder(&flashgate.Order{ID: 7345119871795200001, SaleID: "sale-1", UserID: "user_42", Quantity: 2, Region: "bj",
		CreatedAt: ms(1767225600000), ExpiresAt: ms(1767226500000), IdemKey: "K-1"})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeOrder(body); err != nil {
			b.Fatal(err)
		}
	}
}

// A message rebuilt from a Redis record gets its facts back from its charges,
// and the charges the sale's limits make from those facts are the same.
func TestFactsFromCharges(t *testing.T) {
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
	m := flashgate.Order{ID: 1, SaleID: "s", UserID: "u", Quantity: 2, CreatedAt: now, Charges: flashgate.EncodeCharges(cs)}
	m.FactsFromCharges(s.Limits)
	if got := m.Subjects(); got != sub {
		t.Fatalf("subjects %+v, want %+v", got, sub)
	}
	again, err := s.Charges(m.Subjects(), m.Quantity, m.CreatedAt, loc)
	if err != nil || flashgate.EncodeCharges(again) != m.Charges {
		t.Fatalf("charges again %q, %v; want %q", flashgate.EncodeCharges(again), err, m.Charges)
	}
}

// The message's bytes are fixed: gateways and backends of different builds
// share the stream, so an encoding change is a wire change.
func TestOrderGoldenBytes(t *testing.T) {
	for _, tc := range []struct {
		o    flashgate.Order
		want string
	}{
		{flashgate.Order{ID: 7345119871795200001, SaleID: "sale-1", UserID: "user_42", Quantity: 2, Region: "bj",
			Status: flashgate.OrderConfirmed, Reason: "ignored", // not on the wire
			CreatedAt: ms(1767225600000), ExpiresAt: ms(1767226500000), IdemKey: "K-1",
			Charges: "0/d20261124/1/+8613800000001", Phone: "+8613800000001", Device: "d-1", IP: "10.0.0.0/24", Address: "0123456789abcdef"},
			`{"id":"7345119871795200001","sale":"sale-1","user":"user_42","qty":2,"region":"bj","created":1767225600000,"expires":1767226500000,` +
				`"idem":"K-1","charges":"0/d20261124/1/+8613800000001","phone":"+8613800000001","device":"d-1","ip":"10.0.0.0/24","addr":"0123456789abcdef"}`},
		{flashgate.Order{ID: 1, SaleID: "s", UserID: "u", Quantity: 1},
			`{"id":"1","sale":"s","user":"u","qty":1,"region":"","created":0,"expires":0}`},
		{flashgate.Order{ID: 2, SaleID: "s", UserID: "u", Quantity: 1, CreatedAt: time.Date(2026, 11, 25, 9, 0, 0, 123456789, time.FixedZone("CST", 8*3600)),
			ExpiresAt: ms(1795568700123)},
			`{"id":"2","sale":"s","user":"u","qty":1,"region":"","created":1795568400123,"expires":1795568700123}`},
	} {
		if got := string(EncodeOrder(&tc.o)); got != tc.want {
			t.Errorf("EncodeOrder(%+v)\n got %s\nwant %s", tc.o, got, tc.want)
		}
		o, err := DecodeOrder([]byte(tc.want))
		if err != nil || string(EncodeOrder(&o)) != tc.want {
			t.Errorf("DecodeOrder(%s) = %+v, %v", tc.want, o, err)
		}
	}
}
