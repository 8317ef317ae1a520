package backend

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"html/template"
	"io/fs"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/config"
)

// The live view: GET /ui/ is the page (ui/index.html) with every recent sale
// (live.go) in it as JSON; its script (ui/live.js) draws them, numbers, charts
// (uPlot, vendored under ui/vendor by scripts/vendor-uplot.sh) and tables,
// then polls GET /ui/live.json every second and draws again. Everything under
// /ui/ is behind an admin key: its token as a header (Authorization: Bearer …)
// or the session cookie that POST /ui/login sets from a form, since a browser
// cannot send the header by itself. The page's sale-day buttons POST to
// /ui/sales/{sale}/{action} with that cookie and the session's CSRF token
// (live.json carries it) in the X-CSRF-Token header: the same handlers as the
// admin API's, recorded in the audit log under the key that logged in.

//go:embed ui
var uiFiles embed.FS

// uiCookie holds a session id in the browser, never the token: HttpOnly (no
// script reads it), SameSite=Strict (no other site's page sends it), path /ui/.
const uiCookie = "flashgate_admin"

var uiPage = template.Must(template.ParseFS(uiFiles, "ui/index.html"))

// uiRoutes mounts the live view on mux.
func (a *adminAPI) uiRoutes(mux *http.ServeMux) {
	login, _ := fs.ReadFile(uiFiles, "ui/login.html")
	script, _ := fs.ReadFile(uiFiles, "ui/live.js")
	mux.HandleFunc("POST /ui/login", a.uiLogin)
	mux.HandleFunc("POST /ui/logout", a.uiLogout)
	mux.Handle("GET /ui/live.js", a.uiAuth(login, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
		_, _ = w.Write(script)
	}))
	vendor, _ := fs.Sub(uiFiles, "ui/vendor")
	mux.Handle("GET /ui/vendor/{file...}", a.uiAuth(nil, func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("file")
		if st, err := fs.Stat(vendor, name); err != nil || st.IsDir() {
			http.NotFound(w, r)
			return
		}
		http.ServeFileFS(w, r, vendor, name)
	}))
	mux.Handle("GET /ui/live.json", a.uiAuth(nil, func(w http.ResponseWriter, r *http.Request) {
		v, err := a.uiView(r)
		if err != nil {
			writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, err.Error())
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		writeJSON(w, http.StatusOK, v)
	}))
	mux.HandleFunc("POST /ui/sales/{sale}/{action}", a.uiAct)
	mux.Handle("GET /ui/{$}", a.uiAuth(login, func(w http.ResponseWriter, r *http.Request) {
		v, err := a.uiView(r)
		if err != nil {
			http.Error(w, "live view: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if err := uiPage.Execute(w, v); err != nil {
			a.log.Warn("live view", "err", err)
		}
	}))
	mux.Handle("GET /ui", http.RedirectHandler("/ui/", http.StatusMovedPermanently))
}

// uiView is the live view with what the caller may do: its role, and the
// CSRF token of its session (none for a bearer token, which needs none).
type uiView struct {
	LiveView
	Role string `json:"role"`
	CSRF string `json:"csrf,omitempty"`
}

func (a *adminAPI) uiView(r *http.Request) (uiView, error) {
	v, err := a.liveSnaps.view(r.Context())
	who, _ := r.Context().Value(uiWhoKey{}).(uiSession)
	return uiView{LiveView: v, Role: who.actor.Role, CSRF: who.csrf}, err
}

// uiWhoKey carries the caller's uiSession (for a bearer token, one with its
// actor and no CSRF token) from uiAuth to the handler.
type uiWhoKey struct{}

// uiAuth lets a request through with an admin key's token as a bearer header
// (any role: the view is a viewer's) or with the uiCookie of a live session;
// otherwise it answers 401 with loginPage (nil: the API's JSON error).
func (a *adminAPI) uiAuth(loginPage []byte, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var who uiSession
		ok := false
		if hd := r.Header.Get("Authorization"); len(hd) > 7 && strings.EqualFold(hd[:7], "Bearer ") {
			who.actor, ok = a.keys.Lookup(hd[7:])
		} else if c, err := r.Cookie(uiCookie); err == nil {
			who, ok = a.sessions.get(c.Value)
		}
		if !ok {
			if loginPage == nil {
				writeError(w, http.StatusUnauthorized, flashgate.CodeUnauthorized, "admin token missing or wrong")
				return
			}
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write(loginPage)
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), uiWhoKey{}, who)))
	})
}

// uiActions are the sale-day actions the live view's buttons take, each the
// admin API's handler of POST /admin/v1/sales/{sale}/{action}.
func (a *adminAPI) uiActions() map[string]http.HandlerFunc {
	return map[string]http.HandlerFunc{"pause": a.pauseSale, "resume": a.resumeSale,
		"reconcile": a.reconcileSale, "close": a.closeSale}
}

// uiAct is a button of the live view: POST /ui/sales/{sale}/{action} with
// the session cookie. The cookie alone is not enough, since a browser sends
// it with any request to this origin: the request must also carry the
// session's CSRF token in X-CSRF-Token (a page of another origin cannot read
// live.json to learn it), and a browser's Origin, when sent, must be this
// host. Then the session's key needs the operator role, as on the API.
func (a *adminAPI) uiAct(w http.ResponseWriter, r *http.Request) {
	c, err := r.Cookie(uiCookie)
	if err != nil {
		writeError(w, http.StatusUnauthorized, flashgate.CodeUnauthorized, "no live view session: log in at /ui/")
		return
	}
	who, ok := a.sessions.get(c.Value)
	if !ok {
		writeError(w, http.StatusUnauthorized, flashgate.CodeUnauthorized, "the live view session ended: log in at /ui/")
		return
	}
	if o := r.Header.Get("Origin"); o != "" && o != "http://"+r.Host && o != "https://"+r.Host {
		writeError(w, http.StatusForbidden, flashgate.CodeForbidden, "cross-origin request from "+o)
		return
	}
	if got := r.Header.Get("X-CSRF-Token"); subtle.ConstantTimeCompare([]byte(got), []byte(who.csrf)) != 1 {
		writeError(w, http.StatusForbidden, flashgate.CodeForbidden, "X-CSRF-Token missing or not this session's")
		return
	}
	h, ok := a.uiActions()[r.PathValue("action")]
	if !ok {
		writeError(w, http.StatusNotFound, "not_found", "no such action: "+r.PathValue("action"))
		return
	}
	if !who.actor.Can(config.RoleOperator) {
		auth.Forbidden(w, who.actor, config.RoleOperator)
		return
	}
	h(w, r.WithContext(auth.WithActor(r.Context(), who.actor)))
}

// uiLogin takes an admin key's token from the login form and, if it is one,
// opens a session (uiSessions) and sets its id, never the token, as the
// uiCookie, then sends the browser to the view.
func (a *adminAPI) uiLogin(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxAdminBody)
	actor, ok := a.keys.Lookup(r.PostFormValue("token"))
	if !ok {
		http.Redirect(w, r, "/ui/", http.StatusSeeOther) // the form again
		return
	}
	id, err := a.sessions.open(actor)
	if err != nil {
		http.Error(w, "session: "+err.Error(), http.StatusInternalServerError)
		return
	}
	a.log.Info("live view session opened", "key", actor.KeyID, "source", r.RemoteAddr)
	http.SetCookie(w, &http.Cookie{Name: uiCookie, Value: id, Path: "/ui/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, MaxAge: int(uiSessionTTL / time.Second)})
	http.Redirect(w, r, "/ui/", http.StatusSeeOther)
}

// uiLogout ends the cookie's session (here, whatever the browser does with
// the cookie) and clears the cookie.
func (a *adminAPI) uiLogout(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(uiCookie); err == nil {
		a.sessions.close(c.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: uiCookie, Value: "", Path: "/ui/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, MaxAge: -1})
	http.Redirect(w, r, "/ui/", http.StatusSeeOther)
}

// uiSessionTTL is how long a live view session lasts from its login.
const uiSessionTTL = 12 * time.Hour

// uiSessions are the live view's sessions, in this backend's memory: a
// random id (256 bits) the cookie carries, the key that logged in, and an
// expiry. A restart of the backend ends them (one logs in again).
type uiSessions struct {
	mu sync.Mutex
	m  map[string]uiSession
}

type uiSession struct {
	actor   auth.Actor
	csrf    string // what the page sends back in X-CSRF-Token
	expires time.Time
}

func (s *uiSessions) open(actor auth.Actor) (string, error) {
	var b [64]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	id, csrf := hex.EncodeToString(b[:32]), hex.EncodeToString(b[32:])
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]uiSession{}
	}
	for k, v := range s.m { // forget the expired ones
		if !now.Before(v.expires) {
			delete(s.m, k)
		}
	}
	s.m[id] = uiSession{actor: actor, csrf: csrf, expires: now.Add(uiSessionTTL)}
	return id, nil
}

func (s *uiSessions) get(id string) (uiSession, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[id]
	if !ok || !time.Now().Before(v.expires) {
		delete(s.m, id)
		return uiSession{}, false
	}
	return v, true
}

func (s *uiSessions) close(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, id)
}
