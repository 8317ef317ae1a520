package backend

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/lua"
)

// The token denylist's admin API (docs/security.md, "Revoking a token"): an
// operator revokes a buyer (every token of a subject) or one token (its jti)
// until a time; the entry goes to Redis (lua.Denylist), where every gateway
// reads it within a second, and the change to the admin audit log. The
// backend itself verifies no token and holds no signing key.

// denyEntry is one entry of GET /admin/v1/denylist, and the body of a POST.
type denyEntry struct {
	Kind  string    `json:"kind"` // "sub" or "jti"
	ID    string    `json:"id"`
	Until time.Time `json:"until,omitzero"`
	// For is a POST's alternative to until: a duration from now (default
	// auth.max_token_ttl plus a minute: every token of the subject then
	// issued has expired).
	For string `json:"for,omitempty"`
}

// denyMaxFor bounds an entry's lifetime: a denylist is for tokens that are
// still valid, and none is valid longer than auth.max_token_ttl.
const denyMaxFor = 366 * 24 * time.Hour

func validDenyKind(k string) bool { return k == auth.DenySubject || k == auth.DenyTokenID }

// listDenylist is GET /admin/v1/denylist: the entries in force, soonest to
// lapse first. Lapsed entries are removed on the way.
func (a *adminAPI) listDenylist(w http.ResponseWriter, r *http.Request) {
	r = withDenyTimeout(r)
	all, _, err := lua.LoadDenylist(r.Context(), a.rc)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, "Redis: "+err.Error())
		return
	}
	now := time.Now().Unix()
	out := []denyEntry{}
	var lapsed []string
	for name, until := range all {
		kind, id, _ := strings.Cut(name, ":")
		if until <= now {
			lapsed = append(lapsed, name)
			continue
		}
		out = append(out, denyEntry{Kind: kind, ID: id, Until: time.Unix(until, 0).UTC()})
	}
	if len(lapsed) > 0 {
		if _, err := lua.Undeny(r.Context(), a.rc, lapsed...); err != nil {
			a.log.Warn("denylist: removing lapsed entries", "err", err)
		}
	}
	slices.SortFunc(out, func(x, y denyEntry) int { return x.Until.Compare(y.Until) })
	writeJSON(w, http.StatusOK, map[string]any{"entries": out})
}

// addDenylist is POST /admin/v1/denylist {"kind","id","until"|"for"}:
// revoke now. Answers the entry, 200.
func (a *adminAPI) addDenylist(w http.ResponseWriter, r *http.Request) {
	r = withDenyTimeout(r)
	var e denyEntry
	if err := decodeStrict(w, r, &e); err != nil {
		writeError(w, http.StatusBadRequest, flashgate.CodeInvalidRequest, err.Error())
		return
	}
	if !validDenyKind(e.Kind) || !flashgate.ValidID(e.ID) {
		writeError(w, http.StatusBadRequest, flashgate.CodeInvalidRequest,
			`kind: "sub" or "jti"; id: 1-64 characters of [A-Za-z0-9_-]`)
		return
	}
	now := time.Now()
	switch {
	case e.For != "" && !e.Until.IsZero():
		writeError(w, http.StatusBadRequest, flashgate.CodeInvalidRequest, "until or for, not both")
		return
	case e.For != "":
		d, err := time.ParseDuration(e.For)
		if err != nil || d <= 0 {
			writeError(w, http.StatusBadRequest, flashgate.CodeInvalidRequest, "for: a positive duration such as 24h")
			return
		}
		e.Until = now.Add(d)
	case e.Until.IsZero():
		e.Until = now.Add(a.maxTokenTTL + time.Minute)
	}
	if !e.Until.After(now) || e.Until.Sub(now) > denyMaxFor {
		writeError(w, http.StatusBadRequest, flashgate.CodeInvalidRequest, "until: in the future, within a year")
		return
	}
	e.Until, e.For = e.Until.UTC().Truncate(time.Second), ""
	if err := lua.Deny(r.Context(), a.rc, auth.DenyEntry(e.Kind, e.ID), e.Until); err != nil {
		writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, "Redis: "+err.Error())
		return
	}
	a.record(r, change{action: "deny", target: auth.DenyEntry(e.Kind, e.ID), after: e})
	a.log.Info("denylist: entry added", "kind", e.Kind, "id", e.ID, "until", e.Until)
	writeJSON(w, http.StatusOK, e)
}

// removeDenylist is DELETE /admin/v1/denylist/{kind}/{id}: 200 with the
// entry removed, 404 when there was none.
func (a *adminAPI) removeDenylist(w http.ResponseWriter, r *http.Request) {
	r = withDenyTimeout(r)
	kind, id := r.PathValue("kind"), r.PathValue("id")
	if !validDenyKind(kind) || !flashgate.ValidID(id) {
		writeError(w, http.StatusNotFound, "not_found", "no such denylist entry")
		return
	}
	n, err := lua.Undeny(r.Context(), a.rc, auth.DenyEntry(kind, id))
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, "Redis: "+err.Error())
		return
	}
	if n == 0 {
		writeError(w, http.StatusNotFound, "not_found", "no such denylist entry")
		return
	}
	a.record(r, change{action: "undeny", target: auth.DenyEntry(kind, id), before: denyEntry{Kind: kind, ID: id}})
	a.log.Info("denylist: entry removed", "kind", kind, "id", id)
	writeJSON(w, http.StatusOK, denyEntry{Kind: kind, ID: id})
}

// denyTimeout bounds the denylist's Redis calls: a stalled Redis gets an
// operator a 503 in seconds, not a request that hangs.
const denyTimeout = 3 * time.Second

// withDenyTimeout is r with its context bounded by denyTimeout; the timer
// ends when the handler has written its answer (the request's own context
// ends then).
func withDenyTimeout(r *http.Request) *http.Request {
	ctx, cancel := context.WithTimeout(r.Context(), denyTimeout)
	context.AfterFunc(r.Context(), cancel)
	return r.WithContext(ctx)
}
