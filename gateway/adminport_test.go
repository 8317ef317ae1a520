package gateway

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestGatewayAdminPortHygiene: the gateway's admin port answers only its own
// Host names (421 otherwise), refuses a foreign Origin (403), forbids
// framing, caps pprof's seconds, and its connections have read, write and
// idle deadlines.
func TestGatewayAdminPortHygiene(t *testing.T) {
	e := start(t)
	tok := e.cfg.Admin.Token
	addr := e.g.AdminAddr()
	port := addr[strings.LastIndexByte(addr, ':'):]
	get := func(path string, hdr map[string]string) (int, http.Header, string) {
		req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		for k, v := range hdr {
			if k == "Host" {
				req.Host = v
			} else {
				req.Header.Set(k, v)
			}
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, res.Header, string(b)
	}
	for _, c := range []struct {
		name, path string
		hdr        map[string]string
		want       int
	}{
		{"own address", "/admin/v1/limits", nil, 200},
		{"localhost", "/admin/v1/limits", map[string]string{"Host": "localhost" + port}, 200},
		{"rebound name", "/admin/v1/limits", map[string]string{"Host": "attacker.example" + port}, 421},
		{"rebound name, pprof", "/debug/pprof/", map[string]string{"Host": "attacker.example"}, 421},
		{"foreign Origin", "/admin/v1/limits", map[string]string{"Origin": "http://attacker.example"}, 403},
		{"probe by a pod address", "/readyz", map[string]string{"Host": "10.0.0.7" + port}, 200},
		{"pprof over the cap", "/debug/pprof/profile?seconds=3600", nil, 400},
		{"trace over the cap", "/debug/pprof/trace?seconds=120", nil, 400},
	} {
		begun := time.Now()
		st, h, body := get(c.path, c.hdr)
		if st != c.want || time.Since(begun) > 5*time.Second {
			t.Errorf("%s: %d %.100q in %v, want %d", c.name, st, body, time.Since(begun), c.want)
		}
		if h.Get("Content-Security-Policy") != "frame-ancestors 'none'" || h.Get("X-Frame-Options") != "DENY" {
			t.Errorf("%s: framing headers %q %q", c.name, h.Get("Content-Security-Policy"), h.Get("X-Frame-Options"))
		}
	}
	if s := e.g.admin; s.ReadTimeout <= 0 || s.WriteTimeout <= 0 || s.IdleTimeout <= 0 || s.ReadHeaderTimeout <= 0 {
		t.Errorf("admin server timeouts: read %v write %v idle %v header %v; want all set",
			s.ReadTimeout, s.WriteTimeout, s.IdleTimeout, s.ReadHeaderTimeout)
	}
}
