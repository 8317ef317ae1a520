package backend

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/metrics"
	"github.com/flashgate/flashgate/mysql"
)

// errClaimStale: a rebuild committed between a batch's claims and its
// decision, so the claims' answers were read in an older epoch (an order
// 'unknown' then may be installed now, a 'released' one pending). Nothing is
// decided; the batch waits as in an outage and is claimed again
// (spec/admission.pml: BUG_NO_CLAIM_EPOCH).
var errClaimStale = errors.New("claimed before the sale's last rebuild")

// reasonUnknownRegion fails an order whose region the sale does not have (or a
// regionless order of a sale with regions). The gateway checks regions against
// Redis meta, so it only happens when Redis and MySQL disagree about the sale.
const reasonUnknownRegion = "unknown_region"

// Bounds of one SQL statement's lists and of one Redis confirm call.
const (
	sqlChunk     = 1000
	confirmChunk = 1000
)

// Retries of a batch transaction that hit a deadlock, a lock wait timeout or a
// concurrent redelivery's duplicate key.
const (
	txRetries   = 8
	txRetryBase = 5 * time.Millisecond
)

// outcome is what became of one message of a batch.
type outcome struct {
	ID     uint64
	Status flashgate.OrderStatus // MySQL's status; "" when Dropped
	Reason string                // failed orders: why
	// Dropped: the gateway released the order (its publish "failed", the buyer was
	// told 503); nothing was written and the message is only acked.
	Dropped bool
	// Existed: MySQL had the row already (a redelivery); it was not counted again.
	Existed bool
	// Copy: an earlier message of the batch carried the same order; this one
	// shares its outcome.
	Copy bool
}

// orderWriter turns admitted orders into MySQL rows under the row guard of
// docs/design.md §8 and writes the outcome back to Redis. It knows nothing of NATS, so
// tests drive it directly.
type orderWriter struct {
	db      *sql.DB
	rc      rueidis.Client
	scripts *lua.Scripts
	log     *slog.Logger
	metrics *metrics.Backend
	now     func() time.Time

	// trust bounds what a message may say (distrust.go).
	trust trust

	mu     sync.Mutex
	shapes map[string]*saleShape

	// restocked is told of units a release put back on sale (nil: nobody).
	restocked func(sale, region string)
}

func newOrderWriter(db *sql.DB, rc rueidis.Client, scripts *lua.Scripts, log *slog.Logger, m *metrics.Backend) *orderWriter {
	d := config.Default()
	return &orderWriter{db: db, rc: rc, scripts: scripts, log: log, metrics: m, now: time.Now, shapes: map[string]*saleShape{},
		trust: trust{skew: d.Backend.ClockSkew, publish: d.Gateway.PublishTimeout, payBy: d.Orders.PaymentTimeout}}
}

// saleShape is what the writer's guards need of a sale, cached so the fast
// path spends no round trip on it: its regions and time zone never change
// after creation; its per-user limit and its limits' maxima change by PATCH
// (adminAPI.updateSale, on any backend), so the batch guard holds only while
// the sale row still has the limits the shape was built from
// (mysql.GuardSoldAt), and the order-by-order fallback reads them under the
// row lock and builds the shape again when they moved.
type saleShape struct {
	limit   int64
	regions map[string]bool // empty for a sale without regions
	limits  []flashgate.Limit
	// limitsText is the limits column the shape was built from, as
	// GuardSoldAt compares it.
	limitsText string
	// spec and loc work an order's charges out (flashgate.Sale.Charges) from
	// the limits and time zone MySQL holds.
	spec *flashgate.Sale
	loc  *time.Location
}

// current reports whether the shape was built from the limits l.
func (s *saleShape) current(l mysql.SaleLimits) bool {
	return s.limit == l.PerUser && s.limitsText == l.Text
}

// usageKey is one row of limit_usage of a sale.
type usageKey = mysql.UsageKey

// charges works out what the order counts against the sale's limits, from
// the order's own facts (user, phone, device, ip, address hash, creation
// time) and the sale's limits and time zone as MySQL holds them, the way the
// gateway does. false when the message carries other charges (or lacks a
// fact a limit needs): whoever made it cannot be trusted with the limits, so
// the order fails (bad_charges). The message's charges are still what the
// admission counted in Redis, and what the release there gives back.
func (s *saleShape) charges(o flashgate.Order) ([]flashgate.Charge, bool) {
	if len(s.limits) == 0 {
		return nil, o.Charges == ""
	}
	cs, err := s.spec.Charges(o.Subjects(), o.Quantity, o.CreatedAt, s.loc)
	if err != nil || flashgate.EncodeCharges(cs) != o.Charges {
		return nil, false
	}
	return cs, true
}

// fits reports whether an order of region belongs to the sale.
func (s *saleShape) fits(region string) bool {
	if len(s.regions) == 0 {
		return region == ""
	}
	return s.regions[region]
}

// shape returns the sale's shape, nil for a sale MySQL does not know (not
// cached: it may be created later).
func (w *orderWriter) shape(ctx context.Context, q queryer, sale string) (*saleShape, error) {
	w.mu.Lock()
	s := w.shapes[sale]
	w.mu.Unlock()
	if s != nil {
		return s, nil
	}
	return w.loadShape(ctx, q, sale)
}

// loadShape reads the sale's shape from MySQL (on q: under the row lock when
// q is a transaction that holds it) and caches it, replacing what was cached.
func (w *orderWriter) loadShape(ctx context.Context, q queryer, sale string) (*saleShape, error) {
	row, err := loadSale(ctx, q, sale)
	if errors.Is(err, errSaleNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	loc, err := row.Location()
	if err != nil {
		return nil, fmt.Errorf("sale %s: time zone: %w", sale, err)
	}
	spec := row.Sale
	s := &saleShape{limit: row.PerUserLimit, regions: make(map[string]bool, len(row.Regions)), limits: row.Limits,
		limitsText: row.LimitsText, spec: &spec, loc: loc}
	for r := range row.Regions {
		s.regions[r] = true
	}
	w.mu.Lock()
	w.shapes[sale] = s
	w.mu.Unlock()
	return s, nil
}

// settlement is MySQL's word on one order.
type settlement struct {
	status  flashgate.OrderStatus
	reason  string
	existed bool
	// first, for an order failed as a duplicate (ReasonDuplicate): the order
	// that holds its Idempotency-Key, which a replay must answer.
	first uint64
}

// process writes one batch of one sale's orders: claim them in Redis, write them
// to MySQL in one guarded transaction (retried on deadlocks and duplicate keys),
// write each outcome back to Redis. It answers one outcome per message, in
// order. An error means nothing may be acked: some of the batch may be
// committed, and a redelivery finds those rows and only writes them back.
// Every message counts as stored in the stream now (processStored).
func (w *orderWriter) process(ctx context.Context, sale string, msgs []flashgate.Order) ([]outcome, error) {
	return w.processStored(ctx, sale, msgs, nil)
}

// processStored is process with JetStream's time of each message (stored[i]
// of msgs[i]; nil or a zero time: now), which the writer checks an order's
// created time against (distrust.go).
func (w *orderWriter) processStored(ctx context.Context, sale string, msgs []flashgate.Order, stored []time.Time) ([]outcome, error) {
	out := make([]outcome, len(msgs))
	in := &inflow{stored: make(map[uint64]time.Time, len(msgs))}
	// A message can repeat within a batch (a republish outside the dedup window):
	// the first copy is processed, the others share its outcome.
	first := make(map[uint64]int, len(msgs))
	var uniq []flashgate.Order
	for i, m := range msgs {
		if m.SaleID != sale {
			return nil, fmt.Errorf("batch of %s: order %d is of sale %q", sale, m.ID, m.SaleID)
		}
		if _, dup := first[m.ID]; !dup {
			first[m.ID] = i
			// The pay-by time is the backend's, whatever the message says.
			m.ExpiresAt = m.CreatedAt.Add(w.trust.payBy)
			uniq = append(uniq, m)
			if i < len(stored) {
				in.stored[m.ID] = stored[i]
			}
		}
	}

	ids := make([]uint64, len(uniq))
	for i, m := range uniq {
		ids[i] = m.ID
	}
	k, err := keysOf(ctx, w.db, sale)
	if err != nil {
		return nil, err
	}
	// A split sale's orders are claimed in their buyers' home buckets.
	claims := make([]lua.ClaimStatus, len(ids))
	err = lua.ByHome(k, len(uniq), func(i int) string { return uniq[i].UserID }, func(b *lua.Keys, at []int) error {
		part := make([]uint64, len(at))
		for j, i := range at {
			part[j] = ids[i]
		}
		st, epoch, err := w.scripts.ClaimEpoch(ctx, w.rc, b, part)
		for j, i := range at {
			if j < len(st) {
				claims[i] = st[j]
			}
		}
		if err == nil {
			if in.epoch != "" && epoch != in.epoch {
				in.split = true
			}
			in.epoch = epoch
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if slices.Contains(claims, lua.ClaimCold) {
		// Redis lost the sale, or a rebuild is under way: nothing is decided
		// until the rebuild has read the stream (a release meanwhile leaves a
		// tombstone it keeps). The batch waits like one whose Redis is away.
		return nil, fmt.Errorf("claim in %s: %w", sale, errSaleCold)
	}
	todo := uniq[:0:0]
	for i, m := range uniq {
		if claims[i] == lua.ClaimReleased {
			out[first[m.ID]] = outcome{ID: m.ID, Dropped: true}
			continue
		}
		// ClaimOK, or ClaimUnknown (Redis has no trace of it: written only
		// when it was admitted before the sale's last rebuild, distrust.go).
		if claims[i] == lua.ClaimUnknown {
			if in.unknown == nil {
				in.unknown = map[uint64]bool{}
			}
			in.unknown[m.ID] = true
		}
		todo = append(todo, m)
	}

	if len(todo) > 0 {
		res, err := w.writeIn(ctx, sale, todo, in)
		if err != nil {
			return nil, err
		}
		if err := w.writeBack(ctx, sale, todo, res); err != nil {
			return nil, err
		}
		for _, m := range todo {
			r := res[m.ID]
			out[first[m.ID]] = outcome{ID: m.ID, Status: r.status, Reason: r.reason, Existed: r.existed}
		}
	}
	for i, m := range msgs {
		out[i] = out[first[m.ID]]
		out[i].Copy = i != first[m.ID]
	}
	return out, nil
}

// retryable reports whether a batch transaction may simply run again.
func retryable(err error) bool {
	switch mysqlErrno(err) {
	case erLockDeadlock, erLockWaitTimeout, erDupEntry:
		return true
	}
	return false
}

func (w *orderWriter) writeRetrying(ctx context.Context, sale string, orders []flashgate.Order) (map[uint64]settlement, error) {
	return w.writeIn(ctx, sale, orders, nil)
}

// writeIn is writeRetrying with what the stream said of the orders (nil:
// stored now, each known to Redis).
func (w *orderWriter) writeIn(ctx context.Context, sale string, orders []flashgate.Order, in *inflow) (map[uint64]settlement, error) {
	for attempt := 1; ; attempt++ {
		res, err := w.write(ctx, sale, orders, in)
		if err == nil {
			return res, nil
		}
		w.metrics.MySQLError()
		if !retryable(err) || attempt == txRetries {
			return res, err
		}
		w.log.Debug("batch transaction retried", "sale", sale, "attempt", attempt, "err", err)
		d := txRetryBase << (attempt - 1)
		d += rand.N(d)
		if err := sleep(ctx, d); err != nil {
			return nil, err
		}
	}
}

// write runs the fast path and, when a guard refuses the batch, the fallback.
func (w *orderWriter) write(ctx context.Context, sale string, orders []flashgate.Order, in *inflow) (map[uint64]settlement, error) {
	shape, err := w.shape(ctx, w.db, sale)
	if err != nil {
		return nil, err
	}
	for again := true; ; again = false {
		res, ok, err := w.fastPath(ctx, sale, shape, orders, in)
		if err != nil || ok {
			return res, err
		}
		res, err = w.fallback(ctx, sale, shape, orders, in, again)
		if !errors.Is(err, errShapeMoved) {
			return res, err
		}
		// A PATCH changed the sale's limits since the shape was read: the
		// batch tries the fast path once more, with the shape MySQL has now.
		if shape, err = w.shape(ctx, w.db, sale); err != nil {
			return nil, err
		}
	}
}

// errShapeMoved is the fallback's answer when the cached shape's limits are
// not the sale row's: it rebuilt the shape and wrote nothing.
var errShapeMoved = errors.New("the sale's limits changed since its shape was cached")

func beginRC(ctx context.Context, db *sql.DB) (*sql.Tx, error) {
	return mysql.Begin(ctx, db)
}

// existing reads which orders of sale MySQL has already: their status and
// reason. An order whose id MySQL holds for an order of another sale (the
// id was made twice) can have no row (the id is the primary key): it fails,
// ReasonIDTaken, with no row written, and its units go back to Redis.
func existing(ctx context.Context, tx *sql.Tx, sale string, orders []flashgate.Order) (map[uint64]settlement, error) {
	ids := make([]uint64, len(orders))
	for i, o := range orders {
		ids[i] = o.ID
	}
	states, err := mysql.OrderStates(ctx, tx, sale, ids)
	if err != nil {
		return nil, fmt.Errorf("existing orders: %w", err)
	}
	res := make(map[uint64]settlement, len(orders))
	for id, st := range states {
		if st.OtherSale {
			res[id] = settlement{status: flashgate.OrderFailed, reason: flashgate.ReasonIDTaken}
			continue
		}
		res[id] = settlement{status: st.Status, reason: st.Reason, existed: true}
	}
	return res, nil
}

// duplicates fails (in res) every order of todo whose Idempotency-Key another
// order of the same sale and user holds: one MySQL has, or an older one of
// todo. Only a retry admitted again after Redis lost the key's first order
// meets this; the unique key orders_sale_user_idem makes it hold across
// concurrent batches (the loser's insert fails with a duplicate key and its
// transaction runs again, finding the winner here).
func duplicates(ctx context.Context, tx *sql.Tx, sale string, todo []flashgate.Order, res map[uint64]settlement) error {
	var keys []mysql.IdemKey
	for _, o := range todo {
		if o.IdemKey != "" {
			keys = append(keys, mysql.IdemKey{User: o.UserID, Idem: o.IdemKey})
		}
	}
	if len(keys) == 0 {
		return nil
	}
	holder, err := mysql.KeyHolders(ctx, tx, sale, keys)
	if err != nil {
		return fmt.Errorf("batch of %s: idempotency keys: %w", sale, err)
	}
	// todo is oldest first: the first of the batch to claim a key holds it.
	for _, o := range todo {
		if o.IdemKey == "" {
			continue
		}
		k := mysql.IdemKey{User: o.UserID, Idem: o.IdemKey}
		first, held := holder[k]
		switch {
		case !held:
			holder[k] = o.ID
		case first != o.ID:
			res[o.ID] = settlement{status: flashgate.OrderFailed, reason: flashgate.ReasonDuplicate, first: first}
		}
	}
	return nil
}

// fresh lists the orders not yet in res, oldest id (= earliest admission) first.
func fresh(orders []flashgate.Order, res map[uint64]settlement) []flashgate.Order {
	var out []flashgate.Order
	for _, o := range orders {
		if _, ok := res[o.ID]; !ok {
			out = append(out, o)
		}
	}
	slices.SortFunc(out, func(a, b flashgate.Order) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return out
}

// batchTotals is what a batch adds to each counter.
type batchTotals struct {
	units   int64
	regions map[string]int64
	users   map[string]int64
	usage   map[usageKey]int64
}

// totals sums the batch's orders not yet settled in res per counter; false
// when an order does not fit the sale (region, charges): the fallback then
// fails it alone.
func totals(shape *saleShape, orders []flashgate.Order, res map[uint64]settlement) (batchTotals, bool) {
	t := batchTotals{regions: map[string]int64{}, users: map[string]int64{}, usage: map[usageKey]int64{}}
	for _, o := range orders {
		if _, settled := res[o.ID]; settled {
			continue
		}
		if !shape.fits(o.Region) {
			return t, false
		}
		cs, ok := shape.charges(o)
		if !ok {
			return t, false
		}
		for _, c := range cs {
			t.usage[usageKey{Lim: c.Limit, Window: c.Window, Subject: c.Subject}] += c.Inc
		}
		t.units += o.Quantity
		if o.Region != "" {
			t.regions[o.Region] += o.Quantity
		}
		t.users[o.UserID] += o.Quantity
	}
	return t, true
}

// fastPath admits the whole batch with one guard per counter: the sale row, each
// region row, each user row. ok is false (and nothing is committed) when any
// guard refuses: the fallback then decides order by order.
//
// An order the message checks doubt (distrust.go), or one Redis does not
// know, sends the batch to the fallback too: it decides them under the row
// lock, with the sale as MySQL holds it then.
func (w *orderWriter) fastPath(ctx context.Context, sale string, shape *saleShape, orders []flashgate.Order, in *inflow) (map[uint64]settlement, bool, error) {
	tx, err := beginRC(ctx, w.db)
	if err != nil {
		return nil, false, fmt.Errorf("batch of %s: %w", sale, err)
	}
	defer tx.Rollback()
	// Read before the sale row lock: a concurrent redelivery committing these ids
	// after this read makes the order insert fail with a duplicate key, and the
	// retry finds them here.
	res, err := existing(ctx, tx, sale, orders)
	if err != nil {
		return nil, false, err
	}
	todo := fresh(orders, res)
	if len(todo) == 0 {
		return res, true, tx.Commit()
	}
	if shape == nil || in.anyUnknown(todo) {
		return nil, false, nil
	}
	now := w.now().UTC()
	for _, o := range todo {
		if reason, _ := w.trust.doubt(shape, o, in, now, time.Time{}); reason != "" {
			return nil, false, nil
		}
	}
	if err := duplicates(ctx, tx, sale, todo, res); err != nil {
		return nil, false, err
	}
	t, ok := totals(shape, todo, res)
	if !ok {
		return nil, false, nil
	}
	if ok, err := w.guardBatch(ctx, tx, sale, shape, t, now); !ok || err != nil {
		return nil, false, err
	}
	// The sale row is locked now: no rebuild commits until this does.
	if in != nil && in.epoch != "" {
		epoch, err := mysql.SaleEpoch(ctx, tx, sale)
		if err != nil {
			return nil, false, fmt.Errorf("batch of %s: %w", sale, err)
		}
		if in.stale(epoch) {
			return nil, false, fmt.Errorf("batch of %s: claimed in epoch %s, the sale is in %d: %w", sale, in.epoch, epoch, errClaimStale)
		}
	}
	for _, o := range todo {
		if _, dup := res[o.ID]; !dup {
			res[o.ID] = settlement{status: flashgate.OrderConfirmed}
		}
	}
	if err := insertOrders(ctx, tx, todo, res, now); err != nil {
		return nil, false, err
	}
	if err := tx.Commit(); err != nil {
		return nil, false, fmt.Errorf("batch of %s: commit: %w", sale, err)
	}
	return res, true, nil
}

// guardBatch runs the batch's guards in the lock order every writer keeps:
// the sale row (which serialises every batch of this sale across all
// backends, and refuses a shape whose limits the row no longer has), its
// regions, its buyers, its limit counters. false when one refuses.
func (w *orderWriter) guardBatch(ctx context.Context, tx *sql.Tx, sale string, shape *saleShape, t batchTotals, now time.Time) (bool, error) {
	if ok, err := mysql.GuardSoldAt(ctx, tx, sale, t.units, now, shape.limit, shape.limitsText); !ok || err != nil {
		return false, err
	}
	for _, region := range sortedKeys(t.regions) {
		if ok, err := mysql.GuardRegion(ctx, tx, sale, region, t.regions[region]); !ok || err != nil {
			return false, err
		}
	}
	if ok, err := guardBuyers(ctx, tx, sale, shape.limit, t.users); !ok || err != nil {
		return false, err
	}
	return w.chargeBatch(ctx, tx, sale, shape, t.usage)
}

// guardBuyers is the user guard: every buyer's units in MySQL plus this
// batch's within the limit.
func guardBuyers(ctx context.Context, tx *sql.Tx, sale string, limit int64, users map[string]int64) (bool, error) {
	held, err := mysql.LockBuyers(ctx, tx, sale, sortedKeys(users))
	if err != nil {
		return false, fmt.Errorf("batch of %s: users: %w", sale, err)
	}
	for u, n := range users {
		if held[u]+n > limit {
			return false, nil // a buyer new to MySQL counts from zero
		}
	}
	if err := mysql.AddBuyerUnits(ctx, tx, sale, users); err != nil {
		return false, fmt.Errorf("batch of %s: users: %w", sale, err)
	}
	return true, nil
}

// chargeBatch adds a batch's usage to limit_usage and checks every row it
// touched against its limit; false when any is over, and the caller rolls
// back.
func (w *orderWriter) chargeBatch(ctx context.Context, tx *sql.Tx, sale string, shape *saleShape, usage map[usageKey]int64) (bool, error) {
	if len(usage) == 0 {
		return true, nil
	}
	for k, n := range usage {
		if n > shape.limits[k.Lim].Max {
			return false, nil
		}
	}
	keys := mysql.SortedUsage(usage)
	rows := make([]mysql.Usage, len(keys))
	for i, k := range keys {
		l := shape.limits[k.Lim]
		rows[i] = mysql.Usage{UsageKey: k, Dimension: l.Dimension, Inc: usage[k], Max: l.Max}
	}
	ok, err := mysql.ChargeBatch(ctx, tx, sale, rows)
	if err != nil {
		return false, fmt.Errorf("batch of %s: limits: %w", sale, err)
	}
	return ok, nil
}

// fallback decides order by order, oldest first, under the sale row lock: each
// order passes the user, region and sale guards or is rolled back to its
// savepoint and inserted failed with the reason. The guards use the limits
// the row holds under that lock: a shape built before a PATCH changed them
// is built again.
//
// retry: a shape found out of date is answered with errShapeMoved (once
// rebuilt and cached), so that the caller tries the fast path again with it.
func (w *orderWriter) fallback(ctx context.Context, sale string, shape *saleShape, orders []flashgate.Order, in *inflow, retry bool) (map[uint64]settlement, error) {
	tx, err := beginRC(ctx, w.db)
	if err != nil {
		return nil, fmt.Errorf("batch of %s: %w", sale, err)
	}
	defer tx.Rollback()
	lim, known, err := mysql.LockSaleLimits(ctx, tx, sale)
	if err != nil {
		return nil, fmt.Errorf("batch of %s: lock sale: %w", sale, err)
	}
	if known && in.stale(lim.Epoch) {
		return nil, fmt.Errorf("batch of %s: claimed in epoch %s, the sale is in %d: %w", sale, in.epoch, lim.Epoch, errClaimStale)
	}
	limit, closedAt := lim.PerUser, lim.ClosedAt
	reloaded := false
	if known && (shape == nil || !shape.current(lim)) {
		// Created since the fast path looked, or its limits changed since
		// the shape was read.
		moved := shape != nil
		if shape, err = w.loadShape(ctx, tx, sale); err != nil {
			return nil, err
		}
		if moved && retry {
			return nil, errShapeMoved
		}
		reloaded = true
	}
	res, err := existing(ctx, tx, sale, orders)
	if err != nil {
		return nil, err
	}
	todo := fresh(orders, res)
	now := w.now().UTC()
	if known && shape != nil {
		// The message checks first: an order no admission made takes no
		// Idempotency-Key from an honest one (duplicates below skips it).
		if reloaded, err = w.distrust(ctx, tx, sale, &shape, reloaded, todo, in, now, lim.RebuiltAt, res); err != nil {
			return nil, err
		}
	}
	if err := duplicates(ctx, tx, sale, unsettled(todo, res), res); err != nil {
		return nil, err
	}
	for _, o := range todo {
		if _, dup := res[o.ID]; dup {
			continue
		}
		reason := refusal(known && shape != nil, closedAt, shape, o)
		if reason == "" {
			if reason, err = w.guardOne(ctx, tx, sale, shape, limit, o, now); err != nil {
				return nil, err
			}
		}
		if reason != "" {
			res[o.ID] = settlement{status: flashgate.OrderFailed, reason: reason}
			continue
		}
		res[o.ID] = settlement{status: flashgate.OrderConfirmed}
	}
	if err := insertOrders(ctx, tx, todo, res, now); err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("batch of %s: commit: %w", sale, err)
	}
	return res, nil
}

// distrust settles in res, failed, every order of todo that no admission can
// have made (trust.doubt), and logs each. A doubt met with a shape cached
// before this transaction is checked again with the sale as MySQL holds it
// under the row lock (a PATCH may have moved its window or per_order_max):
// *shape is then replaced, and reloaded answers so.
func (w *orderWriter) distrust(ctx context.Context, tx *sql.Tx, sale string, shape **saleShape, reloaded bool,
	todo []flashgate.Order, in *inflow, now, rebuiltAt time.Time, res map[uint64]settlement) (bool, error) {
	for _, o := range todo {
		reason, check := w.trust.doubt(*shape, o, in, now, rebuiltAt)
		if reason != "" && !reloaded {
			s, err := w.loadShape(ctx, tx, sale)
			if err != nil {
				return reloaded, err
			}
			if s != nil {
				*shape, reloaded = s, true
				reason, check = w.trust.doubt(*shape, o, in, now, rebuiltAt)
			}
		}
		if reason != flashgate.ReasonUnadmitted {
			continue // "" or a region the sale lacks: refusal's word, as before
		}
		w.log.Warn("order refused: no admission can have made its message", "sale", sale, "order", o.ID,
			"user", o.UserID, "check", check, "quantity", o.Quantity, "created", o.CreatedAt,
			"stored", in.storedAt(o.ID, now), "unknown_to_redis", in.isUnknown(o.ID), "rebuilt_at", rebuiltAt)
		res[o.ID] = settlement{status: flashgate.OrderFailed, reason: reason}
	}
	return reloaded, nil
}

// unsettled lists the orders of todo res has no word on yet.
func unsettled(todo []flashgate.Order, res map[uint64]settlement) []flashgate.Order {
	out := todo[:0:0]
	for _, o := range todo {
		if _, ok := res[o.ID]; !ok {
			out = append(out, o)
		}
	}
	return out
}

// closeGrace is how much later than the sale's close an order may have been
// admitted and still be honoured. Both times are Redis's: closed_at is when
// Redis closed the sale (lua.CloseAt), and an order's created time is its
// admission's, stamped by admit.lua with the TIME of the master that ran it.
// On a sale of one tag that is one master's clock, so an order Redis
// admitted is never later than the close; the grace covers a split sale,
// whose buckets' masters each have their own (NTP-kept) clock. A gateway's
// clock plays no part.
const closeGrace = 5 * time.Second

// refusal is why an order fails before any guard runs ("" if it may try). An
// order admitted before its sale closed is a 202 already given: it is written
// like any other (the stock guards still hold it to the units there are). One
// admitted after it came from a Redis that never heard of the close.
func refusal(known bool, closedAt time.Time, shape *saleShape, o flashgate.Order) string {
	switch {
	case !known:
		return flashgate.ReasonUnknownSale
	case !closedAt.IsZero() && o.CreatedAt.After(closedAt.Add(closeGrace)):
		return flashgate.ReasonSaleClosed
	case !shape.fits(o.Region):
		return reasonUnknownRegion
	}
	return ""
}

// guardOne runs one order's guards (user, limits, region, sale) after a
// savepoint; on a refusal it rolls back to the savepoint and answers why.
func (w *orderWriter) guardOne(ctx context.Context, tx *sql.Tx, sale string, shape *saleShape, limit int64, o flashgate.Order, now time.Time) (string, error) {
	if err := mysql.Savepoint(ctx, tx); err != nil {
		return "", fmt.Errorf("batch of %s: %w", sale, err)
	}
	reason := ""
	ok, err := mysql.GuardBuyer(ctx, tx, sale, o.UserID, o.Quantity, limit)
	if err != nil {
		return "", fmt.Errorf("batch of %s: user %s: %w", sale, o.UserID, err)
	}
	if !ok {
		reason = flashgate.ReasonLimitReached
	}
	if reason == "" {
		if reason, err = w.chargeOne(ctx, tx, sale, shape, o); err != nil {
			return "", err
		}
	}
	if reason == "" && o.Region != "" {
		ok, err := mysql.GuardRegion(ctx, tx, sale, o.Region, o.Quantity)
		if err != nil {
			return "", fmt.Errorf("batch of %s: region %s: %w", sale, o.Region, err)
		}
		if !ok {
			reason = flashgate.ReasonSoldOut
		}
	}
	if reason == "" {
		ok, err := mysql.GuardSold(ctx, tx, sale, o.Quantity, now, false)
		if err != nil {
			return "", fmt.Errorf("batch of %s: sale guard: %w", sale, err)
		}
		if !ok {
			reason = flashgate.ReasonSoldOut
		}
	}
	if reason != "" {
		if err := mysql.RollbackOrder(ctx, tx); err != nil {
			return "", fmt.Errorf("batch of %s: %w", sale, err)
		}
	}
	return reason, nil
}

// chargeOne counts one order against each limit it is charged to, each under
// the guard UPDATE … WHERE used + n <= max; it answers why it failed ("" if it
// passed). The caller rolls back to the order's savepoint on a failure.
func (w *orderWriter) chargeOne(ctx context.Context, tx *sql.Tx, sale string, shape *saleShape, o flashgate.Order) (string, error) {
	cs, ok := shape.charges(o)
	if !ok {
		w.log.Warn("order refused: its charges are not what its facts and the sale's limits make", "sale", sale,
			"order", o.ID, "user", o.UserID, "charges", o.Charges)
		return flashgate.ReasonBadCharges, nil
	}
	for _, c := range cs {
		l := shape.limits[c.Limit]
		ok, err := mysql.GuardLimit(ctx, tx, sale, mysql.Usage{UsageKey: usageKey{Lim: c.Limit, Window: c.Window, Subject: c.Subject},
			Dimension: l.Dimension, Inc: c.Inc, Max: l.Max})
		if err != nil {
			return "", fmt.Errorf("batch of %s: limit %d: %w", sale, c.Limit, err)
		} else if !ok {
			return flashgate.LimitReason(l.Dimension), nil
		}
	}
	return "", nil
}

// insertOrders writes the rows of orders with the status res gives each. It
// sets them on orders (the caller's own list, from fresh) rather than on a
// copy of every order.
func insertOrders(ctx context.Context, tx *sql.Tx, orders []flashgate.Order, res map[uint64]settlement, now time.Time) error {
	for i := range orders {
		o := &orders[i]
		s := res[o.ID]
		o.Status, o.Reason = s.status, s.reason
		if s.reason == flashgate.ReasonDuplicate || s.reason == flashgate.ReasonUnadmitted {
			// A duplicate's row leaves the key to the order that holds it;
			// an unadmitted one's holds no key a buyer's retry could meet.
			o.IdemKey = ""
		}
	}
	return mysql.InsertOrders(ctx, tx, orders, now)
}

// writeBack tells Redis what MySQL decided: confirmed (and already settled)
// orders end their reservation with their status; failed orders give their units
// back to Redis stock and the buyer's counter, exactly once (release.lua).
func (w *orderWriter) writeBack(ctx context.Context, sale string, orders []flashgate.Order, res map[uint64]settlement) error {
	k, err := epochKeys(ctx, w.db, sale)
	if err != nil {
		return err
	}
	var settled []flashgate.Order
	for _, o := range orders {
		s := res[o.ID]
		rec := o
		rec.Status, rec.Reason = s.status, s.reason
		if s.status == flashgate.OrderFailed {
			region, charges := o.Region, o.Charges
			if s.reason == flashgate.ReasonBadCharges {
				// The message's charges are not to be trusted: the release
				// gives back what the admission counted, as Redis recorded it.
				rec, ok, err := lua.Order(ctx, w.rc, k.Home(o.UserID), o.ID)
				if err != nil {
					return err
				}
				if ok {
					region, charges = rec.Region, rec.Charges
				}
			}
			r, err := w.scripts.Release(ctx, w.rc, k.HomeFor(o.UserID, region), o.ID, region, charges, lua.ReleaseBackend, s.reason)
			if err != nil {
				return err
			}
			if r.Released && w.restocked != nil {
				w.restocked(sale, region)
			}
			if s.first != 0 {
				// A replay of the key must answer the order that holds it.
				if err := w.rc.Do(ctx, w.rc.B().Hset().Key(k.Home(o.UserID).Idem).FieldValue().
					FieldValue(o.UserID+"|"+o.IdemKey, strconv.FormatUint(s.first, 10)).Build()).Error(); err != nil {
					return err
				}
			}
			if !r.Unknown {
				continue
			}
			// Redis has no record of the order (it lost its data): write the
			// failed status and reason so the buyer's GET shows them.
		}
		settled = append(settled, rec)
	}
	for part := range slices.Chunk(settled, confirmChunk) {
		if _, err := w.scripts.Confirm(ctx, w.rc, k, part); err != nil && !errors.Is(err, lua.ErrStaleEpoch) {
			return err
		}
	}
	return nil
}

// sortedKeys lists m's keys in order (the lock order of every writer).
func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
