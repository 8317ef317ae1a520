package backend

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/api"
	"github.com/flashgate/flashgate/audit"
	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/metrics"
	"github.com/flashgate/flashgate/mysql"
)

// adminAPI is the admin HTTP API: creating, closing and reconciling sales,
// the ledger view, the probes, the metrics and pprof. It holds only what those
// answers read; reconcile and leadership are the owner's, reached by function.
type adminAPI struct {
	// keys are the admin credentials: viewer and operator keys, each with
	// an id the admin audit log records (adminops.go).
	keys    *auth.AdminKeys
	natsCfg config.NATS
	js      jetstream.JetStream
	log     *slog.Logger
	db      *sql.DB
	rc      rueidis.Client
	nc      *nats.Conn
	metrics *metrics.Backend
	warmer  *warmer
	events  *saleEvents
	// reconcile is Backend.ReconcileWith; isLeader reports the election.
	reconcile func(ctx context.Context, id string, opt ReconcileOptions) (ReconcileReport, error)
	isLeader  func() bool
	// cancel is lifecycle.cancel: an operator's cancel is the buyer's.
	cancel cancelFunc
	// live reads the live view's numbers (live.go, ui.go); sessions are
	// its logins.
	live     *live
	sessions uiSessions
	// liveSnaps share one live view a second among every viewer (liveshare.go).
	liveSnaps *liveSnapshots
	// waitReplicas, waitTimeout: redis.wait_replicas, redis.wait_timeout (a
	// PATCH lowering a split sale lands transfers only once confirmed).
	waitReplicas int
	waitTimeout  time.Duration
	// maxTokenTTL: auth.max_token_ttl, a denylist entry's default lifetime.
	maxTokenTTL time.Duration
	// flights share one read among concurrent requests (flight.go).
	flights flights
}

// maxAdminBody bounds an admin request body.
const maxAdminBody = 64 << 10

// handler serves docs/design.md §4, the health probes, the metrics and pprof.
// Everything under /admin/ needs an admin key's bearer token (a viewer's
// reads, an operator's changes: adminops.go); the probes and /metrics need
// none (Prometheus and orchestrators scrape them; they reveal counts, not
// orders). /debug/pprof/ needs the token too: profiles expose internals (the
// command line with any secret passed on it, heap contents, every goroutine's
// stack) and a CPU profile or trace costs the process while it runs. Fetch one
// with the header, e.g. curl -H "Authorization: Bearer $FLASHGATE_ADMIN_TOKEN"
// -o cpu.pprof http://127.0.0.1:8082/debug/pprof/profile?seconds=30.
func (a *adminAPI) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", a.readyz)
	mux.Handle("GET /metrics", a.metrics.Handler())
	mux.Handle("GET /openapi.json", api.Handler())
	mux.Handle("/debug/pprof/", a.operator(metrics.PprofHandler().ServeHTTP))
	mux.Handle("POST /admin/v1/sales", a.operator(a.createSale))
	mux.Handle("GET /admin/v1/sales", a.viewer(a.listSales))
	mux.Handle("PATCH /admin/v1/sales/{sale}", a.operator(a.updateSale))
	mux.Handle("GET /admin/v1/sales/{sale}", a.viewer(a.ledger))
	mux.Handle("GET /admin/v1/sales/{sale}/audit", a.viewer(a.saleAudit))
	mux.Handle("POST /admin/v1/sales/{sale}/close", a.operator(a.closeSale))
	mux.Handle("POST /admin/v1/sales/{sale}/pause", a.operator(a.pauseSale))
	mux.Handle("POST /admin/v1/sales/{sale}/resume", a.operator(a.resumeSale))
	mux.Handle("POST /admin/v1/sales/{sale}/reconcile", a.operator(a.reconcileSale))
	mux.Handle("GET /admin/v1/audit-log", a.viewer(a.auditLog))
	mux.Handle("GET /admin/v1/sales/{sale}/export", a.viewer(a.exportSale))
	mux.Handle("GET /admin/v1/orders", a.viewer(a.listOrders))
	mux.Handle("GET /admin/v1/orders/{order}", a.viewer(a.showOrder))
	mux.Handle("POST /admin/v1/orders/{order}/cancel", a.operator(a.cancelOrder))
	mux.Handle("GET /admin/v1/dlq", a.viewer(a.listDLQ))
	mux.Handle("POST /admin/v1/dlq/{seq}/redrive", a.operator(a.redriveDLQ))
	mux.Handle("GET /admin/v1/denylist", a.viewer(a.listDenylist))
	mux.Handle("POST /admin/v1/denylist", a.operator(a.addDenylist))
	mux.Handle("DELETE /admin/v1/denylist/{kind}/{id}", a.operator(a.removeDenylist))
	a.uiRoutes(mux)
	mux.Handle("/admin/", a.viewer(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "no such admin route: "+r.Method+" "+r.URL.Path)
	}))
	return mux
}

// saleSpec is the body of POST /admin/v1/sales. per_order_max may be left out:
// it then defaults to 1 (one unit per order, the usual flash-sale rule); given,
// it must be between 1 and per_user_limit.
type saleSpec struct {
	ID           string           `json:"id"`
	Title        string           `json:"title"`
	PriceCents   int64            `json:"price_cents"`
	Total        int64            `json:"total"`
	StartsAt     time.Time        `json:"starts_at"`
	EndsAt       time.Time        `json:"ends_at"`
	PerUserLimit int64            `json:"per_user_limit"`
	PerOrderMax  *int64           `json:"per_order_max"`
	Regions      map[string]int64 `json:"regions"`
	// Limits beyond per_user_limit, e.g. [{"dimension":"phone","max":1,"of":"orders","per":"day"}],
	// with day and month windows in TimeZone (IANA, default UTC).
	Limits   []flashgate.Limit `json:"limits"`
	TimeZone string            `json:"time_zone"`
	// Degrade: closed (default) or mysql, and the lane's purchases in flight
	// per gateway (docs/degrade.md).
	Degrade     string `json:"degrade"`
	DegradeRate int64  `json:"degrade_rate"`
	// Buckets splits the stock over that many Redis hash tags (docs/buckets.md).
	Buckets int `json:"buckets"`
}

func (s *saleSpec) sale() *flashgate.Sale {
	omax := int64(1)
	if s.PerOrderMax != nil {
		omax = *s.PerOrderMax
	}
	// MySQL and Redis keep milliseconds: so does the sale from the start.
	return &flashgate.Sale{
		ID: s.ID, Title: s.Title, PriceCents: s.PriceCents, Total: s.Total,
		StartsAt: s.StartsAt.UTC().Truncate(time.Millisecond), EndsAt: s.EndsAt.UTC().Truncate(time.Millisecond),
		PerUserLimit: s.PerUserLimit, PerOrderMax: omax, Regions: s.Regions,
		Limits: s.Limits, TimeZone: s.TimeZone, Degrade: s.Degrade, DegradeRate: s.DegradeRate, Buckets: s.Buckets,
	}
}

// decodeStrict reads exactly one JSON value with no unknown fields.
func decodeStrict(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxAdminBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the JSON body")
	}
	return nil
}

func (a *adminAPI) createSale(w http.ResponseWriter, r *http.Request) {
	var spec saleSpec
	if err := decodeStrict(w, r, &spec); err != nil {
		writeError(w, http.StatusBadRequest, flashgate.CodeInvalidRequest, "body: "+err.Error())
		return
	}
	sale := spec.sale()
	if err := sale.Validate(); err != nil {
		writeError(w, http.StatusBadRequest, flashgate.CodeInvalidRequest, err.Error())
		return
	}
	// The buckets' tags come from the slot map as it is now (docs/buckets.md).
	tags, err := lua.ChooseBucketTags(r.Context(), a.rc, sale.ID, sale.BucketCount())
	if err != nil {
		a.log.Error("create sale: bucket tags", "sale", sale.ID, "err", err)
		writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, "Redis: "+err.Error())
		return
	}
	sale.BucketTags = tags
	err = insertSale(r.Context(), a.db, sale, time.Now().UTC())
	switch {
	case errors.Is(err, errSaleExists):
		writeError(w, http.StatusConflict, flashgate.CodeConflict, "sale "+sale.ID+" exists")
		return
	case err != nil:
		a.log.Error("create sale", "sale", sale.ID, "err", err)
		writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, "MySQL: "+err.Error())
		return
	}
	// The sale is in MySQL: the answer is 201 even if Redis fails now, because a
	// gateway that meets the sale cold asks for a warm (bus.EventWarm).
	did, err := a.warmer.warm(r.Context(), sale.ID)
	switch {
	case err != nil:
		a.log.Error("warm new sale", "sale", sale.ID, "err", err)
	case !did:
		a.log.Warn("Redis already held the new sale: stale keys of an earlier sale with this id?", "sale", sale.ID)
	}
	a.record(r, change{action: "create", sale: sale.ID, after: sale})
	a.events.publish(bus.SaleEvent{Type: bus.EventCreated, SaleID: sale.ID, Sale: sale})
	a.log.Info("sale created", "sale", sale.ID, "total", sale.Total)
	writeJSON(w, http.StatusCreated, sale)
}

// ledgerView is GET /admin/v1/sales/{sale}: MySQL and Redis side by side, and
// invariant 3 of docs/design.md §2. Exact once the system has drained; during traffic
// the reads are different moments.
type ledgerView struct {
	Sale              *flashgate.Sale        `json:"sale"`
	Total             int64                  `json:"total"`
	Warm              bool                   `json:"warm"`
	Remaining         int64                  `json:"remaining"`
	RemainingByRegion map[string]int64       `json:"remaining_by_region,omitempty"`
	Reserved          int64                  `json:"reserved"`
	Reservations      int64                  `json:"reservations"`
	Sold              int64                  `json:"sold"`
	SoldByRegion      map[string]int64       `json:"sold_by_region,omitempty"`
	OrdersByStatus    map[string]statusCount `json:"orders_by_status"`
	Invariant3        invariant3             `json:"invariant3"`
	// Degrade is the sale's degrade mode and DegradeRate its lane's purchases
	// in flight per gateway (0: no lane); Stale counts the lane's orders Redis
	// has not been warmed with yet (docs/degrade.md).
	Degrade     string `json:"degrade"`
	DegradeRate int64  `json:"degrade_rate"`
	Stale       int64  `json:"stale"`
	// ConservationErrorUnits is remaining + reserved + sold − total, what the
	// flashgate_sale_conservation_error_units gauge shows (docs/observability.md).
	ConservationErrorUnits int64 `json:"conservation_error_units"`
	// RetiredAt: when retention removed the sale from Redis (docs/retention.md);
	// the view is then MySQL's alone.
	RetiredAt *time.Time `json:"retired_at,omitempty"`
}

type invariant3 struct {
	Holds     bool  `json:"holds"`
	Remaining int64 `json:"remaining"`
	Reserved  int64 `json:"reserved"`
	Sold      int64 `json:"sold"`
	Total     int64 `json:"total"`
	// Diff is remaining + reserved + sold − total.
	Diff int64 `json:"diff"`
}

// ledger is GET /admin/v1/sales/{sale}. Requests for one sale that arrive
// while its ledger is being read share that read (flight.go): a page of
// tabs or a script polling in a loop costs MySQL and the sale's hot shard
// one read at a time, not one each.
func (a *adminAPI) ledger(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("sale")
	if !flashgate.ValidID(id) {
		writeError(w, http.StatusNotFound, flashgate.CodeSaleNotFound, "no sale "+id)
		return
	}
	a.flights.ledgerCalls.Add(1)
	ans := a.flights.shared(r.Context(), "ledger "+id, func(ctx context.Context) answer { return a.readLedger(ctx, id) })
	writeJSON(w, ans.status, ans.body)
}

// readLedger is the ledger's one read of MySQL and Redis, as an answer.
func (a *adminAPI) readLedger(ctx context.Context, id string) answer {
	a.flights.ledgerReads.Add(1)
	if a.flights.ledgerHook != nil {
		a.flights.ledgerHook()
	}
	row, err := loadSale(ctx, a.db, id)
	switch {
	case errors.Is(err, errSaleNotFound):
		return errAnswer(http.StatusNotFound, flashgate.CodeSaleNotFound, "no sale "+id)
	case err != nil:
		return errAnswer(http.StatusServiceUnavailable, flashgate.CodeUnavailable, "MySQL: "+err.Error())
	}
	byStatus, err := mysql.OrdersByStatus(ctx, a.db, id)
	if err != nil {
		return errAnswer(http.StatusServiceUnavailable, flashgate.CodeUnavailable, "MySQL: "+err.Error())
	}
	retired, err := saleRetired(ctx, a.db, id)
	if err != nil {
		return errAnswer(http.StatusServiceUnavailable, flashgate.CodeUnavailable, "MySQL: "+err.Error())
	}
	if retired != nil {
		// Settled when it was retired: nothing reserved, the rest unsold.
		rem := row.Total - row.Sold
		return answer{http.StatusOK, ledgerView{
			Sale: &row.Sale, Total: row.Total, Remaining: rem,
			Sold: row.Sold, SoldByRegion: row.RegionSold, OrdersByStatus: byStatus,
			Invariant3: invariant3{Holds: true, Remaining: rem, Sold: row.Sold, Total: row.Total},
			RetiredAt:  retired,
			Degrade:    row.DegradeMode(), DegradeRate: row.DegradeLimit(), Stale: row.Stale,
		}}
	}
	red, err := audit.RedisLedger(ctx, a.rc, id, row.RegionNames())
	if err != nil {
		return errAnswer(http.StatusServiceUnavailable, flashgate.CodeUnavailable, "Redis: "+err.Error())
	}
	diff := red.Remaining + red.Reserved + row.Sold - row.Total
	return answer{http.StatusOK, ledgerView{
		Sale: &row.Sale, Total: row.Total,
		Warm: red.Warm, Remaining: red.Remaining, RemainingByRegion: red.ByRegion,
		Reserved: red.Reserved, Reservations: red.Reservations,
		Sold: row.Sold, SoldByRegion: row.RegionSold, OrdersByStatus: byStatus,
		Invariant3: invariant3{Holds: diff == 0, Remaining: red.Remaining, Reserved: red.Reserved,
			Sold: row.Sold, Total: row.Total, Diff: diff},
		Degrade: row.DegradeMode(), DegradeRate: row.DegradeLimit(), Stale: row.Stale,
		ConservationErrorUnits: diff,
	}}
}

func (a *adminAPI) saleOr404(w http.ResponseWriter, r *http.Request, id string) (*saleRow, bool) {
	if !flashgate.ValidID(id) {
		writeError(w, http.StatusNotFound, flashgate.CodeSaleNotFound, "no sale "+id)
		return nil, false
	}
	row, err := loadSale(r.Context(), a.db, id)
	switch {
	case errors.Is(err, errSaleNotFound):
		writeError(w, http.StatusNotFound, flashgate.CodeSaleNotFound, "no sale "+id)
		return nil, false
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, "MySQL: "+err.Error())
		return nil, false
	}
	return row, true
}

// closeLocked closes the sale in Redis and then in MySQL, under the sale row
// lock; it answers which of the two failed.
func (a *adminAPI) closeLocked(ctx context.Context, id string) (string, error) {
	tx, err := mysql.Begin(ctx, a.db)
	if err != nil {
		return "MySQL", err
	}
	defer tx.Rollback()
	if _, err := mysql.LockSale(ctx, tx, id); err != nil {
		return "MySQL", err
	}
	k, err := keysOf(ctx, tx, id)
	if err != nil {
		return "MySQL", err
	}
	// closed_at is the close by Redis's clock (lua.CloseAt): what an order's
	// created time, which Redis stamped at its admission, is compared with.
	closedAt, err := lua.CloseAt(ctx, a.rc, k)
	if err != nil {
		return "Redis", err
	}
	if closedAt.IsZero() {
		closedAt = time.Now().UTC() // no tag is warm: nothing admits meanwhile
	}
	if err := mysql.CloseSale(ctx, tx, id, closedAt); err != nil {
		return "MySQL", err
	}
	return "MySQL", tx.Commit()
}

// closeSale stops selling now: Redis first (the admit script answers ended
// from then on), then MySQL (the sale leaves the open list; closed_at is the
// close by Redis's clock, lua.CloseAt, and an order whose created time, which
// Redis stamped at its admission, is later than that plus closeGrace fails
// sale_closed), then the gateways' caches. In this order every order already in the stream was admitted before
// the close, and the writer honours it: a 202 given stays an order. A close
// that fails half-way answers 503 and is safe to repeat.
func (a *adminAPI) closeSale(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("sale")
	before, ok := a.saleOr404(w, r, id)
	if !ok {
		return
	}
	// A cold sale is warmed first (lua.Close alone would leave a meta with
	// nothing but the state); a warm one is closed in place.
	if _, err := a.warmer.warm(r.Context(), id); err != nil {
		writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, "Redis: "+err.Error())
		return
	}
	// Under the sale row lock no rebuild runs (rebuild.go holds it from its
	// fence to its install): every bucket of a split sale is closed, then the
	// sale's meta, then MySQL, and a rebuild after the commit reads it closed.
	if code, err := a.closeLocked(r.Context(), id); err != nil {
		writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, code+": "+err.Error())
		return
	}
	row, ok := a.saleOr404(w, r, id)
	if !ok {
		return
	}
	a.record(r, change{action: "close", sale: id, before: &before.Sale, after: &row.Sale})
	a.events.publish(bus.SaleEvent{Type: bus.EventClosed, SaleID: id, Sale: &row.Sale})
	a.log.Info("sale closed", "sale", id)
	writeJSON(w, http.StatusOK, &row.Sale)
}

// minOlderThan is the floor of reconcile's ?older_than=: younger than this,
// a reservation is one whose order is still on its way (admission to publish
// to write takes milliseconds, but a stalled backend a while), and reconcile
// would only churn the hot shard releasing what the writer confirms next.
const minOlderThan = time.Second

// reconcileSale repairs the sale now and answers the report (reconcile.go):
// any backend may run it, leader or not. ?older_than=<duration> (default 30s,
// at least minOlderThan) is the age past which a reservation is stale.
// Requests for one sale and age that arrive while it runs share that run and
// its report (flight.go); the run is recorded once in the audit log, under
// the key of the request that started it.
func (a *adminAPI) reconcileSale(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("sale")
	var opt ReconcileOptions
	if v := r.URL.Query().Get("older_than"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < minOlderThan {
			writeError(w, http.StatusBadRequest, flashgate.CodeInvalidRequest, "older_than: a duration of at least "+minOlderThan.String()+", such as 30s")
			return
		}
		opt.StaleAfter = d
	}
	if _, ok := a.saleOr404(w, r, id); !ok {
		return
	}
	ans := a.flights.shared(r.Context(), "reconcile "+id+" "+opt.StaleAfter.String(), func(ctx context.Context) answer {
		a.flights.reconcileRuns.Add(1)
		rep, err := a.reconcile(ctx, id, opt)
		switch {
		case errors.Is(err, errSaleNotFound):
			return errAnswer(http.StatusNotFound, flashgate.CodeSaleNotFound, "no sale "+id)
		case err != nil:
			a.log.Error("reconcile", "sale", id, "err", err)
			return errAnswer(http.StatusServiceUnavailable, flashgate.CodeUnavailable, "reconcile: "+err.Error())
		}
		a.record(r.WithContext(ctx), change{action: "reconcile", sale: id, before: rep.Before, after: rep.After})
		a.log.Info("reconciled on request", "sale", id, "rewarmed", rep.Rewarmed, "republished", rep.Republished,
			"repaired", rep.Repair.Done, "diff_before", rep.Before.Diff, "diff_after", rep.After.Diff)
		return answer{http.StatusOK, rep}
	})
	writeJSON(w, ans.status, ans.body)
}

// readyz answers 200 only when MySQL, Redis and NATS all answer.
func (a *adminAPI) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	checks := map[string]string{"mysql": "ok", "redis": "ok", "nats": "ok"}
	var failed []string
	if err := a.db.PingContext(ctx); err != nil {
		checks["mysql"], failed = err.Error(), append(failed, "mysql")
	}
	if err := a.rc.Do(ctx, a.rc.B().Ping().Build()).Error(); err != nil {
		checks["redis"], failed = err.Error(), append(failed, "redis")
	}
	if !a.nc.IsConnected() {
		checks["nats"], failed = "not connected: "+a.nc.Status().String(), append(failed, "nats")
	}
	if len(failed) > 0 {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{
			"code":    flashgate.CodeUnavailable,
			"message": "not ready: " + strings.Join(failed, ", "),
			"checks":  checks,
		})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "checks": checks, "leader": a.isLeader()})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(fmt.Sprintf(`{"code":"internal","message":%q}`, err.Error()))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, status int, code flashgate.Code, msg string) {
	writeJSON(w, status, map[string]string{"code": string(code), "message": msg})
}
