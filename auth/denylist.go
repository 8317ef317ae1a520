package auth

import (
	"errors"
	"strings"
	"sync/atomic"
)

// ErrDenied is why a token on the denylist is refused (wrapped in
// ErrUnauthorized: the buyer sees the same 401 unauthorized as for any bad
// token).
var ErrDenied = errors.New("the token's subject or id is denied")

// Denylist is what an operator revoked: users (sub) and single tokens (jti),
// each until a unix second (docs/security.md, "Revoking a token"). Every
// gateway holds a copy that it replaces whole from Redis (lua.Denylist); a
// token is checked against it on every request, cached or not, so a revoked
// token stops working within one refresh of the copy. Reads are a pointer
// load and a map lookup: no lock, no allocation.
type Denylist struct {
	set atomic.Pointer[denySet]
}

type denySet struct {
	subs, jtis map[string]int64 // id → denied until (unix seconds)
}

// Denylist entry kinds, the prefixes of their names (DenyEntry).
const (
	DenySubject = "sub"
	DenyTokenID = "jti"
)

// NewDenylist is an empty denylist.
func NewDenylist() *Denylist { return &Denylist{} }

// DenyEntry is the name of an entry: kind ("sub" or "jti"), a colon, the id.
func DenyEntry(kind, id string) string { return kind + ":" + id }

// Replace makes entries (DenyEntry name → until, unix seconds) the whole
// denylist. Names of another kind are ignored.
func (d *Denylist) Replace(entries map[string]int64) {
	s := &denySet{subs: map[string]int64{}, jtis: map[string]int64{}}
	for name, until := range entries {
		kind, id, ok := strings.Cut(name, ":")
		switch {
		case !ok || id == "":
		case kind == DenySubject:
			s.subs[id] = until
		case kind == DenyTokenID:
			s.jtis[id] = until
		}
	}
	if len(s.subs)+len(s.jtis) == 0 {
		s = nil
	}
	d.set.Store(s)
}

// Len is the number of entries held (lapsed ones included).
func (d *Denylist) Len() int {
	s := d.set.Load()
	if s == nil {
		return 0
	}
	return len(s.subs) + len(s.jtis)
}

// Denied reports whether c's subject or token id is denied at now (unix
// seconds).
func (d *Denylist) Denied(c *Claims, now int64) bool {
	s := d.set.Load()
	if s == nil {
		return false
	}
	if until, ok := s.subs[c.Subject]; ok && now < until {
		return true
	}
	if c.ID == "" {
		return false
	}
	until, ok := s.jtis[c.ID]
	return ok && now < until
}
