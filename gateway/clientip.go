package gateway

import (
	"bytes"
	"net"
	"net/netip"
	"unsafe"

	"github.com/valyala/fasthttp"
)

// proxies decides whom to believe about the client's address: a request's
// X-Forwarded-For and X-Real-IP count only when the peer that sent it is a
// trusted proxy (nginx); anyone else is the client, whatever headers it sends.
type proxies []netip.Prefix

func parseProxies(cidrs []string) (proxies, error) {
	p := make(proxies, 0, len(cidrs))
	for _, c := range cidrs {
		pr, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, err
		}
		p = append(p, pr.Masked())
	}
	return p, nil
}

func (p proxies) trusted(a netip.Addr) bool {
	for _, pr := range p {
		if pr.Contains(a) {
			return true
		}
	}
	return false
}

var (
	hdrXFF    = []byte("X-Forwarded-For")
	hdrRealIP = []byte("X-Real-IP")
)

// clientIP is the buyer's address. From a trusted proxy: the right-most
// X-Forwarded-For entry that is not itself a trusted proxy (entries further
// left were written by the client and prove nothing), else X-Real-IP; from
// anyone else: the socket's address. It does not allocate.
func (p proxies) clientIP(ctx *fasthttp.RequestCtx) netip.Addr {
	peer := peerAddr(ctx.RemoteAddr())
	if len(p) == 0 || !p.trusted(peer) {
		return peer
	}
	xff := ctx.Request.Header.PeekBytes(hdrXFF)
	for len(xff) > 0 {
		i := bytes.LastIndexByte(xff, ',')
		part := bytes.TrimSpace(xff[i+1:])
		xff = xff[:max(i, 0)]
		a, err := netip.ParseAddr(unsafeString(part))
		if err != nil {
			break // a malformed hop: trust nothing further left
		}
		if a = a.Unmap(); !p.trusted(a) {
			return a
		}
	}
	if r := bytes.TrimSpace(ctx.Request.Header.PeekBytes(hdrRealIP)); len(r) > 0 {
		if a, err := netip.ParseAddr(unsafeString(r)); err == nil {
			return a.Unmap()
		}
	}
	return peer
}

func peerAddr(a net.Addr) netip.Addr {
	if t, ok := a.(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(t.IP)
		return ip.Unmap()
	}
	return netip.Addr{}
}

// unsafeString views b as a string for a parse that does not keep it.
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// netKey is the per-network limiter's key of an IPv6 client: its /48. An IPv4
// client has none (false): a /24 may be one carrier's NAT for a city.
func netKey(a netip.Addr) ([16]byte, bool) {
	if !a.Is6() || a.Is4In6() {
		return [16]byte{}, false
	}
	k := a.As16()
	clear(k[6:])
	return k, true
}

// ipKey is the per-IP limiter's key of a: an IPv4 client by its address, an
// IPv6 client by its /64. One IPv6 subscriber is given a whole /64 (often more),
// so keying by the full address would give one buyer 2^64 buckets.
func ipKey(a netip.Addr) [16]byte {
	k := a.Unmap().As16()
	if a.Is6() && !a.Is4In6() {
		clear(k[8:])
	}
	return k
}
