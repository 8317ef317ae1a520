package gateway

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/flashgate/flashgate/config"
)

// admin GETs path on the admin port with token ("": no Authorization).
func (e *env) admin(path, token string) (int, string) {
	e.t.Helper()
	req, _ := http.NewRequest("GET", "http://"+e.g.AdminAddr()+path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// TestAdminPortGuarded: pprof and /admin/* need the admin token; the probes
// and /metrics stay open.
func TestAdminPortGuarded(t *testing.T) {
	e := start(t)
	tok := e.cfg.Admin.Token
	for _, c := range []struct {
		path, token string
		status      int
	}{
		{"/healthz", "", 200},
		{"/readyz", "", 200},
		{"/metrics", "", 200},
		{"/admin/v1/limits", "", 401},
		{"/admin/v1/limits", "wrong", 401},
		{"/admin/v1/limits", tok + "x", 401},
		{"/admin/v1/limits", tok, 200},
		{"/admin/v1/nosuch", "", 401},
		{"/admin/v1/nosuch", tok, 404},
		{"/debug/pprof/", "", 401},
		{"/debug/pprof/cmdline", "", 401},
		{"/debug/pprof/heap?debug=1", "wrong", 401},
		{"/debug/pprof/profile?seconds=1", "", 401},
		{"/debug/pprof/", tok, 200},
		{"/debug/pprof/goroutine?debug=1", tok, 200},
	} {
		st, body := e.admin(c.path, c.token)
		if st != c.status {
			t.Errorf("GET %s (token %q): %d %.80q, want %d", c.path, c.token, st, body, c.status)
		}
		if st == 401 && !strings.Contains(body, `"code":"unauthorized"`) {
			t.Errorf("GET %s: 401 body %q", c.path, body)
		}
	}
	// Other spellings of the header.
	req, _ := http.NewRequest("GET", "http://"+e.g.AdminAddr()+"/debug/pprof/", nil)
	req.Header.Set("Authorization", tok)
	if res, err := http.DefaultClient.Do(req); err != nil || res.StatusCode != 401 {
		t.Fatalf("the token without the Bearer scheme: %v %v", res, err)
	}
	req.Header.Set("Authorization", "bearer "+tok)
	if res, err := http.DefaultClient.Do(req); err != nil || res.StatusCode != 200 {
		t.Fatalf("scheme in lower case: %v %v", res, err)
	}
}

// TestAdminPortClosedWithoutToken: no admin token configured closes pprof and
// the admin API instead of opening them.
func TestAdminPortClosedWithoutToken(t *testing.T) {
	e := start(t, func(c *config.Config) { c.Admin.Token = "" })
	for _, path := range []string{"/admin/v1/limits", "/debug/pprof/"} {
		if st, _ := e.admin(path, ""); st != 401 {
			t.Errorf("%s without a configured token: %d", path, st)
		}
	}
	req, _ := http.NewRequest("GET", "http://"+e.g.AdminAddr()+"/debug/pprof/", nil)
	req.Header.Set("Authorization", "Bearer ")
	if res, err := http.DefaultClient.Do(req); err != nil || res.StatusCode != 401 {
		t.Fatalf("an empty bearer against an empty token: %v %v", res, err)
	}
	if st, _ := e.admin("/metrics", ""); st != 200 {
		t.Errorf("/metrics: %d", st)
	}
}
