package auth

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
)

// RequireAdmin guards an admin surface (the /admin/ API, pprof) of the
// gateway's and the backend's admin ports alike: a request passes only with
// "Authorization: Bearer <token>". An empty token refuses everything, so an
// unset admin token closes the surface instead of opening it. Refusals are
// the API's JSON error, 401 unauthorized.
func RequireAdmin(token string, h http.Handler) http.Handler {
	// Digests have one length: comparing them reveals nothing about the
	// token's length through timing.
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := bearer(r.Header.Get("Authorization"))
		d := sha256.Sum256([]byte(got))
		if token == "" || !ok || subtle.ConstantTimeCompare(d[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="flashgate-admin"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"code":"unauthorized","message":"admin token missing or wrong"}` + "\n"))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// bearer takes the credentials of a Bearer Authorization header (the scheme
// is case-insensitive).
func bearer(h string) (string, bool) {
	const scheme = "Bearer "
	if len(h) <= len(scheme) || !strings.EqualFold(h[:len(scheme)], scheme) {
		return "", false
	}
	return h[len(scheme):], true
}
