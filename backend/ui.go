package backend

import (
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"html/template"
	"io/fs"
	"net/http"
	"strings"

	"github.com/flashgate/flashgate"
)

// The live view: GET /ui/ is the page (ui/index.html) with every recent sale
// (live.go) in it as JSON; its script (ui/live.js) draws them, numbers, charts
// (uPlot, vendored under ui/vendor by scripts/vendor-uplot.sh) and tables,
// then polls GET /ui/live.json every second and draws again. Everything under /ui/ is behind the admin token, as a header
// (Authorization: Bearer …) or as the cookie that POST /ui/login sets from a
// form, since a browser cannot send the header by itself.

//go:embed ui
var uiFiles embed.FS

// uiCookie holds the admin token in the browser: HttpOnly (no script reads
// it), SameSite=Strict (no other site's page sends it), path /ui/.
const uiCookie = "flashgate_admin"

var uiPage = template.Must(template.ParseFS(uiFiles, "ui/index.html"))

// uiRoutes mounts the live view on mux.
func (a *adminAPI) uiRoutes(mux *http.ServeMux) {
	login, _ := fs.ReadFile(uiFiles, "ui/login.html")
	script, _ := fs.ReadFile(uiFiles, "ui/live.js")
	mux.HandleFunc("POST /ui/login", a.uiLogin)
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

// uiAuth lets a request through with the admin token as a bearer header or as
// the uiCookie; otherwise it answers 401 with loginPage (nil: the API's JSON
// error).
func (a *adminAPI) uiAuth(loginPage []byte, h http.HandlerFunc) http.Handler {
	want := sha256.Sum256([]byte(a.token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := ""
		if c, err := r.Cookie(uiCookie); err == nil {
			got = c.Value
		}
		if h := r.Header.Get("Authorization"); len(h) > 7 && strings.EqualFold(h[:7], "Bearer ") {
			got = h[7:]
		}
		d := sha256.Sum256([]byte(got))
		if a.token == "" || got == "" || subtle.ConstantTimeCompare(d[:], want[:]) != 1 {
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

// uiLogin takes the admin token from the login form and, if it is the one,
// sets it as the uiCookie and sends the browser to the view.
func (a *adminAPI) uiLogin(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxAdminBody)
	tok := r.PostFormValue("token")
	want, got := sha256.Sum256([]byte(a.token)), sha256.Sum256([]byte(tok))
	if a.token == "" || subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
		http.Redirect(w, r, "/ui/", http.StatusSeeOther) // the form again
		return
	}
	http.SetCookie(w, &http.Cookie{Name: uiCookie, Value: tok, Path: "/ui/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/ui/", http.StatusSeeOther)
}
