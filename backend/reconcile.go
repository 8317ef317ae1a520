package backend

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
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

// StockRepair is the ledger repair of one reconcile: a rebuild (rebuild.go).
type StockRepair struct {
	Done    bool   `json:"done"`
	Skipped string `json:"skipped,omitempty"`
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
	return r.Rewarmed || r.Republished > 0 || r.Settled > 0 || r.Restocked > 0 || r.Transfers > 0 || r.Repair.Done
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
	if err := re.restoreLost(ctx, id, before, rep); err != nil {
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

// restoreLost rebuilds the sale if Redis lost any of it: its meta, a
// bucket's, or a stock key.
func (re *reconciler) restoreLost(ctx context.Context, id string, before *ledgerRead, rep *ReconcileReport) error {
	var err error
	switch {
	case !before.meta || len(before.row.BucketTags) > 1:
		// (A split sale that kept its meta may have lost buckets: the warm
		// rebuilds them with the rest.)
		rep.Rewarmed, err = re.warmer.warm(ctx, id)
	case before.missingStock():
		_, err = re.warmer.rebuild(ctx, id, nil)
		if errors.Is(err, errRebuildBusy) {
			re.log.Warn("restoring lost stock keys postponed", "sale", id, "why", warmUnderWay)
			return nil
		}
		rep.Rewarmed = err == nil
	}
	return err
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
		_, err := re.warmer.rebuild(ctx, id, nil)
		switch {
		case errors.Is(err, errRebuildBusy):
			rep.Repair.Skipped = warmUnderWay
		case err != nil:
			return nil, err
		default:
			rep.Repair.Done = true
			re.ops.stockRepairs.Inc()
			re.events.publish(bus.SaleEvent{Type: bus.EventRestocked, SaleID: id})
		}
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

// Why a repair did nothing.
const (
	warmUnderWay = "a rebuild of the sale is under way"
	notWarm      = "the sale is not warm in Redis"
)

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

// reconcileLoop reconciles every recent sale every reconcileEvery until ctx
// (the leader lock's) ends. A sale's ledger is repaired only once it has been
// still for repairQuiet.
func (re *reconciler) reconcileLoop(ctx context.Context) {
	type mark struct {
		fp    string
		since time.Time
	}
	marks := map[string]mark{}
	// Who serves Redis, and the sales still to rebuild because it changed
	// (failover.go).
	var servers map[string]redisNode
	rebuild := map[string]bool{}
	tick.Every(ctx, reconcileEvery, func(time.Time) {
		ids, err := mysql.RecentSaleIDs(ctx, re.db, time.Now().UTC().Add(-reconcileRecent))
		if err != nil {
			if ctx.Err() == nil {
				re.log.Warn("reconcile: listing sales", "err", err)
			}
			return
		}
		if now, err := redisNodes(ctx, re.rc); err != nil {
			if ctx.Err() == nil {
				re.log.Warn("reconcile: who serves Redis", "err", err)
			}
		} else {
			if moved := serversMoved(servers, now); len(moved) > 0 {
				re.log.Warn("Redis failed over or restarted: rebuilding every recent sale", "nodes", moved, "sales", len(ids))
				for _, id := range ids {
					rebuild[id] = true
				}
				// The publish grace, once: an admission made before the
				// change has landed in the stream (or failed) by then.
				if err := sleep(ctx, re.cfg.PublishTimeout); err != nil {
					return
				}
			}
			servers = now
		}
		seen := make(map[string]bool, len(ids))
		for _, id := range ids {
			if ctx.Err() != nil {
				return
			}
			seen[id] = true
			if rebuild[id] {
				sctx, cancel := context.WithTimeout(ctx, reconcileSaleTimeout)
				_, err := re.warmer.rebuild(sctx, id, nil)
				cancel()
				switch {
				case err == nil:
					delete(rebuild, id)
					re.log.Info("sale rebuilt after Redis changed hands", "sale", id)
				case ctx.Err() == nil:
					re.log.Warn("rebuild after Redis changed hands (again next pass)", "sale", id, "err", err)
				}
			}
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
				re.log.Info("reconciled", "sale", id, "rewarmed", rep.Rewarmed,
					"republished", rep.Republished, "settled", rep.Settled, "repaired", rep.Repair.Done,
					"diff_before", rep.Before.Diff, "diff_after", rep.After.Diff)
			}
		}
		for id := range marks {
			if !seen[id] {
				delete(marks, id)
			}
		}
		for id := range rebuild {
			if !seen[id] {
				delete(rebuild, id)
			}
		}
	})
}
