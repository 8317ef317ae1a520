package backend

import (
	"encoding/json"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/flashgate/flashgate/audit"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/mysql"
)

// TestViewerAndOperator: a viewer's key reads (ledger, list, audit, audit
// log) and is refused every change with 403 forbidden, which changes nothing
// and is not logged; an unknown token is 401. The operator's changes are
// logged with the key's id, the source address, and before and after.
func TestViewerAndOperator(t *testing.T) {
	t.Parallel()
	viewer := testenv.Secret("viewer-")
	s := start(t, testenv.RedisAddrs(), func(c *config.Config) {
		c.Admin.Keys = []config.AdminKey{{ID: "ann", Role: config.RoleViewer, Token: viewer}}
	})
	op := s.cfg.Admin.Token
	id := testenv.ID("roles")
	cleanRedisID(t, s.rc, id)
	if status, body := s.call("POST", "/admin/v1/sales", viewer, saleBody(id, 10, 1, "")); status != 403 || body["code"] != "forbidden" {
		t.Fatalf("viewer creates: %d %v", status, body)
	}
	if status, body := s.call("POST", "/admin/v1/sales", op, saleBody(id, 10, 1, "")); status != 201 {
		t.Fatalf("operator creates: %d %v", status, body)
	}
	path := "/admin/v1/sales/" + id
	for _, c := range []struct{ method, path, body string }{
		{"POST", path + "/pause", ""}, {"POST", path + "/resume", ""}, {"POST", path + "/close", ""},
		{"POST", path + "/reconcile", ""}, {"PATCH", path, `{"total":20}`},
	} {
		if status, body := s.call(c.method, c.path, viewer, c.body); status != 403 || body["code"] != "forbidden" {
			t.Errorf("viewer %s %s: %d %v, want 403 forbidden", c.method, c.path, status, body)
		}
		if status, _ := s.call(c.method, c.path, "not-a-key-of-this-backend", c.body); status != 401 {
			t.Errorf("unknown token %s %s: %d, want 401", c.method, c.path, status)
		}
	}
	for _, p := range []string{path, "/admin/v1/sales", path + "/audit", "/admin/v1/audit-log?sale=" + id} {
		if status, body := s.call("GET", p, viewer, ""); status != 200 {
			t.Errorf("viewer GET %s: %d %v", p, status, body)
		}
	}
	if st := s.queryInt(`SELECT paused FROM sales WHERE id = ?`, id); st != 0 {
		t.Fatalf("a viewer's pause paused the sale")
	}
	if status, body := s.call("PATCH", path, op, `{"total":20}`); status != 200 {
		t.Fatalf("operator update: %d %v", status, body)
	}
	entries := auditLog(t, s, id)
	if len(entries) != 2 || entries[0].Action != "update" || entries[1].Action != "create" {
		t.Fatalf("audit log of %s: %+v", id, entries)
	}
	u := entries[0]
	var before, after struct{ Total int64 }
	if json.Unmarshal(u.Before, &before) != nil || json.Unmarshal(u.After, &after) != nil || before.Total != 10 || after.Total != 20 {
		t.Errorf("update before %s after %s, want total 10 then 20", u.Before, u.After)
	}
	if u.KeyID != config.DefaultAdminKeyID || u.Role != config.RoleOperator || u.Source != "127.0.0.1" || u.At.IsZero() {
		t.Errorf("update entry %+v", u)
	}
	if len(entries[1].Before) != 0 || len(entries[1].After) == 0 {
		t.Errorf("create's before: %s", entries[1].Before)
	}
}

func auditLog(t *testing.T, s *started, sale string) []mysql.AdminChange {
	t.Helper()
	entries, err := mysql.AdminChanges(ctx(t), s.db, sale, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	return entries
}

// TestPauseResume: a paused sale's admissions answer paused and reserve
// nothing (stock, buyers and reservations as they were); the pause is in
// MySQL, so a rebuild of Redis from it keeps it; gateways are told; resume
// sells again. Both are in the audit log with before and after.
func TestPauseResume(t *testing.T) {
	t.Parallel()
	s := start(t, testenv.RedisAddrs(), nil)
	op := s.cfg.Admin.Token
	events := make(chan bus.SaleEvent, 16)
	sub, err := bus.SubscribeEvents(s.nc, s.cfg.NATS, func(ev bus.SaleEvent) { events <- ev })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := s.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	id := testenv.ID("pause")
	cleanRedisID(t, s.rc, id)
	if status, body := s.call("POST", "/admin/v1/sales", op, saleBody(id, 10, 2, "")); status != 201 {
		t.Fatalf("create: %d %v", status, body)
	}
	nextEvent(t, events)
	k := lua.KeysFor(id, nil)
	sc := lua.Load()
	try := func(user string) lua.Outcome {
		t.Helper()
		now := time.Now()
		a, err := sc.Admit(ctx(t), s.rc, k, lua.AdmitArgs{User: user, Quantity: 1, OrderID: nextID.Add(1), Now: now, PayBy: now.Add(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		return a.Outcome
	}
	if status, body := s.call("POST", "/admin/v1/sales/"+id+"/pause", op, ""); status != 200 || body["paused"] != true {
		t.Fatalf("pause: %d %v", status, body)
	}
	if ev := nextEvent(t, events); ev.Type != bus.EventPaused || ev.SaleID != id {
		t.Errorf("event %+v, want paused", ev)
	}
	for _, u := range []string{"u1", "u2", "u1"} {
		if got := try(u); got != lua.Paused {
			t.Fatalf("admission of %s while paused: %v", u, got)
		}
	}
	red, err := audit.RedisLedger(ctx(t), s.rc, id, nil)
	if err != nil {
		t.Fatal(err)
	}
	if red.Remaining != 10 || red.Reserved != 0 || red.Reservations != 0 {
		t.Fatalf("paused sale's Redis: %+v, want 10 remaining and nothing reserved", red)
	}
	if n, err := s.rc.Do(ctx(t), s.rc.B().Hlen().Key(k.Users).Build()).AsInt64(); err != nil || n != 0 {
		t.Fatalf("buyers counted while paused: %d %v", n, err)
	}
	if p := s.queryInt(`SELECT paused FROM sales WHERE id = ?`, id); p != 1 {
		t.Fatalf("MySQL paused = %d", p)
	}
	// Redis is derived: the one rebuild reads the pause from MySQL.
	if _, err := s.warmer.rebuild(ctx(t), id, nil); err != nil {
		t.Fatal(err)
	}
	if v, err := s.rc.Do(ctx(t), s.rc.B().Hget().Key(k.Meta).Field("paused").Build()).ToString(); err != nil || v != "1" {
		t.Fatalf("meta paused after a rebuild: %q %v", v, err)
	}
	if got := try("u3"); got != lua.Paused {
		t.Fatalf("admission after the rebuild: %v", got)
	}
	// A change of the spec keeps the pause (it rewrites the meta from MySQL's row).
	if status, body := s.call("PATCH", "/admin/v1/sales/"+id, op, `{"total":12}`); status != 200 || body["paused"] != true {
		t.Fatalf("update of the paused sale: %d %v", status, body)
	}
	if ev := nextEvent(t, events); ev.Type != bus.EventCreated || ev.Sale == nil || !ev.Sale.Paused {
		t.Errorf("the update's event %+v: gateways must learn the new spec still paused", ev)
	}
	if got := try("u3"); got != lua.Paused {
		t.Fatalf("admission after an update: %v", got)
	}
	if status, body := s.call("POST", "/admin/v1/sales/"+id+"/resume", op, ""); status != 200 || body["paused"] == true {
		t.Fatalf("resume: %d %v", status, body)
	}
	if ev := nextEvent(t, events); ev.Type != bus.EventResumed {
		t.Errorf("event %+v, want resumed", ev)
	}
	if got := try("u1"); got != lua.Admitted {
		t.Fatalf("admission after resume: %v", got)
	}
	entries := auditLog(t, s, id)
	if len(entries) != 4 || entries[0].Action != "resume" || entries[1].Action != "update" || entries[2].Action != "pause" {
		t.Fatalf("audit log: %+v", entries)
	}
	if string(entries[2].Before) != `{"paused":false,"closed":false}` || string(entries[2].After) != `{"paused":true,"closed":false}` ||
		string(entries[0].Before) != `{"paused":true,"closed":false}` || string(entries[0].After) != `{"paused":false,"closed":false}` {
		t.Errorf("pause %s → %s, resume %s → %s", entries[2].Before, entries[2].After, entries[0].Before, entries[0].After)
	}
}

// TestLiveViewSession: logging in to the live view opens a server-side
// session whose random id, not the token, is the cookie; the cookie opens
// the view until logout ends the session, after which the same cookie is
// refused. A viewer's key may log in; a wrong token opens nothing.
func TestLiveViewSession(t *testing.T) {
	t.Parallel()
	viewer := testenv.Secret("viewer-")
	s := start(t, testenv.RedisAddrs(), func(c *config.Config) {
		c.Admin.Keys = []config.AdminKey{{ID: "ann", Role: config.RoleViewer, Token: viewer}}
	})
	base := "http://" + s.b.AdminAddr()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	login := func(tok string) *http.Cookie {
		t.Helper()
		res, err := noRedirect.PostForm(base+"/ui/login", url.Values{"token": {tok}})
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusSeeOther {
			t.Fatalf("login: %d", res.StatusCode)
		}
		for _, c := range res.Cookies() {
			if c.Name == uiCookie {
				return c
			}
		}
		return nil
	}
	get := func(c *http.Cookie) int {
		t.Helper()
		req, _ := http.NewRequest("GET", base+"/ui/live.json", nil)
		if c != nil {
			req.AddCookie(c)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if c := login("wrong"); c != nil {
		t.Fatalf("a wrong token got a cookie: %v", c)
	}
	for _, tok := range []string{s.cfg.Admin.Token, viewer} {
		c := login(tok)
		if c == nil || c.Value == tok || len(c.Value) != 64 || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode {
			t.Fatalf("session cookie %+v", c)
		}
		if st := get(c); st != 200 {
			t.Fatalf("live.json with the session: %d", st)
		}
		if st := get(&http.Cookie{Name: uiCookie, Value: tok}); st != 401 {
			t.Fatalf("live.json with the token as the cookie: %d", st)
		}
		req, _ := http.NewRequest("POST", base+"/ui/logout", nil)
		req.AddCookie(c)
		res, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusSeeOther {
			t.Fatalf("logout: %d", res.StatusCode)
		}
		if st := get(c); st != 401 {
			t.Fatalf("live.json after logout: %d", st)
		}
	}
}

// TestLiveViewActions: the live view's buttons act with the session alone.
// live.json tells the page its role and its session's CSRF token; a POST to
// /ui/sales/{sale}/pause with the cookie but without that token, with another
// session's token, or from another origin is refused and changes nothing; a
// viewer's session is refused with 403 forbidden; an operator's pauses the
// sale and the audit log records it under the key that logged in. A bearer
// token's view carries a role and no CSRF token.
func TestLiveViewActions(t *testing.T) {
	t.Parallel()
	viewer := testenv.Secret("viewer-")
	s := start(t, testenv.RedisAddrs(), func(c *config.Config) {
		c.Admin.Keys = []config.AdminKey{{ID: "ann", Role: config.RoleViewer, Token: viewer}}
	})
	op := s.cfg.Admin.Token
	id := testenv.ID("uiact")
	cleanRedisID(t, s.rc, id)
	if status, body := s.call("POST", "/admin/v1/sales", op, saleBody(id, 10, 1, "")); status != 201 {
		t.Fatalf("create: %d %v", status, body)
	}
	base := "http://" + s.b.AdminAddr()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	type session struct {
		cookie     *http.Cookie
		role, csrf string
	}
	login := func(tok string) session {
		t.Helper()
		res, err := noRedirect.PostForm(base+"/ui/login", url.Values{"token": {tok}})
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		var se session
		for _, c := range res.Cookies() {
			if c.Name == uiCookie {
				se.cookie = c
			}
		}
		if se.cookie == nil {
			t.Fatalf("login: %d, no cookie", res.StatusCode)
		}
		req, _ := http.NewRequest("GET", base+"/ui/live.json", nil)
		req.AddCookie(se.cookie)
		res, err = http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var v struct{ Role, CSRF string }
		if res.StatusCode != 200 || json.NewDecoder(res.Body).Decode(&v) != nil {
			t.Fatalf("live.json: %d", res.StatusCode)
		}
		se.role, se.csrf = v.Role, v.CSRF
		return se
	}
	act := func(se session, action, csrf, origin string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", base+"/ui/sales/"+id+"/"+action, nil)
		req.AddCookie(se.cookie)
		if csrf != "" {
			req.Header.Set("X-CSRF-Token", csrf)
		}
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var b struct{ Code string }
		_ = json.NewDecoder(res.Body).Decode(&b)
		return res.StatusCode, b.Code
	}
	opS, viewS := login(op), login(viewer)
	if opS.role != config.RoleOperator || viewS.role != config.RoleViewer || len(opS.csrf) != 64 || opS.csrf == viewS.csrf {
		t.Fatalf("live.json: operator role %q csrf %q, viewer role %q csrf %q", opS.role, opS.csrf, viewS.role, viewS.csrf)
	}
	for _, c := range []struct {
		name         string
		se           session
		csrf, origin string
		status       int
		code         string
	}{
		{"no CSRF token", opS, "", "", 403, "forbidden"},
		{"another session's CSRF token", opS, viewS.csrf, "", 403, "forbidden"},
		{"another origin", opS, opS.csrf, "https://evil.example", 403, "forbidden"},
		{"a viewer", viewS, viewS.csrf, "", 403, "forbidden"},
	} {
		if st, code := act(c.se, "pause", c.csrf, c.origin); st != c.status || code != c.code {
			t.Errorf("%s: %d %s, want %d %s", c.name, st, code, c.status, c.code)
		}
	}
	if st := s.queryInt(`SELECT paused FROM sales WHERE id = ?`, id); st != 0 {
		t.Fatalf("a refused button paused the sale")
	}
	if st, code := act(opS, "pause", opS.csrf, base); st != 200 {
		t.Fatalf("operator's pause: %d %s", st, code)
	}
	if st := s.queryInt(`SELECT paused FROM sales WHERE id = ?`, id); st != 1 {
		t.Fatalf("the operator's button did not pause the sale")
	}
	if st, code := act(opS, "explode", opS.csrf, ""); st != 404 {
		t.Errorf("unknown action: %d %s", st, code)
	}
	entries := auditLog(t, s, id)
	if len(entries) < 2 || entries[0].Action != "pause" || entries[0].KeyID != config.DefaultAdminKeyID {
		t.Fatalf("audit log: %+v", entries)
	}
	// A bearer token's view: its role, no CSRF token (it needs none).
	req, _ := http.NewRequest("GET", base+"/ui/live.json", nil)
	req.Header.Set("Authorization", "Bearer "+viewer)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var v map[string]any
	if json.NewDecoder(res.Body).Decode(&v) != nil || v["role"] != config.RoleViewer || v["csrf"] != nil {
		t.Fatalf("bearer live.json: role %v csrf %v", v["role"], v["csrf"])
	}
}
