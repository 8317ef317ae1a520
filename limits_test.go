package flashgate_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
)

func baseSale() flashgate.Sale {
	start := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	return flashgate.Sale{ID: "s1", Title: "t", Total: 100, StartsAt: start, EndsAt: start.Add(time.Hour),
		PerUserLimit: 4, PerOrderMax: 2}
}

func TestValidateLimits(t *testing.T) {
	s := baseSale()
	s.Limits = []flashgate.Limit{{Dimension: flashgate.DimPhone, Max: 1}, {Dimension: flashgate.DimPhone, Max: 2, Of: "orders", Per: "day"}}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	if s.TimeZone != "UTC" || s.Limits[0].Of != flashgate.OfUnits || s.Limits[0].Per != flashgate.PerSale {
		t.Fatalf("defaults not filled: %+v %q", s.Limits, s.TimeZone)
	}
	bad := map[string]func(*flashgate.Sale){
		"dimension": func(s *flashgate.Sale) { s.Limits = []flashgate.Limit{{Dimension: "email", Max: 1}} },
		"max":       func(s *flashgate.Sale) { s.Limits = []flashgate.Limit{{Dimension: "ip", Max: 0}} },
		"of":        func(s *flashgate.Sale) { s.Limits = []flashgate.Limit{{Dimension: "ip", Max: 1, Of: "grams"}} },
		"per":       func(s *flashgate.Sale) { s.Limits = []flashgate.Limit{{Dimension: "ip", Max: 1, Per: "week"}} },
		"two limits": func(s *flashgate.Sale) {
			s.Limits = []flashgate.Limit{{Dimension: "ip", Max: 1}, {Dimension: "ip", Max: 3, Of: "units", Per: "sale"}}
		},
		"at most": func(s *flashgate.Sale) {
			for i := 0; i < flashgate.MaxLimits+1; i++ {
				s.Limits = append(s.Limits, flashgate.Limit{Dimension: "ip", Max: int64(i + 1)})
			}
		},
		"time_zone": func(s *flashgate.Sale) { s.TimeZone = "Mars/Olympus" },
	}
	for want, edit := range bad {
		s := baseSale()
		edit(&s)
		err := s.Validate()
		if !errors.Is(err, flashgate.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: Validate = %v", want, err)
		}
	}
}

func TestWindows(t *testing.T) {
	sh, err := time.LoadLocation("Asia/Shanghai")
	if err != nil {
		t.Fatal(err)
	}
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		per  string
		now  time.Time
		loc  *time.Location
		id   string
		ends time.Time
	}{
		// 16:30 UTC is already the next day in Shanghai (UTC+8).
		{flashgate.PerDay, time.Date(2026, 11, 22, 16, 30, 0, 0, time.UTC), sh, "d20261123", time.Date(2026, 11, 24, 0, 0, 0, 0, sh)},
		{flashgate.PerDay, time.Date(2026, 11, 22, 15, 59, 59, 0, time.UTC), sh, "d20261122", time.Date(2026, 11, 23, 0, 0, 0, 0, sh)},
		{flashgate.PerMonth, time.Date(2026, 12, 31, 16, 0, 0, 0, time.UTC), sh, "m202701", time.Date(2027, 2, 1, 0, 0, 0, 0, sh)},
		{flashgate.PerMonth, time.Date(2026, 12, 31, 15, 0, 0, 0, time.UTC), sh, "m202612", time.Date(2027, 1, 1, 0, 0, 0, 0, sh)},
		// The day DST ends in New York is 25 hours long: the window ends at local midnight.
		{flashgate.PerDay, time.Date(2026, 11, 1, 12, 0, 0, 0, ny), ny, "d20261101", time.Date(2026, 11, 2, 0, 0, 0, 0, ny)},
		{flashgate.PerSale, time.Now(), sh, "sale", time.Time{}},
	}
	for _, c := range cases {
		id, ends := flashgate.Window(c.per, c.now, c.loc)
		if id != c.id || !ends.Equal(c.ends) {
			t.Errorf("Window(%s, %v) = %s %v, want %s %v", c.per, c.now, id, ends, c.id, c.ends)
		}
		if back := flashgate.WindowEnd(id, c.loc); !back.Equal(c.ends) {
			t.Errorf("WindowEnd(%s) = %v, want %v", id, back, c.ends)
		}
	}
	if d := time.Date(2026, 11, 2, 0, 0, 0, 0, ny).Sub(time.Date(2026, 11, 1, 0, 0, 0, 0, ny)); d != 25*time.Hour {
		t.Fatalf("the DST day is %v long: the case above tests nothing", d)
	}
	for _, bad := range []string{"", "d", "dx", "d2026112", "m2026", "q202611"} {
		if e := flashgate.WindowEnd(bad, time.UTC); !e.IsZero() {
			t.Errorf("WindowEnd(%q) = %v", bad, e)
		}
	}
}

func TestCharges(t *testing.T) {
	s := baseSale()
	s.TimeZone = "Asia/Shanghai"
	s.Limits = []flashgate.Limit{
		{Dimension: flashgate.DimPhone, Max: 1, Of: flashgate.OfOrders, Per: flashgate.PerDay},
		{Dimension: flashgate.DimAddress, Max: 3},
		{Dimension: flashgate.DimIP, Max: 2, Per: flashgate.PerMonth},
	}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	loc, _ := s.Location()
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	sub := flashgate.Subjects{User: "u1", Phone: "+8613800000000", IP: "198.18.0.1", Address: "ab12"}
	cs, err := s.Charges(sub, 2, now, loc)
	if err != nil {
		t.Fatal(err)
	}
	enc := flashgate.EncodeCharges(cs)
	if want := "0/d20261122/1/+8613800000000,1/sale/2/ab12,2/m202611/2/198.18.0.1"; enc != want {
		t.Fatalf("charges %q, want %q", enc, want)
	}
	if cs[0].TTL(now) != cs[0].Ends.Sub(now)+time.Hour || cs[1].TTL(now) != 0 {
		t.Fatalf("TTLs %v %v", cs[0].TTL(now), cs[1].TTL(now))
	}
	back, err := flashgate.ParseCharges(enc)
	if err != nil || len(back) != 3 || back[2].Subject != "198.18.0.1" || back[0].Inc != 1 || back[1].Inc != 2 {
		t.Fatalf("ParseCharges = %+v, %v", back, err)
	}

	sub.Address = ""
	_, err = s.Charges(sub, 1, now, loc)
	var miss *flashgate.MissingSubjectError
	if !errors.As(err, &miss) || miss.Dimension != flashgate.DimAddress || !strings.Contains(err.Error(), "address") {
		t.Fatalf("missing address: %v", err)
	}
	s.Limits = nil
	if cs, err := s.Charges(flashgate.Subjects{User: "u"}, 1, now, loc); cs != nil || err != nil {
		t.Fatalf("no limits: %v %v", cs, err)
	}
}

func TestParseChargesRefuses(t *testing.T) {
	for _, bad := range []string{"x", "0/sale/1", "0/sale/0/u", "-1/sale/1/u", "9/sale/1/u", "0//1/u",
		"0/sale/1/a|b", `0/sale/1/a"b`, "0/sale/1/" + strings.Repeat("a", 65), "0/sale/x/u"} {
		if _, err := flashgate.ParseCharges(bad); !errors.Is(err, flashgate.ErrBadCharges) {
			t.Errorf("ParseCharges(%q) = %v", bad, err)
		}
	}
	// An IPv6 /64 subject holds '/' and ':'.
	cs, err := flashgate.ParseCharges("1/sale/1/2001:db8:1:2::/64")
	if err != nil || cs[0].Subject != "2001:db8:1:2::/64" {
		t.Fatalf("%+v %v", cs, err)
	}
}

func TestSubjects(t *testing.T) {
	for in, want := range map[string]string{"+86 138-0000-0000": "+8613800000000", "(010) 1234.5678": "01012345678"} {
		if got, ok := flashgate.NormalisePhone(in); !ok || got != want {
			t.Errorf("NormalisePhone(%q) = %q %v", in, got, ok)
		}
	}
	for _, bad := range []string{"", "1234", "12+345678", "138x0000000", strings.Repeat("1", 21)} {
		if _, ok := flashgate.NormalisePhone(bad); ok {
			t.Errorf("NormalisePhone(%q) took it", bad)
		}
	}

	a1, ok1 := flashgate.NormaliseAddress("北京市朝阳区 建国路８８号，A座 1201")
	a2, ok2 := flashgate.NormaliseAddress("北京市朝阳区建国路88号a座1201")
	a3, _ := flashgate.NormaliseAddress("北京市朝阳区建国路89号a座1201")
	if !ok1 || !ok2 || a1 != a2 || a1 == a3 || len(a1) != 32 {
		t.Fatalf("addresses %q %q %q", a1, a2, a3)
	}
	for _, bad := range []string{"", " ，。!", strings.Repeat("a", flashgate.MaxAddressBytes+1)} {
		if _, ok := flashgate.NormaliseAddress(bad); ok {
			t.Errorf("NormaliseAddress(%q) took it", bad)
		}
	}

	if !flashgate.ValidDevice("ios-1:AB.c_d") || flashgate.ValidDevice("a b") || flashgate.ValidDevice("") {
		t.Fatal("ValidDevice")
	}

	v4 := flashgate.IPSubject(netip.MustParseAddr("::ffff:198.18.0.7"))
	x := flashgate.IPSubject(netip.MustParseAddr("2001:db8:1:2:aaaa::1"))
	y := flashgate.IPSubject(netip.MustParseAddr("2001:db8:1:2:bbbb::9"))
	z := flashgate.IPSubject(netip.MustParseAddr("2001:db8:1:3::1"))
	if v4 != "198.18.0.7" || x != y || x == z || x != "2001:db8:1:2::/64" {
		t.Fatalf("IPSubject: %q %q %q %q", v4, x, y, z)
	}
	if flashgate.IPSubject(netip.Addr{}) != "" {
		t.Fatal("IPSubject of no address")
	}
}

func TestLimitString(t *testing.T) {
	l := flashgate.Limit{Dimension: flashgate.DimPhone, Max: 1, Of: flashgate.OfOrders, Per: flashgate.PerDay}
	if s := l.String(); s != "at most 1 order per phone per day" {
		t.Fatal(s)
	}
	l = flashgate.Limit{Dimension: flashgate.DimAddress, Max: 2, Of: flashgate.OfUnits, Per: flashgate.PerSale}
	if s := l.String(); s != "at most 2 units per address" {
		t.Fatal(s)
	}
}

// TestAddressLookAlikes: addresses that a reader takes for one, differing only by invisible
// characters (zero-width space, joiner, soft hyphen, bidi marks: Cf), combining marks (Mn), or
// look-alike letters and digits of other scripts (UTS #39 confusables), hash to one key; a
// different address does not.
func TestAddressLookAlikes(t *testing.T) {
	base, ok := flashgate.NormaliseAddress("Baker Street 221B, London")
	if !ok {
		t.Fatal("the plain address was refused")
	}
	for _, c := range []struct{ what, addr string }{
		{"zero-width space", "Baker\u200b Street 221B, Lon\u200bdon"},
		{"zero-width joiner and non-joiner", "Ba\u200dker Str\u200ceet 221B, London"},
		{"soft hyphen and word joiner", "Bak\u00ader Street 22\u20601B, London"},
		{"bidi marks", "\u202eBaker Street 221B, London\u202c\u200f"},
		{"byte order mark", "\ufeffBaker Street 221B, London"},
		{"combining acute and diaeresis", "Ba\u0301ker Stre\u0308et 221B, London"},
		{"a precomposed accent", "Bäker Street 221B, Löndon"},
		{"combining overlay", "Baker Street 2\u033621B, London"},
		{"Cyrillic а, е, о", "B\u0430k\u0435r Street 221B, L\u043endon"},
		{"Greek Ο and ο", "Baker Street 221B, L\u03bfnd\u03bfn"},
		{"digit one as letter l", "Baker Street 22lB, London"},
		{"full-width letters", "Ｂａｋｅｒ Ｓｔｒｅｅｔ 221B, London"},
		{"mathematical letters", "\U0001d401aker Street 221B, London"},
	} {
		got, ok := flashgate.NormaliseAddress(c.addr)
		if !ok || got != base {
			t.Errorf("%s: %q hashes to %q (%v), want the plain address's %q", c.what, c.addr, got, ok, base)
		}
	}
	if other, _ := flashgate.NormaliseAddress("Baker Street 222B, London"); other == base {
		t.Error("221B and 222B hash the same")
	}
	for _, bad := range []string{"\u200b\u200d\ufeff", "\u0301\u0308"} {
		if _, ok := flashgate.NormaliseAddress(bad); ok {
			t.Errorf("NormaliseAddress(%q): only invisible characters, taken", bad)
		}
	}
}
