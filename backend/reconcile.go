package backend

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/tick"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/mysql"
)

// Reconcile (docs/design.md §8, invariant 3 of §2) brings Redis back in line with
// MySQL, the source of truth, and JetStream, which holds the orders in flight:
//
//   - Redis lost the sale (no meta): it is warmed from MySQL with
//     remaining = total − sold − in flight. In flight is read from the orders
//     stream itself: after a Redis loss its messages are the only record of
//     the orders admitted and not yet written. A second consumer cannot read
//     them (a work-queue stream allows one consumer per subject), so they are
//     read one by one with STREAM.MSG.GET next_by_subj, which neither delivers
//     nor acks. The stream is read first, MySQL after, in one snapshot: an
//     order acked in between is a row (and in sold) there, so nothing is
//     counted twice or missed. Warms on a gateway's request or at start count
//     in flight the same way (warmer.inFlight).
//   - Redis lost stock keys but kept the meta: the absent keys are restored the
//     same way, the reservations Redis still has counted too.
//   - Stale reservations (older than StaleAfter) whose order MySQL lacks are
//     published again with their order id as message id (a gateway died between
//     admission and publish, or NATS lost the message); those MySQL has decided
//     get MySQL's word written back (a write-back that never happened).
//   - Orders canceled or expired in MySQL whose units never went back to Redis
//     (the backend died after the commit, Redis was away) get their restock
//     again (restockCanceled: once per order, whoever runs it).
//   - The ledger: once nothing of the sale is in flight (no message in the
//     stream, no reservation younger than StaleAfter, none MySQL has decided),
//     each stock key is set to total − sold − reserved, under the sale's MySQL
//     row lock (no batch, cancel or expiry of the sale commits meanwhile) and in
//     a script that counts the reservations itself and writes nothing if they
//     moved since they were read (lua.ResetStock). After a Redis loss, orders
//     that were in flight and then failed could not give their units back (Redis
//     had no record): this is where they come back.
//
// Every step is idempotent: reconcile may run at any time, concurrently with
// traffic and with itself, on any backend (the leader runs it every
// reconcileEvery; POST /admin/v1/sales/{sale}/reconcile runs it at once).

// DefaultStaleAfter is the age past which a reservation is stale.
const DefaultStaleAfter = 30 * time.Second

const (
	// reconcileRecent: the leader reconciles sales that ended (or were
	// closed) up to this long ago too: their last orders may still be in flight.
	reconcileRecent = time.Hour
	// repairQuiet: the leader repairs a sale's ledger only after it has not
	// moved for this long (an operator's reconcile does not wait).
	repairQuiet = 30 * time.Second
	// reconcileSaleTimeout bounds the leader's reconcile of one sale.
	reconcileSaleTimeout = 30 * time.Second
	// repairTimeout bounds the time the sale row stays locked for a repair.
	repairTimeout = 5 * time.Second
	// restockWindow: the leader restocks orders canceled this recently on
	// every run; older ones it leaves to the repair, which takes them all.
	restockWindow = time.Minute
)

// ReconcileOptions tune one reconcile.
type ReconcileOptions struct {
	// StaleAfter is the age past which a reservation is stale (0: DefaultStaleAfter).
	StaleAfter time.Duration
	// quiet, if set, is asked with the ledger's fingerprint before a repair;
	// false postpones it (the leader's periodic run waits for a quiet sale).
	quiet func(fingerprint string) bool
	// restockSince: orders canceled since then are restocked (zero: all).
	restockSince time.Time
}

// reconciler compares MySQL, Redis and the stream for a sale and repairs
// Redis from MySQL: the leader's periodic pass, the admin API's request, and
// the warmer's count of units still in flight.
type reconciler struct {
	cfg     reconcileConfig
	log     *slog.Logger
	db      *sql.DB
	rc      rueidis.Client
	js      jetstream.JetStream
	stream  *orderStream
	scripts *lua.Scripts
	ops     *opsMetrics
	writer  *orderWriter // its write-back settles stale reservations
	warmer  *warmer
	life    *lifecycle // restocks canceled orders
	events  *saleEvents
}

// reconcileConfig is what reconcile reads of the configuration.
type reconcileConfig struct {
	NATS config.NATS
	// PublishTimeout is the gateways' (gateway.publish_timeout): how long an
	// admission's publish may still be on its way.
	PublishTimeout time.Duration
	// WaitReplicas, WaitTimeout: redis.wait_replicas, redis.wait_timeout; a
	// transfer between buckets is landed once that many replicas of its
	// giver's master have its take (lua.FinishTransfersWait).
	WaitReplicas int
	WaitTimeout  time.Duration
}

// ReconcileReport is what one reconcile found and did (the body of POST
// /admin/v1/sales/{sale}/reconcile).
type ReconcileReport struct {
	SaleID     string `json:"sale_id"`
	StaleAfter string `json:"stale_after"`
	// Rewarmed: Redis had no meta; the sale was warmed as total − sold − in flight.
	Rewarmed bool `json:"rewarmed"`
	// Restored lists stock keys Redis had lost (meta kept), set from MySQL.
	Restored []lua.StockChange `json:"restored,omitempty"`
	// Stale counts reservations older than StaleAfter; of them, Republished were
	// published again (RepublishDeduplicated of those JetStream still held
	// within its duplicate window), Waiting are still in the stream, Settled
	// were decided by MySQL and written back, Unsettled MySQL holds in another
	// state (canceled: the sweeper's business).
	Stale                 int `json:"stale"`
	Republished           int `json:"republished"`
	RepublishDeduplicated int `json:"republish_deduplicated"`
	Waiting               int `json:"waiting"`
	Settled               int `json:"settled"`
	Unsettled             int `json:"unsettled"`
	// Restocked counts canceled orders whose units only now went back to Redis.
	Restocked int `json:"restocked"`
	// Transfers counts transfers between a split sale's buckets that were
	// left half done and landed now (docs/buckets.md).
	Transfers int `json:"transfers,omitempty"`
	// Repair is the ledger repair: done, or why not.
	Repair StockRepair `json:"repair"`
	// Before and After are the ledger when reconcile began and ended.
	Before LedgerState `json:"before"`
	After  LedgerState `json:"after"`
	// Invariant3Holds: after reconcile, remaining + reserved + sold = total, per
	// region too.
	Invariant3Holds bool `json:"invariant3_holds"`
	// RetiredAt: retention removed the sale from Redis then
	// (docs/retention.md); reconcile leaves it alone (its restocks and warms
	// would write its keys back).
	RetiredAt *time.Time `json:"retired_at,omitempty"`
}

// StockRepair is the ledger repair of one reconcile.
type StockRepair struct {
	Done    bool              `json:"done"`
	Skipped string            `json:"skipped,omitempty"`
	Changes []lua.StockChange `json:"changes,omitempty"`
}

// LedgerState is invariant 3 of one sale at one moment, per region too.
type LedgerState struct {
	invariant3
	Warm         bool                    `json:"warm"`
	Reservations int                     `json:"reservations"`
	ByRegion     map[string]RegionLedger `json:"by_region,omitempty"`
}

// RegionLedger is one region's part of the ledger.
type RegionLedger struct {
	Total     int64 `json:"total"`
	Sold      int64 `json:"sold"`
	Remaining int64 `json:"remaining"`
	Reserved  int64 `json:"reserved"`
	// Diff is remaining + reserved + sold − total.
	Diff int64 `json:"diff"`
	// Warm: Redis has the stock key.
	Warm bool `json:"warm"`
}

// changed reports whether the reconcile did anything.
func (r *ReconcileReport) changed() bool {
	return r.Rewarmed || len(r.Restored) > 0 || r.Republished > 0 || r.Settled > 0 || r.Restocked > 0 || r.Transfers > 0 || r.Repair.Done
}

// Reconcile reconciles saleID with the default options.
func (b *Backend) Reconcile(ctx context.Context, saleID string) (ReconcileReport, error) {
	return b.rec.ReconcileWith(ctx, saleID, ReconcileOptions{})
}

// ReconcileWith reconciles saleID: see the top of this file.
func (b *Backend) ReconcileWith(ctx context.Context, saleID string, opt ReconcileOptions) (ReconcileReport, error) {
	return b.rec.ReconcileWith(ctx, saleID, opt)
}

// ReconcileWith reconciles saleID: see the top of this file.
func (re *reconciler) ReconcileWith(ctx context.Context, saleID string, opt ReconcileOptions) (ReconcileReport, error) {
	if opt.StaleAfter <= 0 {
		opt.StaleAfter = DefaultStaleAfter
	}
	rep := ReconcileReport{SaleID: saleID, StaleAfter: opt.StaleAfter.String()}
	err := re.reconcile(ctx, saleID, opt, &rep)
	result := "ok"
	if err != nil {
		result = "error"
	}
	re.ops.reconciles.WithLabelValues(result).Inc()
	return rep, err
}

func (re *reconciler) reconcile(ctx context.Context, id string, opt ReconcileOptions, rep *ReconcileReport) error {
	retired, err := saleRetired(ctx, re.db, id)
	if err != nil || retired != nil {
		rep.RetiredAt, rep.Invariant3Holds = retired, retired != nil
		return err
	}
	if err := re.finishTransfers(ctx, id, rep); err != nil {
		return err
	}
	before, err := re.readLedger(ctx, id)
	if err != nil {
		return err
	}
	rep.Before = before.state()
	if err := re.restoreLost(ctx, id, before, opt, rep); err != nil {
		return err
	}
	if err := re.staleReservations(ctx, before, opt.StaleAfter, rep); err != nil {
		return err
	}
	n, err := re.life.restockCanceled(ctx, id, opt.restockSince)
	rep.Restocked += n
	if err != nil {
		return err
	}
	cur, err := re.repairStock(ctx, id, before, opt, rep)
	if err != nil {
		return err
	}
	after := cur
	if rep.Repair.Done || opt.quiet == nil {
		if after, err = re.readLedger(ctx, id); err != nil {
			return err
		}
	}
	rep.After = after.state()
	rep.Invariant3Holds = after.holds()
	return nil
}

// finishTransfers lands the transfers between the buckets of a split sale
// that a process took and did not land, and decides its purchase-limit holds
// left half done (docs/buckets.md).
func (re *reconciler) finishTransfers(ctx context.Context, id string, rep *ReconcileReport) error {
	k, err := keysOf(ctx, re.db, id)
	if err != nil || len(k.Buckets()) == 0 {
		return err
	}
	n, err := lua.FinishTransfersWait(ctx, re.rc, k, re.cfg.WaitReplicas, re.cfg.WaitTimeout)
	rep.Transfers += n
	if n > 0 {
		re.log.Warn("landed transfers between buckets left half done", "sale", id, "transfers", n)
	}
	if err != nil {
		return err
	}
	// Purchase limits counted in other buckets than the buyer's: holds a
	// crash left undecided, and give-backs a release or restock left.
	h, err := lua.FinishHolds(ctx, re.rc, k)
	if h.GivenBack > 0 || h.Kept > 0 || h.Aborted > 0 {
		re.log.Warn("finished purchase-limit holds left half done", "sale", id,
			"given_back", h.GivenBack, "kept", h.Kept, "aborted", h.Aborted)
	}
	return err
}

// restoreLost warms the sale again if Redis lost it, or restores the stock
// keys it lost.
func (re *reconciler) restoreLost(ctx context.Context, id string, before *ledgerRead, opt ReconcileOptions, rep *ReconcileReport) error {
	var err error
	switch {
	case !before.meta || len(before.row.BucketTags) > 1:
		// (A split sale that kept its meta may have lost buckets: the warm
		// refills those, and the repair below gives their units back.)
		if rep.Rewarmed, err = re.warmer.warm(ctx, id); err != nil {
			return err
		}
	case before.missingStock():
		changes, restocked, skipped, err := re.fixStock(ctx, id, true, opt.StaleAfter)
		rep.Restocked += restocked
		if err != nil {
			return err
		}
		if skipped != "" {
			re.log.Warn("restoring lost stock keys postponed", "sale", id, "why", skipped)
		}
		rep.Restored = changes
	}
	return nil
}

// repairStock sets the stock from MySQL when the ledger does not hold and the
// sale is warm (and, for the leader, quiet). It answers the ledger it judged.
func (re *reconciler) repairStock(ctx context.Context, id string, before *ledgerRead, opt ReconcileOptions, rep *ReconcileReport) (*ledgerRead, error) {
	// The leader reads again only if it moved something (a read costs an
	// HGETALL of the reservations on the sale's shard); an operator gets the
	// ledger as it is now.
	manual := opt.quiet == nil
	cur := before
	var err error
	if rep.changed() || manual {
		if cur, err = re.readLedger(ctx, id); err != nil {
			return nil, err
		}
	}
	switch {
	case !cur.meta || cur.missingStock():
		rep.Repair.Skipped = notWarm
	case cur.holds():
		rep.Repair.Skipped = "the ledger holds"
	case opt.quiet != nil && !opt.quiet(cur.fingerprint()):
		rep.Repair.Skipped = "waiting for the sale to be quiet for " + repairQuiet.String()
	default:
		changes, restocked, skipped, err := re.fixStock(ctx, id, false, opt.StaleAfter)
		rep.Restocked += restocked
		if err != nil {
			return nil, err
		}
		rep.Repair = StockRepair{Done: skipped == "", Skipped: skipped, Changes: changes}
	}
	return cur, nil
}

// ledgerRead is a sale's ledger as read now: MySQL's sale row, Redis's meta,
// stock keys and reservations.
type ledgerRead struct {
	row     *saleRow
	meta    bool
	resv    map[uint64]flashgate.Order
	regions map[string]*RegionLedger // "" for a sale without regions
	orphans int64                    // reserved units of regions the sale lacks
}

func (re *reconciler) readLedger(ctx context.Context, id string) (*ledgerRead, error) {
	row, err := loadSale(ctx, re.db, id)
	if err != nil {
		return nil, err
	}
	k := lua.KeysOf(&row.Sale)
	n, err := re.rc.Do(ctx, re.rc.B().Exists().Key(k.Meta).Build()).AsInt64()
	if err != nil {
		return nil, fmt.Errorf("ledger %s: %w", id, err)
	}
	rem, err := lua.Remaining(ctx, re.rc, k)
	if err != nil {
		return nil, err
	}
	resv, err := lua.Reservations(ctx, re.rc, k)
	if err != nil {
		return nil, err
	}
	l := &ledgerRead{row: row, meta: n == 1, resv: resv, regions: map[string]*RegionLedger{}}
	if len(row.Regions) == 0 {
		l.regions[""] = &RegionLedger{Total: row.Total, Sold: row.Sold}
	}
	for r, total := range row.Regions {
		l.regions[r] = &RegionLedger{Total: total, Sold: row.RegionSold[r]}
	}
	for r, g := range l.regions {
		g.Remaining, g.Warm = rem[r]
	}
	for _, rec := range resv {
		if g := l.regions[rec.Region]; g != nil {
			g.Reserved += rec.Quantity
		} else {
			l.orphans += rec.Quantity
		}
	}
	for _, g := range l.regions {
		g.Diff = g.Remaining + g.Reserved + g.Sold - g.Total
	}
	return l, nil
}

func (l *ledgerRead) missingStock() bool {
	for _, g := range l.regions {
		if !g.Warm {
			return true
		}
	}
	return false
}

// holds reports invariant 3, for every region.
func (l *ledgerRead) holds() bool {
	for _, g := range l.regions {
		if !g.Warm || g.Diff != 0 {
			return false
		}
	}
	return l.orphans == 0
}

func (l *ledgerRead) state() LedgerState {
	s := LedgerState{Warm: l.meta && !l.missingStock(), Reservations: len(l.resv)}
	s.Total, s.Sold, s.Reserved = l.row.Total, l.row.Sold, l.orphans
	for r, g := range l.regions {
		s.Remaining += g.Remaining
		s.Reserved += g.Reserved
		if r != "" {
			if s.ByRegion == nil {
				s.ByRegion = map[string]RegionLedger{}
			}
			s.ByRegion[r] = *g
		}
	}
	s.Diff = s.Remaining + s.Reserved + s.Sold - s.Total
	s.Holds = l.holds()
	return s
}

// fingerprint changes whenever anything of the ledger moves.
func (l *ledgerRead) fingerprint() string {
	var sb strings.Builder
	for _, r := range sortedKeys(l.regions) {
		g := l.regions[r]
		fmt.Fprintf(&sb, "%s:%d/%d/%d/%t;", r, g.Sold, g.Remaining, g.Reserved, g.Warm)
	}
	fmt.Fprintf(&sb, "resv:%d;orphans:%d", len(l.resv), l.orphans)
	return sb.String()
}

// fixStock sets the sale's stock keys from MySQL: every key (onlyMissing false:
// the ledger repair, only when nothing is in flight) or only the absent ones
// (counting what is in flight). It answers the changes, or why it changed
// nothing.
func (re *reconciler) fixStock(ctx context.Context, sale string, onlyMissing bool, staleAfter time.Duration) (changes []lua.StockChange, restocked int, skipped string, err error) {
	// The stream first, MySQL after: an order acked in between is a row below.
	msgs, skipped, err := re.stockInFlight(ctx, sale, onlyMissing)
	if err != nil || skipped != "" {
		return nil, 0, skipped, err
	}
	// The warm lock: a warm, or a refill of a split sale's lost buckets, sets
	// the stock keys too, from its own read of MySQL and the stream; the two
	// must not interleave (docs/buckets.md).
	unlock, ok, err := re.warmer.lock(ctx, sale)
	if err != nil {
		return nil, 0, "", err
	}
	if !ok {
		return nil, 0, warmUnderWay, nil
	}
	defer unlock()
	// Canceled orders whose restock never ran get it now (the bulk of them,
	// before the lock; those of the last moments again under it).
	since := time.Now().Add(-restockWindow)
	if restocked, err = re.life.restockCanceled(ctx, sale, time.Time{}); err != nil {
		return nil, restocked, "", err
	}

	ctx, cancel := context.WithTimeout(ctx, repairTimeout)
	defer cancel()
	tx, err := beginRC(ctx, re.db)
	if err != nil {
		return nil, restocked, "", fmt.Errorf("stock of %s: %w", sale, err)
	}
	defer tx.Rollback()
	row, n, err := re.lockStock(ctx, tx, sale, since)
	if restocked += n; err != nil {
		return nil, restocked, "", err
	}
	k := lua.KeysOf(&row.Sale)
	// Under the warm lock the sale is still warm, every bucket of it: one
	// Redis lost since the ledger was read is the warm's to fill.
	if warm, err := re.warmer.isWarm(ctx, k); err != nil || !warm {
		return nil, restocked, notWarm, err
	}
	if len(k.Buckets()) > 0 {
		if lost, err := lostBuckets(ctx, re.rc, k); err != nil || len(lost) > 0 {
			return nil, restocked, notWarm, err
		}
	}
	p, err := re.stockPlan(ctx, tx, k, msgs, staleAfter)
	if err != nil {
		return nil, restocked, "", err
	}
	if why := p.busy(staleAfter); !onlyMissing && why != "" {
		return nil, restocked, why, nil
	}
	changes, err = re.scripts.ResetStock(ctx, re.rc, k, onlyMissing, p.plans(row.Remaining()))
	if errors.Is(err, lua.ErrReservationsChanged) {
		return nil, restocked, "the reservations changed meanwhile", nil
	}
	if err != nil {
		return nil, restocked, "", err
	}
	if err := tx.Commit(); err != nil {
		// The stock is set; the lock was only a lock.
		re.log.Warn("releasing the sale row lock", "sale", sale, "err", err)
	}
	re.stockChanged(sale, changes, onlyMissing)
	return changes, restocked, "", nil
}

// Why fixStock set nothing, when it was the warm's turn.
const (
	warmUnderWay = "a warm of the sale is under way"
	notWarm      = "the sale is not warm in Redis"
)

// stockInFlight reads the sale's orders in the stream: all of them when only
// missing keys are set (they count as in flight), or, for the full repair,
// why it must wait (any message in the stream).
func (re *reconciler) stockInFlight(ctx context.Context, sale string, onlyMissing bool) (map[uint64]flashgate.Order, string, error) {
	if onlyMissing {
		msgs, err := re.stream.streamOrders(ctx, sale)
		return msgs, "", err
	}
	n, err := re.stream.streamCount(ctx, sale)
	if err != nil || n == 0 {
		return nil, "", err
	}
	return nil, fmt.Sprintf("%d order messages of the sale are in the stream", n), nil
}

// lockStock takes the sale row lock (no batch, cancel or expiry of the sale
// moves sold until the stock is set), restocks the orders canceled since
// since, and reads the sale under the lock. It answers the sale and how many
// orders it restocked.
func (re *reconciler) lockStock(ctx context.Context, tx *sql.Tx, sale string, since time.Time) (*saleRow, int, error) {
	found, err := mysql.LockSale(ctx, tx, sale)
	if err != nil {
		return nil, 0, fmt.Errorf("stock of %s: lock: %w", sale, err)
	}
	if !found {
		return nil, 0, fmt.Errorf("sale %s: %w", sale, errSaleNotFound)
	}
	// Under the lock no cancel commits: once these have had their restock, no
	// late one can add units on top of the stock set below (the restocked set
	// makes every later restock of an order a no-op).
	n, err := re.life.restockCanceled(ctx, sale, since)
	if err != nil {
		return nil, n, err
	}
	row, err := loadSale(ctx, tx, sale)
	return row, n, err
}

// stockPlan is what the stock of each region must account for besides
// MySQL's remaining: the units reserved in Redis, and the units MySQL's
// count is off by (in flight, or counted in sold and still reserved).
type stockPlan struct {
	reserved, extra map[string]int64
	// young counts reservations younger than staleAfter; decided those MySQL
	// has a row of (awaiting the write-back).
	young, decided int
}

func (re *reconciler) stockPlan(ctx context.Context, tx *sql.Tx, k *lua.Keys, msgs map[uint64]flashgate.Order, staleAfter time.Duration) (*stockPlan, error) {
	resv, err := lua.Reservations(ctx, re.rc, k)
	if err != nil {
		return nil, err
	}
	ids := make([]uint64, 0, len(resv)+len(msgs))
	for id := range resv {
		ids = append(ids, id)
	}
	for id := range msgs {
		if _, ok := resv[id]; !ok {
			ids = append(ids, id)
		}
	}
	rows, err := orderRows(ctx, tx, k.Sale, ids)
	if err != nil {
		return nil, err
	}
	p := &stockPlan{reserved: map[string]int64{}, extra: map[string]int64{}}
	// Ages on Redis's clock, which stamped the reservations (invariant 8).
	old, err := lua.Older(ctx, re.rc, k, resv, staleAfter)
	if err != nil {
		return nil, err
	}
	for id, rec := range resv {
		p.reserved[rec.Region] += rec.Quantity
		if !old[id] {
			p.young++
		}
		if st, ok := rows[id]; ok {
			p.decided++
			if st.status == flashgate.OrderConfirmed || st.status == flashgate.OrderPaid {
				// Counted in sold and still reserved until its write-back.
				p.extra[rec.Region] -= rec.Quantity
			}
		}
	}
	for id, m := range msgs {
		if _, ok := resv[id]; ok {
			continue
		}
		if _, ok := rows[id]; ok {
			continue
		}
		p.extra[m.Region] += m.Quantity // in flight, unknown to Redis
	}
	return p, nil
}

// busy answers why the full repair must wait ("" when it need not).
func (p *stockPlan) busy(staleAfter time.Duration) string {
	switch {
	case p.young > 0:
		return fmt.Sprintf("%d reservations are younger than %v", p.young, staleAfter)
	case p.decided > 0:
		return fmt.Sprintf("%d reservations await the write-back of MySQL's decision", p.decided)
	}
	return ""
}

func (p *stockPlan) plans(avail map[string]int64) []lua.StockPlan {
	plans := make([]lua.StockPlan, 0, len(avail))
	for _, r := range sortedKeys(avail) {
		plans = append(plans, lua.StockPlan{Region: r, Avail: avail[r], Extra: p.extra[r], Reserved: p.reserved[r]})
	}
	return plans
}

// stockChanged counts and logs the stock set from MySQL, and tells gateways
// of the regions that got units back.
func (re *reconciler) stockChanged(sale string, changes []lua.StockChange, onlyMissing bool) {
	for _, c := range changes {
		if c.After == nil {
			continue
		}
		re.ops.stockRepairs.Inc()
		re.log.Warn("stock set from MySQL", "sale", sale, "region", c.Region, "before", ptrString(c.Before),
			"after", *c.After, "only_missing", onlyMissing)
		if c.Before == nil || *c.After > *c.Before {
			re.events.publish(bus.SaleEvent{Type: bus.EventRestocked, SaleID: sale, Region: c.Region})
		}
	}
}

func ptrString(p *int64) string {
	if p == nil {
		return "absent"
	}
	return strconv.FormatInt(*p, 10)
}

// staleReservations republishes the stale reservations whose order MySQL
// lacks and writes back MySQL's decision on those it has.
func (re *reconciler) staleReservations(ctx context.Context, l *ledgerRead, staleAfter time.Duration, rep *ReconcileReport) error {
	sale := l.row.ID
	// A reservation's age is judged by the clock of the Redis master that
	// stamped it (admit.lua), never a gateway's against this backend's.
	old, err := lua.Older(ctx, re.rc, lua.KeysOf(&l.row.Sale), l.resv, staleAfter)
	if err != nil {
		return err
	}
	var stale []uint64
	for id := range l.resv {
		if old[id] {
			stale = append(stale, id)
		}
	}
	rep.Stale = len(stale)
	if len(stale) == 0 {
		return nil
	}
	slices.Sort(stale)
	rows, err := orderRows(ctx, re.db, sale, stale)
	if err != nil {
		return err
	}
	var decided []flashgate.Order
	var missing []uint64
	for _, id := range stale {
		st, ok := rows[id]
		switch {
		case !ok:
			missing = append(missing, id)
		case st.status == flashgate.OrderConfirmed || st.status == flashgate.OrderPaid || st.status == flashgate.OrderFailed:
			decided = append(decided, l.order(id))
		default:
			rep.Unsettled++
		}
	}
	if len(decided) > 0 {
		if err := re.writer.writeBack(ctx, sale, decided, rows); err != nil {
			return err
		}
		rep.Settled = len(decided)
		re.log.Warn("reconcile wrote back MySQL's decision on stale reservations", "sale", sale, "orders", len(decided))
	}
	if len(missing) == 0 {
		return nil
	}
	return re.republish(ctx, l, missing, rep)
}

// order is the reservation id as the order message it came from, its limit
// facts read back from its charges.
func (l *ledgerRead) order(id uint64) flashgate.Order {
	m := l.resv[id]
	m.FactsFromCharges(l.row.Limits)
	return m
}

// republish publishes again the stale reservations MySQL has no row for and
// the stream no message (Nats-Msg-Id: the order id, so a copy still in the
// dedup window is dropped).
func (re *reconciler) republish(ctx context.Context, l *ledgerRead, missing []uint64, rep *ReconcileReport) error {
	sale := l.row.ID
	inStream, err := re.stream.streamOrders(ctx, sale)
	if err != nil {
		return err
	}
	subject := bus.OrderSubject(re.cfg.NATS, sale)
	buf := make([]byte, 0, 256)
	for _, id := range missing {
		if _, ok := inStream[id]; ok {
			rep.Waiting++
			continue
		}
		m := l.order(id)
		ack, err := bus.PublishOrder(ctx, re.js, subject, &m, buf)
		if err != nil {
			return fmt.Errorf("republish %s/%d: %w", sale, id, err)
		}
		if ack.Duplicate {
			rep.RepublishDeduplicated++
		}
		rep.Republished++
		re.ops.republished.Inc()
	}
	if rep.Republished > 0 {
		re.log.Warn("reconcile republished stale reservations MySQL lacks", "sale", sale, "orders", rep.Republished,
			"deduplicated", rep.RepublishDeduplicated)
	}
	return nil
}

// orderRows reads the status and reason of those of ids MySQL has as orders
// of sale. A row of another sale under one of the ids is not that order's
// (the id was used twice): it is left out, as if MySQL lacked the order.
func orderRows(ctx context.Context, q queryer, sale string, ids []uint64) (map[uint64]settlement, error) {
	states, err := mysql.OrderStates(ctx, q, sale, ids)
	if err != nil {
		return nil, fmt.Errorf("order rows: %w", err)
	}
	res := make(map[uint64]settlement, len(states))
	for id, st := range states {
		if st.OtherSale {
			continue
		}
		res[id] = settlement{status: st.Status, reason: st.Reason, existed: true}
	}
	return res, nil
}

// warmRemaining is the warmer's in-flight count: what Redis should hold of a
// sale it is warming, total − sold − the units of orders in the stream that
// MySQL has no row of. It rebuilds the users hash from the same MySQL
// snapshot and adds the in-flight orders' units to it. The stream is read
// first, MySQL after in one snapshot, so an order acked in between is counted
// once, as sold.
func (re *reconciler) warmRemaining(ctx context.Context, row *saleRow, k *lua.Keys) (map[string]int64, error) {
	now, msgs, rows, err := re.inFlightSnapshot(ctx, row.ID, k)
	if err != nil {
		return nil, err
	}
	rem := now.Remaining()
	if len(msgs) == 0 {
		return rem, nil
	}
	flying, users, units := subtractInFlight(rem, msgs, rows)
	if err := re.restoreInFlight(ctx, &now.Sale, k, msgs, flying, users); err != nil {
		return nil, err
	}
	if len(flying) > 0 {
		re.log.Info("warm: orders in flight subtracted", "sale", row.ID, "orders", int64(len(flying)), "units", units)
	}
	return rem, nil
}

// inFlightSnapshot reads the sale's messages in the stream, then, in one
// MySQL snapshot, the sale row, the buyers' units (rebuilt into Redis) and
// which of those messages already have their order row.
func (re *reconciler) inFlightSnapshot(ctx context.Context, id string, k *lua.Keys) (*saleRow, map[uint64]flashgate.Order, map[uint64]settlement, error) {
	msgs, err := re.stream.streamOrders(ctx, id)
	if err != nil {
		return nil, nil, nil, err
	}
	tx, err := mysql.BeginSnapshot(ctx, re.db)
	if err != nil {
		return nil, nil, nil, err
	}
	defer tx.Rollback()
	now, err := loadSale(ctx, tx, id)
	if err != nil {
		return nil, nil, nil, err
	}
	// The buyers' units from the same snapshot as sold: an order acked since
	// the stream was read is counted there, once.
	if err := re.warmer.rebuildUsers(ctx, tx, k); err != nil {
		return nil, nil, nil, fmt.Errorf("users: %w", err)
	}
	if err := re.warmer.rebuildLimits(ctx, tx, k, &now.Sale); err != nil {
		return nil, nil, nil, fmt.Errorf("limits: %w", err)
	}
	if len(msgs) == 0 {
		return now, nil, nil, nil
	}
	ids := make([]uint64, 0, len(msgs))
	for id := range msgs {
		ids = append(ids, id)
	}
	rows, err := orderRows(ctx, tx, id, ids)
	if err != nil {
		return nil, nil, nil, err
	}
	_ = tx.Commit()
	return now, msgs, rows, nil
}

// subtractInFlight takes the units of the messages MySQL has no row for out
// of rem, and answers which those are and each buyer's units among them. A
// message for a region the sale lacks is left out: MySQL fails it.
func subtractInFlight(rem map[string]int64, msgs map[uint64]flashgate.Order, rows map[uint64]settlement) (flying []uint64, users map[string]int64, units int64) {
	users = map[string]int64{}
	for id, m := range msgs {
		if _, ok := rows[id]; ok {
			continue
		}
		if _, ok := rem[m.Region]; !ok {
			continue
		}
		rem[m.Region] -= m.Quantity
		users[m.UserID] += m.Quantity
		flying, units = append(flying, id), units+m.Quantity
	}
	return flying, users, units
}

// restoreInFlight writes the in-flight orders back into Redis: the buyers'
// units, and each order as a reservation again.
func (re *reconciler) restoreInFlight(ctx context.Context, sale *flashgate.Sale, k *lua.Keys, msgs map[uint64]flashgate.Order, flying []uint64, users map[string]int64) error {
	cmds := make(rueidis.Commands, 0, len(users)+3*len(msgs))
	for u, n := range users {
		cmds = append(cmds, re.rc.B().Hincrby().Key(k.Home(u).Users).Field(u).Increment(n).Build())
	}
	loc, err := sale.Location()
	if err != nil {
		return err
	}
	now := time.Now()
	for _, id := range flying {
		m := msgs[id]
		// The order is a reservation again, as admit left it, already claimed
		// (it is in the stream): a retry of its Idempotency-Key replays it, GET
		// shows it pending, and MySQL's word is written back to it — a failure
		// gives its units back to the stock, the buyer taken off above and its
		// limit charges back, as for any admitted order. Its charges count
		// again, as they did when it was admitted: the counters rebuilt from
		// MySQL lack it, and once it lands MySQL counts it too.
		r := m
		r.Status, r.Reason = lua.StatusProcessing, ""
		if m.Charges != "" {
			cs, err := flashgate.ParseCharges(m.Charges)
			if err != nil {
				return fmt.Errorf("order %d: %w", id, err)
			}
			for _, c := range cs {
				key := k.Limit(c.Window)
				if len(k.Buckets()) > 0 {
					key = k.Home(c.Subject).Limit(c.Window) // lua.LimitBucket's bucket
				}
				cmds = append(cmds, re.rc.B().Hincrby().Key(key).Field(c.Field()).Increment(c.Inc).Build())
				if end := flashgate.WindowEnd(c.Window, loc); !end.IsZero() {
					cmds = append(cmds, re.rc.B().Pexpire().Key(key).Milliseconds(flashgate.Charge{Ends: end}.TTL(now).Milliseconds()).Build())
				}
			}
			// A split sale: the charges counted away from the buyer's home are
			// held there under the order, as the admission leaves them.
			held, err := lua.HeldWrites(re.rc, k, &r, nil)
			if err != nil {
				return err
			}
			cmds = append(cmds, held...)
		}
		sid := strconv.FormatUint(id, 10)
		home := k.Home(m.UserID)
		cmds = append(cmds,
			re.rc.B().Hsetnx().Key(home.Resv).Field(sid).Value(lua.EncodeResv(&r)).Build(),
			re.rc.B().Hsetnx().Key(home.Orders).Field(sid).Value(lua.EncodeRecord(&r)).Build())
		if m.IdemKey != "" {
			// MySQL's order of the key, written first, wins: this one then
			// fails as a duplicate when it lands.
			cmds = append(cmds, re.rc.B().Hsetnx().Key(home.Idem).Field(m.UserID+"|"+m.IdemKey).Value(sid).Build())
		}
	}
	for _, r := range re.rc.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("users in flight: %w", err)
		}
	}
	return nil
}

// reconcileLoop reconciles every recent sale every reconcileEvery until ctx
// (the leader lock's) ends. A sale's ledger is repaired only once it has been
// still for repairQuiet.
func (re *reconciler) reconcileLoop(ctx context.Context) {
	type mark struct {
		fp    string
		since time.Time
	}
	marks := map[string]mark{}
	tick.Every(ctx, reconcileEvery, func(time.Time) {
		ids, err := mysql.RecentSaleIDs(ctx, re.db, time.Now().UTC().Add(-reconcileRecent))
		if err != nil {
			if ctx.Err() == nil {
				re.log.Warn("reconcile: listing sales", "err", err)
			}
			return
		}
		seen := make(map[string]bool, len(ids))
		for _, id := range ids {
			if ctx.Err() != nil {
				return
			}
			seen[id] = true
			opt := ReconcileOptions{restockSince: time.Now().Add(-restockWindow), quiet: func(fp string) bool {
				m, ok := marks[id]
				if !ok || m.fp != fp {
					marks[id] = mark{fp: fp, since: time.Now()}
					return false
				}
				return time.Since(m.since) >= repairQuiet
			}}
			sctx, cancel := context.WithTimeout(ctx, reconcileSaleTimeout)
			rep, err := re.ReconcileWith(sctx, id, opt)
			cancel()
			switch {
			case err != nil && ctx.Err() == nil:
				re.log.Warn("reconcile", "sale", id, "err", err)
			case err == nil && rep.changed():
				re.log.Info("reconciled", "sale", id, "rewarmed", rep.Rewarmed, "restored", len(rep.Restored),
					"republished", rep.Republished, "settled", rep.Settled, "repaired", rep.Repair.Done,
					"diff_before", rep.Before.Diff, "diff_after", rep.After.Diff)
			}
		}
		for id := range marks {
			if !seen[id] {
				delete(marks, id)
			}
		}
	})
}
