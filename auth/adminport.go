package auth

import (
	"encoding/json"
	"net"
	"net/http"
	"strings"
)

// AdminPort wraps the whole of an admin port (the backend's and the
// gateway's) with what holds before any route or key is looked at
// (docs/security.md, "The admin ports"):
//
//   - Host (but for the probes, /metrics and /openapi.json) must be one of allowed (admin.allowed_hosts: host, or host:port),
//     or, when none is configured, the port's listen address or a loopback
//     name (localhost, 127.0.0.1, [::1]) on its port. Anything else is
//     answered 421 misdirected_request: a page of another site whose name
//     was rebound to this address (DNS rebinding) is not served.
//   - A browser's Origin, when sent, must be http(s):// + the request's own
//     (allowed) Host, else 403 forbidden: another page can neither read nor
//     act, whatever cookie or method.
//   - Every answer forbids framing (Content-Security-Policy
//     frame-ancestors 'none', X-Frame-Options DENY) and type sniffing.
func AdminPort(h http.Handler, listen string, allowed []string) http.Handler {
	ok := hostSet(listen, allowed)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "frame-ancestors 'none'")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("X-Content-Type-Options", "nosniff")
		host := strings.ToLower(r.Host)
		if probe[r.URL.Path] && r.Method == http.MethodGet {
			h.ServeHTTP(w, r) // orchestrators and Prometheus reach these by any address
			return
		}
		if !ok[host] {
			refuse(w, http.StatusMisdirectedRequest, "misdirected_request", "this admin port does not answer for Host "+quoteHost(r.Host))
			return
		}
		if o := r.Header.Get("Origin"); o != "" && !strings.EqualFold(o, "http://"+host) && !strings.EqualFold(o, "https://"+host) {
			refuse(w, http.StatusForbidden, "forbidden", "cross-origin request refused")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// probe are the paths an orchestrator or Prometheus reads by whatever address
// it finds the process at (a pod's IP): they need no key and reveal counts,
// not orders, so no Host check guards them.
var probe = map[string]bool{"/healthz": true, "/readyz": true, "/metrics": true, "/openapi.json": true}

// hostSet is every Host header value AdminPort accepts.
func hostSet(listen string, allowed []string) map[string]bool {
	set := map[string]bool{}
	if len(allowed) > 0 {
		for _, a := range allowed {
			set[strings.ToLower(a)] = true
		}
		return set
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return set
	}
	names := []string{"localhost", "127.0.0.1", "::1"}
	if host != "" && host != "0.0.0.0" && host != "::" {
		names = append(names, host)
	}
	for _, n := range names {
		hp := net.JoinHostPort(n, port)
		set[strings.ToLower(hp)] = true
		if port == "80" {
			set[strings.ToLower(strings.TrimSuffix(hp, ":80"))] = true
		}
	}
	return set
}

// quoteHost bounds what a refusal repeats of a client's Host.
func quoteHost(h string) string {
	if len(h) > 64 {
		h = h[:64]
	}
	return `"` + strings.Map(func(r rune) rune {
		if r < 0x20 || r == '"' || r == '\\' || r > 0x7e {
			return '?'
		}
		return r
	}, h) + `"`
}

func refuse(w http.ResponseWriter, status int, code, msg string) {
	b, _ := json.Marshal(map[string]string{"code": code, "message": msg})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
