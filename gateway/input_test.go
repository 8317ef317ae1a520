package gateway

import (
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/config"
)

func TestIPKeyIPv6By64(t *testing.T) {
	k := func(s string) [16]byte { return ipKey(netip.MustParseAddr(s)) }
	if k("2001:db8:1:2::1") != k("2001:db8:1:2:ffff:ffff:ffff:ffff") {
		t.Error("two addresses of one IPv6 /64 have different keys")
	}
	if k("2001:db8:1:2::1") == k("2001:db8:1:3::1") {
		t.Error("two IPv6 /64s share a key")
	}
	if k("192.0.2.1") == k("192.0.2.2") {
		t.Error("two IPv4 addresses share a key: IPv4 is keyed by the full address")
	}
	if k("::ffff:192.0.2.1") != k("192.0.2.1") {
		t.Error("an IPv4-mapped address is keyed apart from its IPv4 address")
	}
	if k("::ffff:192.0.2.1") == k("::ffff:192.0.2.2") {
		t.Error("IPv4-mapped addresses were masked like IPv6")
	}
}

// TestPerIPLimitKeysIPv6By64: through the trusted proxy, a buyer hopping
// between addresses of its /64 still spends one bucket; another /64 has its own.
func TestPerIPLimitKeysIPv6By64(t *testing.T) {
	e := start(t, func(c *config.Config) { c.RateLimit.PerIP = config.Rate{Rate: 0.001, Burst: 1} })
	s := e.sale(nil)
	tok := e.token("v6buyer")
	from := func(ip string) int {
		return e.buy(s, tok, `{}`, map[string]string{"X-Forwarded-For": ip}).Status
	}
	if st := from("2001:db8:aa:1::1"); st == 429 {
		t.Fatalf("first request from a /64: %d", st)
	}
	if st := from("2001:db8:aa:1:dead:beef:0:2"); st != 429 {
		t.Fatalf("second address of the same /64: %d, want 429", st)
	}
	if st := from("2001:db8:aa:2::1"); st == 429 {
		t.Fatalf("another /64 was limited: %d", st)
	}
	if st := from("198.51.100.7"); st == 429 {
		t.Fatalf("first IPv4 address: %d", st)
	}
	if st := from("198.51.100.8"); st == 429 {
		t.Fatalf("a neighbouring IPv4 address shares a bucket: %d", st)
	}
}

// TestPerNetLimitKeysIPv6By48: a host with many /64s (a /48 holds 65,536)
// meets the looser per-network tier: each /64 has per_ip to itself, but the
// third /64 of one /48 is refused per_net; another /48 is not, and IPv4
// clients have no network tier.
func TestPerNetLimitKeysIPv6By48(t *testing.T) {
	e := start(t, func(c *config.Config) {
		c.RateLimit.PerIP = config.Rate{Rate: 1000, Burst: 1000}
		c.RateLimit.PerNet = config.Rate{Rate: 0.001, Burst: 2}
	})
	s := e.sale(func(s *flashgate.Sale) { s.PerUserLimit, s.Total = 100, 100 })
	from := func(ip, user string) reply {
		return e.buy(s, e.token(user), `{}`, map[string]string{"X-Forwarded-For": ip})
	}
	for i, ip := range []string{"2001:db8:bb:1::1", "2001:db8:bb:2::1"} {
		if r := from(ip, "n"+strconv.Itoa(i)); r.Status != 202 {
			t.Fatalf("/64 number %d of the /48 (%s): %d %s", i+1, ip, r.Status, r.Raw)
		}
	}
	if r := from("2001:db8:bb:3::1", "n2"); r.Status != 429 || r.Code != string(flashgate.CodeRateLimited) {
		t.Fatalf("a third /64 of the same /48: %d %s, want 429 rate_limited", r.Status, r.Raw)
	}
	if r := from("2001:db8:cc:1::1", "n3"); r.Status != 202 {
		t.Fatalf("another /48: %d %s", r.Status, r.Raw)
	}
	for i := range 5 {
		if r := from("198.51.100."+strconv.Itoa(i+1), "v4"+strconv.Itoa(i)); r.Status != 202 {
			t.Fatalf("IPv4 client %d of one /24: %d %s", i+1, r.Status, r.Raw)
		}
	}
}

func TestParseOrderID(t *testing.T) {
	for in, want := range map[string]uint64{"1": 1, "42": 42, "18446744073709551615": 1<<64 - 1} {
		if got, ok := parseOrderID([]byte(in)); !ok || got != want {
			t.Errorf("%q: %d %v, want %d", in, got, ok, want)
		}
	}
	for _, in := range []string{"", "0", "007", "+1", "-1", "1a", " 1", "18446744073709551616", "99999999999999999999", "1.0", "٣"} {
		if got, ok := parseOrderID([]byte(in)); ok {
			t.Errorf("%q accepted as %d", in, got)
		}
	}
}

// FuzzParseOrderID: an accepted id is exactly the canonical decimal of its
// value, and every canonical decimal is accepted.
func FuzzParseOrderID(f *testing.F) {
	for _, s := range []string{"1", "0", "007", "18446744073709551615", "18446744073709551616", "-1", "+1"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		id, ok := parseOrderID(b)
		canon := false
		if n, err := strconv.ParseUint(string(b), 10, 64); err == nil && n > 0 && strconv.FormatUint(n, 10) == string(b) {
			canon = true
		}
		if ok != canon || (ok && strconv.FormatUint(id, 10) != string(b)) {
			t.Fatalf("%q: parsed %d %v, canonical %v", b, id, ok, canon)
		}
	})
}

// FuzzIPKey: the key never depends on the low 64 bits of an IPv6 address,
// and always on every bit of an IPv4 one.
func FuzzIPKey(f *testing.F) {
	f.Add([]byte{32, 1, 13, 184, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, byte(1))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1}, byte(255))
	f.Fuzz(func(t *testing.T, raw []byte, flip byte) {
		a, ok := netip.AddrFromSlice(raw)
		if !ok {
			return
		}
		b := a.As16()
		bit := int(flip) % 128
		b[bit/8] ^= 1 << (bit % 8)
		other := netip.AddrFrom16(b)
		if a.Unmap().Is4() != other.Unmap().Is4() {
			return // the flip turned one family into the other
		}
		same := ipKey(a) == ipKey(other)
		switch {
		case a.Unmap().Is4() && same:
			t.Fatalf("%v and %v share a key", a, other)
		case !a.Unmap().Is4() && bit >= 64 && !same:
			t.Fatalf("%v and %v are in one /64 but have different keys", a, other)
		case !a.Unmap().Is4() && bit < 64 && same:
			t.Fatalf("%v and %v are in different /64s but share a key", a, other)
		}
	})
}

// FuzzClientIP: whatever X-Forwarded-For and X-Real-IP say, the client is a
// valid address; an untrusted peer is the client itself; and a trusted peer's
// headers can name only an address written in them.
func FuzzClientIP(f *testing.F) {
	f.Add("127.0.0.1:5", "198.51.100.1, 203.0.113.9", "")
	f.Add("127.0.0.1:5", "203.0.113.9, garbage", "203.0.113.1")
	f.Add("192.0.2.1:5", "203.0.113.9", "203.0.113.10")
	f.Add("[::1]:5", "2001:db8::1,::ffff:10.0.0.1", "")
	f.Add("127.0.0.1:5", ",,, ,", "fe80::1%eth0")
	p, _ := parseProxies([]string{"127.0.0.1/32", "::1/128", "10.0.0.0/8"})
	f.Fuzz(func(t *testing.T, peer, xff, realIP string) {
		ap, err := netip.ParseAddrPort(peer)
		if err != nil || ap.Addr().Zone() != "" {
			return
		}
		var ctx fasthttp.RequestCtx
		ctx.Init(&fasthttp.Request{}, net.TCPAddrFromAddrPort(ap), nil)
		ctx.Request.Header.Set("X-Forwarded-For", xff)
		ctx.Request.Header.Set("X-Real-IP", realIP)
		got := p.clientIP(&ctx)
		peerIP := ap.Addr().Unmap()
		named := map[netip.Addr]bool{}
		for _, part := range append(strings.Split(string(ctx.Request.Header.Peek("X-Forwarded-For")), ","),
			string(ctx.Request.Header.Peek("X-Real-IP"))) {
			if a, err := netip.ParseAddr(strings.TrimSpace(part)); err == nil {
				named[a.Unmap()] = true
			}
		}
		switch {
		case !got.IsValid():
			t.Fatalf("peer %s XFF %q X-Real-IP %q: invalid client address", peer, xff, realIP)
		case !p.trusted(peerIP) && got != peerIP:
			t.Fatalf("untrusted peer %s was believed: %s", peer, got)
		case got != peerIP && !named[got]:
			t.Fatalf("peer %s XFF %q X-Real-IP %q: client %s is in neither header", peer, xff, realIP, got)
		}
	})
}
