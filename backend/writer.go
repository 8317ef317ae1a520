package backend

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/metrics"
)

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
// DESIGN.md §8 and writes the outcome back to Redis. It knows nothing of NATS, so
// tests drive it directly.
type orderWriter struct {
	db      *sql.DB
	rc      rueidis.Client
	scripts *lua.Scripts
	log     *slog.Logger
	metrics *metrics.Backend
	now     func() time.Time

	mu     sync.Mutex
	shapes map[string]*saleShape

	// restocked is told of units a release put back on sale (nil: nobody).
	restocked func(sale, region string)
}

func newOrderWriter(db *sql.DB, rc rueidis.Client, scripts *lua.Scripts, log *slog.Logger, m *metrics.Backend) *orderWriter {
	return &orderWriter{db: db, rc: rc, scripts: scripts, log: log, metrics: m, now: time.Now, shapes: map[string]*saleShape{}}
}

// saleShape is the part of a sale that never changes after creation, cached so
// the fast path spends no round trip on it.
type saleShape struct {
	limit   int64
	regions map[string]bool // empty for a sale without regions
	limits  []flashgate.Limit
	// spec and loc work an order's charges out (flashgate.Sale.Charges) from
	// the limits and time zone MySQL holds.
	spec *flashgate.Sale
	loc  *time.Location
}

// usageKey is one row of limit_usage of a sale.
type usageKey struct {
	lim     int
	window  string
	subject string
}

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
	s = &saleShape{limit: row.PerUserLimit, regions: make(map[string]bool, len(row.Regions)), limits: row.Limits,
		spec: &spec, loc: loc}
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
func (w *orderWriter) process(ctx context.Context, sale string, msgs []flashgate.Order) ([]outcome, error) {
	out := make([]outcome, len(msgs))
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
			uniq = append(uniq, m)
		}
	}

	ids := make([]uint64, len(uniq))
	for i, m := range uniq {
		ids[i] = m.ID
	}
	claims, err := w.scripts.Claim(ctx, w.rc, lua.KeysFor(sale, nil), ids)
	if err != nil {
		return nil, err
	}
	todo := uniq[:0:0]
	for i, m := range uniq {
		if claims[i] == lua.ClaimReleased {
			out[first[m.ID]] = outcome{ID: m.ID, Dropped: true}
			continue
		}
		// ClaimOK, or ClaimUnknown (Redis lost the order): MySQL's guard decides.
		todo = append(todo, m)
	}

	if len(todo) > 0 {
		res, err := w.writeRetrying(ctx, sale, todo)
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
	for attempt := 1; ; attempt++ {
		res, err := w.write(ctx, sale, orders)
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
func (w *orderWriter) write(ctx context.Context, sale string, orders []flashgate.Order) (map[uint64]settlement, error) {
	shape, err := w.shape(ctx, w.db, sale)
	if err != nil {
		return nil, err
	}
	res, ok, err := w.fastPath(ctx, sale, shape, orders)
	if err != nil || ok {
		return res, err
	}
	return w.fallback(ctx, sale, shape, orders)
}

func beginRC(ctx context.Context, db *sql.DB) (*sql.Tx, error) {
	return db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
}

// existing reads which orders MySQL has already: their status and reason.
func existing(ctx context.Context, tx *sql.Tx, orders []flashgate.Order) (map[uint64]settlement, error) {
	res := make(map[uint64]settlement, len(orders))
	for part := range slices.Chunk(orders, sqlChunk) {
		args := make([]any, len(part))
		for i, o := range part {
			args[i] = o.ID
		}
		rows, err := tx.QueryContext(ctx, `SELECT id, status, reason FROM orders WHERE id IN (`+placeholders(len(part))+`)`, args...)
		if err != nil {
			return nil, fmt.Errorf("existing orders: %w", err)
		}
		for rows.Next() {
			var id uint64
			var st, reason string
			if err := rows.Scan(&id, &st, &reason); err != nil {
				rows.Close()
				return nil, fmt.Errorf("existing orders: %w", err)
			}
			res[id] = settlement{status: flashgate.OrderStatus(st), reason: reason, existed: true}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("existing orders: %w", err)
		}
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
	type key struct{ user, idem string }
	holder := map[key]uint64{}
	var users, idems []any
	for _, o := range todo {
		if o.IdemKey != "" {
			users, idems = append(users, o.UserID), append(idems, o.IdemKey)
		}
	}
	if len(users) == 0 {
		return nil
	}
	for i := 0; i < len(users); i += sqlChunk {
		j := min(i+sqlChunk, len(users))
		args := append(append([]any{sale}, users[i:j]...), idems[i:j]...)
		rows, err := tx.QueryContext(ctx, `SELECT id, user_id, idem_key FROM orders WHERE sale_id = ?
			AND user_id IN (`+placeholders(j-i)+`) AND idem_key IN (`+placeholders(j-i)+`)`, args...)
		if err != nil {
			return fmt.Errorf("batch of %s: idempotency keys: %w", sale, err)
		}
		for rows.Next() {
			var id uint64
			var k key
			if err := rows.Scan(&id, &k.user, &k.idem); err != nil {
				rows.Close()
				return fmt.Errorf("batch of %s: idempotency keys: %w", sale, err)
			}
			holder[k] = id
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("batch of %s: idempotency keys: %w", sale, err)
		}
	}
	// todo is oldest first: the first of the batch to claim a key holds it.
	for _, o := range todo {
		if o.IdemKey == "" {
			continue
		}
		k := key{o.UserID, o.IdemKey}
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

// fastPath admits the whole batch with one guard per counter: the sale row, each
// region row, each user row. ok is false (and nothing is committed) when any
// guard refuses: the fallback then decides order by order.
func (w *orderWriter) fastPath(ctx context.Context, sale string, shape *saleShape, orders []flashgate.Order) (map[uint64]settlement, bool, error) {
	tx, err := beginRC(ctx, w.db)
	if err != nil {
		return nil, false, fmt.Errorf("batch of %s: %w", sale, err)
	}
	defer tx.Rollback()
	// Read before the sale row lock: a concurrent redelivery committing these ids
	// after this read makes the order insert fail with a duplicate key, and the
	// retry finds them here.
	res, err := existing(ctx, tx, orders)
	if err != nil {
		return nil, false, err
	}
	todo := fresh(orders, res)
	if len(todo) == 0 {
		return res, true, tx.Commit()
	}
	if shape == nil {
		return nil, false, nil
	}
	if err := duplicates(ctx, tx, sale, todo, res); err != nil {
		return nil, false, err
	}
	var units int64
	regions := map[string]int64{}
	users := map[string]int64{}
	usage := map[usageKey]int64{}
	for _, o := range fresh(todo, res) {
		if !shape.fits(o.Region) {
			return nil, false, nil
		}
		cs, ok := shape.charges(o)
		if !ok {
			return nil, false, nil
		}
		for _, c := range cs {
			usage[usageKey{c.Limit, c.Window, c.Subject}] += c.Inc
		}
		units += o.Quantity
		if o.Region != "" {
			regions[o.Region] += o.Quantity
		}
		users[o.UserID] += o.Quantity
	}
	now := w.now().UTC()

	// The sale guard; it also takes the sale row lock, which serialises every
	// batch of this sale across all backends.
	r, err := tx.ExecContext(ctx, `UPDATE sales SET sold = sold + ?, updated_at = ?
		WHERE id = ? AND closed = 0 AND sold + ? <= total`, units, now, sale, units)
	if ok, err := changed(r, err); !ok || err != nil {
		return nil, false, err
	}
	for _, region := range sortedKeys(regions) {
		n := regions[region]
		r, err := tx.ExecContext(ctx, `UPDATE sale_regions SET sold = sold + ?
			WHERE sale_id = ? AND region = ? AND sold + ? <= total`, n, sale, region, n)
		if ok, err := changed(r, err); !ok || err != nil {
			return nil, false, err
		}
	}

	// The user guard: every buyer's units in MySQL plus this batch's within the limit.
	names := sortedKeys(users)
	for part := range slices.Chunk(names, sqlChunk) {
		args := make([]any, 0, len(part)+1)
		args = append(args, sale)
		for _, u := range part {
			args = append(args, u)
		}
		rows, err := tx.QueryContext(ctx, `SELECT user_id, units FROM user_purchases
			WHERE sale_id = ? AND user_id IN (`+placeholders(len(part))+`) FOR UPDATE`, args...)
		if err != nil {
			return nil, false, fmt.Errorf("batch of %s: users: %w", sale, err)
		}
		over := false
		for rows.Next() {
			var u string
			var held int64
			if err := rows.Scan(&u, &held); err != nil {
				rows.Close()
				return nil, false, fmt.Errorf("batch of %s: users: %w", sale, err)
			}
			if held+users[u] > shape.limit {
				over = true
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, false, fmt.Errorf("batch of %s: users: %w", sale, err)
		}
		if over {
			return nil, false, nil
		}
	}
	for _, n := range users {
		if n > shape.limit {
			return nil, false, nil // a buyer new to MySQL, over the limit within this batch
		}
	}
	for part := range slices.Chunk(names, sqlChunk) {
		args := make([]any, 0, 3*len(part))
		for _, u := range part {
			args = append(args, sale, u, users[u])
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO user_purchases (sale_id, user_id, units) VALUES `+
			rowsOf(len(part), 3)+` ON DUPLICATE KEY UPDATE units = units + VALUES(units)`, args...); err != nil {
			return nil, false, fmt.Errorf("batch of %s: users: %w", sale, err)
		}
	}

	if ok, err := w.chargeBatch(ctx, tx, sale, shape, usage); !ok || err != nil {
		return nil, false, err
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

// chargeBatch adds a batch's usage to limit_usage and checks every row it
// touched against its limit, under those rows' locks (the sale row lock,
// taken first, already serialises the sale's batches); false when any is
// over, and the caller rolls back.
func (w *orderWriter) chargeBatch(ctx context.Context, tx *sql.Tx, sale string, shape *saleShape, usage map[usageKey]int64) (bool, error) {
	if len(usage) == 0 {
		return true, nil
	}
	for k, n := range usage {
		if n > shape.limits[k.lim].Max {
			return false, nil
		}
	}
	keys := sortedUsage(usage)
	for part := range slices.Chunk(keys, sqlChunk) {
		args := make([]any, 0, 6*len(part))
		for _, k := range part {
			args = append(args, sale, k.lim, k.window, k.subject, string(shape.limits[k.lim].Dimension), usage[k])
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO limit_usage (sale_id, lim, window_id, subject, dimension, used)
			VALUES `+rowsOf(len(part), 6)+` ON DUPLICATE KEY UPDATE used = used + VALUES(used)`, args...); err != nil {
			return false, fmt.Errorf("batch of %s: limits: %w", sale, err)
		}
		var over int
		q := strings.Builder{}
		args = args[:0]
		args = append(args, sale)
		for i, k := range part {
			if i > 0 {
				q.WriteString(" OR ")
			}
			q.WriteString("(lim = ? AND window_id = ? AND subject = ? AND used > ?)")
			args = append(args, k.lim, k.window, k.subject, shape.limits[k.lim].Max)
		}
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM limit_usage WHERE sale_id = ? AND (`+q.String()+`)`,
			args...).Scan(&over); err != nil {
			return false, fmt.Errorf("batch of %s: limits: %w", sale, err)
		}
		if over > 0 {
			return false, nil
		}
	}
	return true, nil
}

// sortedUsage lists usage's rows in one order for every writer, so that two
// never lock them crosswise.
func sortedUsage(usage map[usageKey]int64) []usageKey {
	keys := make([]usageKey, 0, len(usage))
	for k := range usage {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b usageKey) int {
		if a.lim != b.lim {
			return a.lim - b.lim
		}
		if c := strings.Compare(a.window, b.window); c != 0 {
			return c
		}
		return strings.Compare(a.subject, b.subject)
	})
	return keys
}

// fallback decides order by order, oldest first, under the sale row lock: each
// order passes the user, region and sale guards or is rolled back to its
// savepoint and inserted failed with the reason.
func (w *orderWriter) fallback(ctx context.Context, sale string, shape *saleShape, orders []flashgate.Order) (map[uint64]settlement, error) {
	tx, err := beginRC(ctx, w.db)
	if err != nil {
		return nil, fmt.Errorf("batch of %s: %w", sale, err)
	}
	defer tx.Rollback()
	var limit int64
	var closed bool
	err = tx.QueryRowContext(ctx, `SELECT per_user_limit, closed FROM sales WHERE id = ? FOR UPDATE`, sale).Scan(&limit, &closed)
	known := true
	if errors.Is(err, sql.ErrNoRows) {
		known = false
	} else if err != nil {
		return nil, fmt.Errorf("batch of %s: lock sale: %w", sale, err)
	}
	if known && shape == nil {
		// Created since the fast path looked.
		if shape, err = w.shape(ctx, tx, sale); err != nil {
			return nil, err
		}
	}
	res, err := existing(ctx, tx, orders)
	if err != nil {
		return nil, err
	}
	todo := fresh(orders, res)
	if err := duplicates(ctx, tx, sale, todo, res); err != nil {
		return nil, err
	}
	now := w.now().UTC()
	fail := func(o flashgate.Order, reason string) {
		res[o.ID] = settlement{status: flashgate.OrderFailed, reason: reason}
	}
	// guard runs one guard statement; false means it refused (0 rows changed).
	guard := func(query string, args ...any) (bool, error) {
		r, err := tx.ExecContext(ctx, query, args...)
		return changed(r, err)
	}
	for _, o := range todo {
		if _, dup := res[o.ID]; dup {
			continue
		}
		switch {
		case !known || shape == nil:
			fail(o, flashgate.ReasonUnknownSale)
			continue
		case closed:
			fail(o, flashgate.ReasonSaleClosed)
			continue
		case !shape.fits(o.Region):
			fail(o, reasonUnknownRegion)
			continue
		}
		if _, err := tx.ExecContext(ctx, `SAVEPOINT fg_order`); err != nil {
			return nil, fmt.Errorf("batch of %s: %w", sale, err)
		}
		reason := ""
		if _, err := tx.ExecContext(ctx, `INSERT IGNORE INTO user_purchases (sale_id, user_id, units) VALUES (?, ?, 0)`,
			sale, o.UserID); err != nil {
			return nil, fmt.Errorf("batch of %s: user %s: %w", sale, o.UserID, err)
		}
		ok, err := guard(`UPDATE user_purchases SET units = units + ?
			WHERE sale_id = ? AND user_id = ? AND units + ? <= ?`, o.Quantity, sale, o.UserID, o.Quantity, limit)
		if err != nil {
			return nil, fmt.Errorf("batch of %s: user %s: %w", sale, o.UserID, err)
		}
		if !ok {
			reason = flashgate.ReasonLimitReached
		}
		if reason == "" {
			if reason, err = w.chargeOne(ctx, tx, sale, shape, o); err != nil {
				return nil, err
			}
		}
		if reason == "" && o.Region != "" {
			ok, err := guard(`UPDATE sale_regions SET sold = sold + ?
				WHERE sale_id = ? AND region = ? AND sold + ? <= total`, o.Quantity, sale, o.Region, o.Quantity)
			if err != nil {
				return nil, fmt.Errorf("batch of %s: region %s: %w", sale, o.Region, err)
			}
			if !ok {
				reason = flashgate.ReasonSoldOut
			}
		}
		if reason == "" {
			ok, err := guard(`UPDATE sales SET sold = sold + ?, updated_at = ?
				WHERE id = ? AND sold + ? <= total`, o.Quantity, now, sale, o.Quantity)
			if err != nil {
				return nil, fmt.Errorf("batch of %s: sale guard: %w", sale, err)
			}
			if !ok {
				reason = flashgate.ReasonSoldOut
			}
		}
		if reason != "" {
			if _, err := tx.ExecContext(ctx, `ROLLBACK TO SAVEPOINT fg_order`); err != nil {
				return nil, fmt.Errorf("batch of %s: %w", sale, err)
			}
			fail(o, reason)
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
		if _, err := tx.ExecContext(ctx, `INSERT IGNORE INTO limit_usage (sale_id, lim, window_id, subject, dimension, used)
			VALUES (?, ?, ?, ?, ?, 0)`, sale, c.Limit, c.Window, c.Subject, string(l.Dimension)); err != nil {
			return "", fmt.Errorf("batch of %s: limit %d: %w", sale, c.Limit, err)
		}
		r, err := tx.ExecContext(ctx, `UPDATE limit_usage SET used = used + ?
			WHERE sale_id = ? AND lim = ? AND window_id = ? AND subject = ? AND used + ? <= ?`,
			c.Inc, sale, c.Limit, c.Window, c.Subject, c.Inc, l.Max)
		if ok, err := changed(r, err); err != nil {
			return "", fmt.Errorf("batch of %s: limit %d: %w", sale, c.Limit, err)
		} else if !ok {
			return flashgate.LimitReason(l.Dimension), nil
		}
	}
	return "", nil
}

// insertOrders writes the rows of orders with the status res gives each.
func insertOrders(ctx context.Context, tx *sql.Tx, orders []flashgate.Order, res map[uint64]settlement, now time.Time) error {
	for part := range slices.Chunk(orders, sqlChunk) {
		args := make([]any, 0, 12*len(part))
		for _, o := range part {
			s := res[o.ID]
			var idem any
			if o.IdemKey != "" && s.reason != flashgate.ReasonDuplicate {
				idem = o.IdemKey // a duplicate's row leaves the key to the order that holds it
			}
			args = append(args, o.ID, o.SaleID, o.UserID, o.Quantity, o.Region, string(s.status), s.reason, idem,
				o.CreatedAt.UTC(), o.ExpiresAt.UTC(), now, o.Charges)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, sale_id, user_id, quantity, region, status, reason,
			idem_key, created_at, expires_at, updated_at, charges) VALUES `+rowsOf(len(part), 12), args...); err != nil {
			return fmt.Errorf("insert orders: %w", err)
		}
	}
	return nil
}

// writeBack tells Redis what MySQL decided: confirmed (and already settled)
// orders end their reservation with their status; failed orders give their units
// back to Redis stock and the buyer's counter, exactly once (release.lua).
func (w *orderWriter) writeBack(ctx context.Context, sale string, orders []flashgate.Order, res map[uint64]settlement) error {
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
				rec, ok, err := lua.Order(ctx, w.rc, lua.KeysFor(sale, nil), o.ID)
				if err != nil {
					return err
				}
				if ok {
					region, charges = rec.Region, rec.Charges
				}
			}
			r, err := w.scripts.Release(ctx, w.rc, regionKeys(sale, region), o.ID, region, charges, lua.ReleaseBackend, s.reason)
			if err != nil {
				return err
			}
			if r.Released && w.restocked != nil {
				w.restocked(sale, region)
			}
			if s.first != 0 {
				// A replay of the key must answer the order that holds it.
				k := lua.KeysFor(sale, nil)
				if err := w.rc.Do(ctx, w.rc.B().Hset().Key(k.Idem).FieldValue().
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
	k := lua.KeysFor(sale, nil)
	for part := range slices.Chunk(settled, confirmChunk) {
		if _, err := w.scripts.Confirm(ctx, w.rc, k, part); err != nil {
			return err
		}
	}
	return nil
}

// regionKeys are the sale's keys with just the stock key of region, which is all
// release needs.
func regionKeys(sale, region string) *lua.Keys {
	if region == "" {
		return lua.KeysFor(sale, nil)
	}
	return lua.KeysFor(sale, []string{region})
}

// changed turns a guard UPDATE's result into "did it pass". Every guard adds at
// least one unit, so a matched row is always a changed row.
func changed(r sql.Result, err error) (bool, error) {
	if err != nil {
		return false, err
	}
	n, err := r.RowsAffected()
	return n > 0, err
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?,", n), ",")
}

// rowsOf is "(?,?),(?,?)" for n rows of cols columns.
func rowsOf(n, cols int) string {
	row := "(" + placeholders(cols) + "),"
	return strings.TrimSuffix(strings.Repeat(row, n), ",")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

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
