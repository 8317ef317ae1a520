package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/flashgate/flashgate/config"
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

// adminKey is one admin credential as the guard knows it: its id, role and
// the digest of its token.
type adminKey struct {
	id, role string
	digest   [32]byte
}

// AdminKeys tells which admin credential, if any, a bearer token is
// (config.Admin.AdminKeys: viewer and operator keys, each with an id).
type AdminKeys struct{ keys []adminKey }

// NewAdminKeys holds the keys; keys with an empty token are left out.
func NewAdminKeys(keys []config.AdminKey) *AdminKeys {
	out := &AdminKeys{}
	for _, k := range keys {
		if k.Token == "" {
			continue
		}
		out.keys = append(out.keys, adminKey{id: k.ID, role: k.Role, digest: sha256.Sum256([]byte(k.Token))})
	}
	return out
}

// Empty reports that no key is configured (every request is refused).
func (ks *AdminKeys) Empty() bool { return len(ks.keys) == 0 }

// Lookup answers the key whose token tok is. Every key is compared, in
// constant time: the time taken tells nothing about which key matched.
func (ks *AdminKeys) Lookup(tok string) (Actor, bool) {
	if tok == "" {
		return Actor{}, false
	}
	d := sha256.Sum256([]byte(tok))
	var found Actor
	ok := false
	for _, k := range ks.keys {
		if subtle.ConstantTimeCompare(d[:], k.digest[:]) == 1 {
			found, ok = Actor{KeyID: k.id, Role: k.role}, true
		}
	}
	return found, ok
}

// Actor is who made an admin request: the key's id and role.
type Actor struct {
	KeyID string
	Role  string
}

// Can reports whether the actor's role allows what role requires: an
// operator may do everything, a viewer only a viewer's part.
func (a Actor) Can(role string) bool {
	return a.Role == config.RoleOperator || (a.Role == role && role == config.RoleViewer)
}

type actorKey struct{}

// WithActor puts the actor in ctx.
func WithActor(ctx context.Context, a Actor) context.Context {
	return context.WithValue(ctx, actorKey{}, a)
}

// ActorFrom is the actor RequireRole put in ctx.
func ActorFrom(ctx context.Context) (Actor, bool) {
	a, ok := ctx.Value(actorKey{}).(Actor)
	return a, ok
}

// RequireRole lets a request through only with the bearer token of a key
// whose role allows role: no token or an unknown one is 401 unauthorized, a
// viewer's token on an operator's route 403 forbidden. The actor is in the
// request's context (ActorFrom).
func RequireRole(keys *AdminKeys, role string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ := bearer(r.Header.Get("Authorization"))
		actor, ok := keys.Lookup(got)
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="flashgate-admin"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"code":"unauthorized","message":"admin token missing or wrong"}` + "\n"))
			return
		}
		if !actor.Can(role) {
			Forbidden(w, actor, role)
			return
		}
		h.ServeHTTP(w, r.WithContext(WithActor(r.Context(), actor)))
	})
}

// Forbidden answers 403 forbidden: the actor's role does not allow role.
func Forbidden(w http.ResponseWriter, actor Actor, role string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusForbidden)
	b, _ := json.Marshal(map[string]string{"code": "forbidden",
		"message": "the key " + actor.KeyID + " is a " + actor.Role + "; this needs the " + role + " role"})
	_, _ = w.Write(append(b, '\n'))
}
