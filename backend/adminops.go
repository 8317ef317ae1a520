package backend

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/audit"
	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/mysql"
)

// Sale-day operations of the admin API (docs/runbook.md) and who did what
// (docs/credentials.md): each admin key has an id and a role; a viewer reads,
// an operator also changes, and every change is a row of the admin audit log
// (mysql.AdminChange) with the key's id, the source address, MySQL's time,
// and the state before and after.

// viewer and operator guard a route with the role it needs.
func (a *adminAPI) viewer(h http.HandlerFunc) http.Handler {
	return auth.RequireRole(a.keys, config.RoleViewer, h)
}

func (a *adminAPI) operator(h http.HandlerFunc) http.Handler {
	return auth.RequireRole(a.keys, config.RoleOperator, h)
}

// change is one admin change about to be recorded.
type change struct {
	action, sale, target string
	before, after        any
}

// auditEntry is the audit log row of ch made by r's actor.
func auditEntry(r *http.Request, ch change) mysql.AdminChange {
	actor, _ := auth.ActorFrom(r.Context())
	src := r.RemoteAddr
	if h, _, err := net.SplitHostPort(src); err == nil {
		src = h
	}
	js := func(v any) json.RawMessage {
		if v == nil {
			return nil
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil
		}
		return b
	}
	return mysql.AdminChange{KeyID: actor.KeyID, Role: actor.Role, Source: src, Action: ch.action,
		SaleID: ch.sale, Target: ch.target, Before: js(ch.before), After: js(ch.after)}
}

// record appends a change already made to the admin audit log. The change
// stands whatever happens here: a failure to record it is logged at error
// level with the whole entry, so that the log of the process holds what
// MySQL could not.
func (a *adminAPI) record(r *http.Request, ch change) {
	e := auditEntry(r, ch)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), recordTimeout)
	defer cancel()
	if err := mysql.RecordAdminChange(ctx, a.db, e); err != nil {
		a.log.Error("admin change not recorded in the audit log", "err", err, "key", e.KeyID, "source", e.Source,
			"action", e.Action, "sale", e.SaleID, "target", e.Target, "before", string(e.Before), "after", string(e.After))
	}
}

// recordTimeout bounds writing one entry of the audit log.
const recordTimeout = 5 * time.Second

// pauseView is the before and after of a pause or a resume.
type pauseView struct {
	Paused bool `json:"paused"`
	Closed bool `json:"closed"`
}

// pauseSale and resumeSale: POST /admin/v1/sales/{sale}/pause and /resume.
func (a *adminAPI) pauseSale(w http.ResponseWriter, r *http.Request)  { a.setPaused(w, r, true) }
func (a *adminAPI) resumeSale(w http.ResponseWriter, r *http.Request) { a.setPaused(w, r, false) }

// setPaused pauses or resumes the sale. Like close: Redis first (admit.lua
// answers paused, reserving nothing, from then on; each bucket of a split
// sale, then its meta), then MySQL (where a rebuild reads it), under the sale
// row lock so that no rebuild runs between the two; the audit row commits
// with MySQL's change. Then the gateways' caches (an event; their periodic
// reload of the meta heals a lost one). A pause that fails half-way answers
// 503 and is safe to repeat.
func (a *adminAPI) setPaused(w http.ResponseWriter, r *http.Request, paused bool) {
	id := r.PathValue("sale")
	if _, ok := a.saleOr404(w, r, id); !ok {
		return
	}
	if _, err := a.warmer.warm(r.Context(), id); err != nil {
		writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, "Redis: "+err.Error())
		return
	}
	action := "resume"
	if paused {
		action = "pause"
	}
	row, code, err := a.pauseLocked(r, id, paused, action)
	switch {
	case errors.Is(err, errSaleNotFound):
		writeError(w, http.StatusNotFound, flashgate.CodeSaleNotFound, "no sale "+id)
		return
	case err != nil:
		a.log.Error(action+" sale", "sale", id, "err", err)
		writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, code+": "+err.Error())
		return
	}
	typ := bus.EventResumed
	if paused {
		typ = bus.EventPaused
	}
	a.events.publish(bus.SaleEvent{Type: typ, SaleID: id, Sale: &row.Sale})
	a.log.Info("sale "+action+"d", "sale", id)
	writeJSON(w, http.StatusOK, &row.Sale)
}

func (a *adminAPI) pauseLocked(r *http.Request, id string, paused bool, action string) (*saleRow, string, error) {
	ctx := r.Context()
	tx, err := mysql.Begin(ctx, a.db)
	if err != nil {
		return nil, "MySQL", err
	}
	defer tx.Rollback()
	if found, err := mysql.LockSale(ctx, tx, id); err != nil || !found {
		if err == nil {
			err = errSaleNotFound
		}
		return nil, "MySQL", err
	}
	before, err := loadSale(ctx, tx, id)
	if err != nil {
		return nil, "MySQL", err
	}
	k, err := keysOf(ctx, tx, id)
	if err != nil {
		return nil, "MySQL", err
	}
	if err := lua.SetPaused(ctx, a.rc, k, paused); err != nil {
		return nil, "Redis", err
	}
	if err := mysql.SetSalePaused(ctx, tx, id, paused); err != nil {
		return nil, "MySQL", err
	}
	after := *before
	after.Paused = paused
	e := auditEntry(r, change{action: action, sale: id,
		before: pauseView{Paused: before.Paused, Closed: before.Closed}, after: pauseView{Paused: paused, Closed: before.Closed}})
	if err := mysql.RecordAdminChange(ctx, tx, e); err != nil {
		return nil, "MySQL", err
	}
	return &after, "MySQL", tx.Commit()
}

// auditLogLimit bounds a page of the audit log.
const auditLogLimit = 1000

// auditLog is GET /admin/v1/audit-log[?sale=S][&before=ID][&limit=N]: the
// admin changes, newest first; a page's last id is the next page's before.
func (a *adminAPI) auditLog(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, before := 100, uint64(0)
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > auditLogLimit {
			writeError(w, http.StatusBadRequest, flashgate.CodeInvalidRequest, "limit: 1 to "+strconv.Itoa(auditLogLimit))
			return
		}
		limit = n
	}
	if v := q.Get("before"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, flashgate.CodeInvalidRequest, "before: an entry id")
			return
		}
		before = n
	}
	out, err := mysql.AdminChanges(r.Context(), a.db, q.Get("sale"), before, limit)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, "MySQL: "+err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": out})
}

// saleAudit is what GET /admin/v1/sales/{sale}/audit answers: audit.Check's
// report (MySQL and Redis, every invariant of docs/design.md §2), what the
// orders stream and its dead-letter stream still hold of the sale, and
// whether it all holds.
type saleAudit struct {
	audit.Report
	// StreamPending: the sale's order messages not yet written (the orders
	// stream keeps a message until a backend acked it).
	StreamPending uint64 `json:"stream_pending"`
	// DeadLettered: the sale's messages in the dead-letter stream: 202s
	// that are not orders until redriven (docs/runbook.md).
	DeadLettered uint64 `json:"dead_lettered"`
	// Drained: nothing reserved in Redis and nothing pending in the stream;
	// the report is exact only then.
	Drained bool `json:"drained"`
	// Holds: every invariant holds (audit.Report.OK) and nothing is dead-lettered.
	Holds bool `json:"holds"`
}

func (a *adminAPI) saleAudit(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("sale")
	if _, ok := a.saleOr404(w, r, id); !ok {
		return
	}
	rep, err := audit.Check(r.Context(), a.db, a.rc, id, nil)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, err.Error())
		return
	}
	out := saleAudit{Report: rep}
	out.StreamPending, err = subjectMsgs(r, a.js, a.natsCfg.Stream, bus.OrderSubject(a.natsCfg, id))
	if err == nil {
		out.DeadLettered, err = subjectMsgs(r, a.js, bus.DeadLetterStream(a.natsCfg), bus.DeadLetterSubject(a.natsCfg, "*", id))
	}
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, "NATS: "+err.Error())
		return
	}
	out.Drained = out.StreamPending == 0 && rep.RedisReserved == 0
	out.Holds = rep.OK() && out.DeadLettered == 0
	writeJSON(w, http.StatusOK, out)
}

// subjectMsgs counts the messages of stream on subject (a filter).
func subjectMsgs(r *http.Request, js jetstream.JetStream, stream, subject string) (uint64, error) {
	s, err := js.Stream(r.Context(), stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	info, err := s.Info(r.Context(), jetstream.WithSubjectFilter(subject))
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n, nil
}
