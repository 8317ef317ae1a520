package backend

import (
	"crypto/rand"
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
)

// The live view: GET /ui/ is the page (ui/index.html) with every recent sale
// (live.go) in it as JSON; its script (ui/live.js) draws them, numbers, charts
// (uPlot, vendored under ui/vendor by scripts/vendor-uplot.sh) and tables,
// then polls GET /ui/live.json every second and draws again. Everything under /ui/ is behind the admin token, as a header
// (Authorization: Bearer …) or as the cookie that POST /ui/login sets from a
// form, since a browser cannot send the header by itself.

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
		v, err := a.live.view(r.Context())
		if err != nil {
			writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, err.Error())
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		writeJSON(w, http.StatusOK, v)
	}))
	mux.Handle("GET /ui/{$}", a.uiAuth(login, func(w http.ResponseWriter, r *http.Request) {
		v, err := a.live.view(r.Context())
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

// uiAuth lets a request through with an admin key's token as a bearer header
// (any role: the view is a viewer's) or with the uiCookie of a live session;
// otherwise it answers 401 with loginPage (nil: the API's JSON error).
func (a *adminAPI) uiAuth(loginPage []byte, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ok := false
		if hd := r.Header.Get("Authorization"); len(hd) > 7 && strings.EqualFold(hd[:7], "Bearer ") {
			_, ok = a.keys.Lookup(hd[7:])
		} else if c, err := r.Cookie(uiCookie); err == nil {
			_, ok = a.sessions.get(c.Value)
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
		h(w, r)
	})
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
	expires time.Time
}

func (s *uiSessions) open(actor auth.Actor) (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	id := hex.EncodeToString(b[:])
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
	s.m[id] = uiSession{actor: actor, expires: now.Add(uiSessionTTL)}
	return id, nil
}

func (s *uiSessions) get(id string) (auth.Actor, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[id]
	if !ok || !time.Now().Before(v.expires) {
		delete(s.m, id)
		return auth.Actor{}, false
	}
	return v.actor, true
}

func (s *uiSessions) close(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, id)
}
