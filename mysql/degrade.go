package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/flashgate/flashgate"
)

// The degraded lane (docs/degrade.md): while a sale's Redis shard is
// unreachable, a sale with degrade: mysql has its purchases decided here, one
// at a time under the sale row lock, with the admission script's checks in
// its order (lua/admit.lua), and the admitted order written confirmed in the
// same transaction as its counters and the sale's stale mark.

// LaneResult is the lane's answer to one purchase.
type LaneResult struct {
	Outcome flashgate.LaneOutcome
	// OrderID: the order admitted, or the one a replay answers.
	OrderID uint64
	// Status: a replay's order's status in MySQL.
	Status flashgate.OrderStatus
	// Remaining: units left in the stock checked (sold out: before; admitted: after).
	Remaining int64
	// Wait: not started, how long until the sale starts.
	Wait time.Duration
	// Limit: limit reached, -1 for per_user_limit, else the index of the
	// sale's limit; Held is what the subject holds in it.
	Limit int
	Held  int64
}

// LanePurchase is one purchase for the lane: the order as the gateway would
// publish it (ID from its lease, CreatedAt its now, the buyer's facts; its
// Charges are worked out here again from the facts), and the orders that are
// in the stream and not yet written (InFlight: admitted by Redis before it
// went away; MySQL's rows of them are found and left out). Their units are
// held back as Redis held them, so that when they land they fit.
type LanePurchase struct {
	Order    flashgate.Order
	InFlight []flashgate.Order
	// RedisUp: the backend reached Redis a moment ago. A sale that is not
	// stale is then left to the fast path (flashgate.LaneFresh): the lane is for while
	// Redis is away, or while Redis has not yet been warmed with its orders.
	RedisUp bool
	// NextID makes the order's id (the lane's own order-id node).
	NextID func() uint64
}

// inFlightTotals is what the stream's unwritten orders hold.
type inFlightTotals struct {
	units   int64
	regions map[string]int64
	user    int64
	usage   map[UsageKey]int64
}

// DecideDegraded decides p under the sale row lock and, if admitted, writes
// the order confirmed with its counters and marks the sale stale (sales.stale
// + 1), in one transaction. An error means nothing was written.
func DecideDegraded(ctx context.Context, db *sql.DB, p LanePurchase, now time.Time) (LaneResult, error) {
	o := p.Order
	tx, err := Begin(ctx, db)
	if err != nil {
		return LaneResult{}, err
	}
	defer tx.Rollback()
	// The sale row lock, as every writer of the sale's counters takes it first.
	row, err := loadSale(ctx, tx, o.SaleID, " FOR UPDATE")
	if errors.Is(err, ErrSaleNotFound) {
		return LaneResult{Outcome: flashgate.LaneUnknownSale}, nil
	}
	if err != nil {
		return LaneResult{}, err
	}
	if p.RedisUp && row.Stale == 0 {
		return LaneResult{Outcome: flashgate.LaneFresh}, nil
	}
	if o.ID == 0 {
		o.ID = p.NextID()
	}
	// The lane decides on MySQL's clock, read inside its transaction
	// (invariant 8): the sale's window, the limits' windows and the order's
	// time are judged by it, never by the gateway's now. The payment
	// deadline keeps the gateway's distance from the order's time.
	var dbNow time.Time
	if err := tx.QueryRowContext(ctx, `SELECT UTC_TIMESTAMP(3)`).Scan(&dbNow); err != nil {
		return LaneResult{}, fmt.Errorf("lane %s: clock: %w", row.ID, err)
	}
	pay := o.ExpiresAt.Sub(o.CreatedAt)
	o.CreatedAt = dbNow.UTC()
	o.ExpiresAt = o.CreatedAt.Add(pay)
	res, charges, err := laneChecks(ctx, tx, row, &o, p.InFlight)
	if err != nil || res.Outcome != flashgate.LaneAdmitted {
		return res, err
	}
	if err := laneWrite(ctx, tx, row, &o, charges, now); errors.Is(err, errLaneDuplicateID) {
		return LaneResult{Outcome: flashgate.LaneDuplicateID, OrderID: o.ID}, nil
	} else if err != nil {
		return LaneResult{}, err
	}
	if err := tx.Commit(); err != nil {
		return LaneResult{}, fmt.Errorf("lane %s: commit: %w", o.SaleID, err)
	}
	res.OrderID = o.ID
	return res, nil
}

// laneChecks are admit.lua's checks, in its order, on MySQL's counters less
// what is in flight. It fills o.Charges.
func laneChecks(ctx context.Context, tx *sql.Tx, row *SaleRow, o *flashgate.Order, inFlight []flashgate.Order) (LaneResult, []flashgate.Charge, error) {
	if o.IdemKey != "" {
		holders, err := KeyHolders(ctx, tx, row.ID, []IdemKey{{User: o.UserID, Idem: o.IdemKey}})
		if err != nil {
			return LaneResult{}, nil, fmt.Errorf("lane %s: idempotency key: %w", row.ID, err)
		}
		if first, ok := holders[IdemKey{User: o.UserID, Idem: o.IdemKey}]; ok {
			st, err := OrderStateOf(ctx, tx, row.ID, first)
			if err != nil {
				return LaneResult{}, nil, fmt.Errorf("lane %s: order %d: %w", row.ID, first, err)
			}
			return LaneResult{Outcome: flashgate.LaneReplayed, OrderID: first, Status: st.Status}, nil, nil
		}
		// The key's order may be in the stream still, admitted by Redis before
		// it went away: that order is the key's, not a second one.
		for _, f := range inFlight {
			if f.UserID == o.UserID && f.IdemKey == o.IdemKey {
				return LaneResult{Outcome: flashgate.LaneReplayed, OrderID: f.ID, Status: flashgate.OrderPending}, nil, nil
			}
		}
	}
	nowMS := o.CreatedAt.UnixMilli()
	switch {
	case row.Closed:
		return LaneResult{Outcome: flashgate.LaneEnded}, nil, nil
	case row.Paused:
		return LaneResult{Outcome: flashgate.LanePaused}, nil, nil
	case nowMS < row.StartsAt.UnixMilli():
		return LaneResult{Outcome: flashgate.LaneNotStarted, Wait: time.Duration(row.StartsAt.UnixMilli()-nowMS) * time.Millisecond}, nil, nil
	case nowMS >= row.EndsAt.UnixMilli():
		return LaneResult{Outcome: flashgate.LaneEnded}, nil, nil
	case o.Quantity < 1 || o.Quantity > row.PerOrderMax:
		return LaneResult{Outcome: flashgate.LaneBadQuantity}, nil, nil
	}
	if (len(row.Regions) == 0) != (o.Region == "") {
		return LaneResult{Outcome: flashgate.LaneBadOrder}, nil, nil
	}
	if _, ok := row.Regions[o.Region]; o.Region != "" && !ok {
		return LaneResult{Outcome: flashgate.LaneBadOrder}, nil, nil
	}
	loc, err := row.Location()
	if err != nil {
		return LaneResult{}, nil, fmt.Errorf("lane %s: time zone: %w", row.ID, err)
	}
	charges, err := row.Charges(o.Subjects(), o.Quantity, o.CreatedAt, loc)
	if err != nil {
		return LaneResult{Outcome: flashgate.LaneBadOrder}, nil, nil
	}
	o.Charges = flashgate.EncodeCharges(charges)
	fly, err := inFlightOf(ctx, tx, row, o.UserID, inFlight)
	if err != nil {
		return LaneResult{}, nil, err
	}

	held, err := buyerUnits(ctx, tx, row.ID, o.UserID)
	if err != nil {
		return LaneResult{}, nil, err
	}
	held += fly.user
	if held+o.Quantity > row.PerUserLimit {
		return LaneResult{Outcome: flashgate.LaneLimitReached, Limit: -1, Held: held}, nil, nil
	}
	for _, c := range charges {
		used, err := limitUsed(ctx, tx, row.ID, c)
		if err != nil {
			return LaneResult{}, nil, err
		}
		used += fly.usage[UsageKey{Lim: c.Limit, Window: c.Window, Subject: c.Subject}]
		if used+c.Inc > row.Limits[c.Limit].Max {
			return LaneResult{Outcome: flashgate.LaneLimitReached, Limit: c.Limit, Held: used}, nil, nil
		}
	}
	left := row.Total - row.Sold - fly.units
	if o.Region != "" {
		left = min(left, row.Regions[o.Region]-row.RegionSold[o.Region]-fly.regions[o.Region])
	}
	if left < o.Quantity {
		return LaneResult{Outcome: flashgate.LaneSoldOut, Remaining: max(left, 0)}, nil, nil
	}
	return LaneResult{Outcome: flashgate.LaneAdmitted, Remaining: left - o.Quantity}, charges, nil
}

// inFlightOf sums the in-flight orders of the sale that MySQL has no row of.
func inFlightOf(ctx context.Context, tx *sql.Tx, row *SaleRow, user string, orders []flashgate.Order) (inFlightTotals, error) {
	t := inFlightTotals{regions: map[string]int64{}, usage: map[UsageKey]int64{}}
	if len(orders) == 0 {
		return t, nil
	}
	ids := make([]uint64, len(orders))
	for i, m := range orders {
		ids[i] = m.ID
	}
	rows, err := OrderStates(ctx, tx, row.ID, ids)
	if err != nil {
		return t, fmt.Errorf("lane %s: orders in flight: %w", row.ID, err)
	}
	for _, m := range orders {
		if st, written := rows[m.ID]; (written && !st.OtherSale) || m.SaleID != row.ID {
			continue
		}
		t.units += m.Quantity
		if m.Region != "" {
			t.regions[m.Region] += m.Quantity
		}
		if m.UserID == user {
			t.user += m.Quantity
		}
		cs, err := flashgate.ParseCharges(m.Charges)
		if err != nil {
			continue // MySQL fails it (bad_charges): it holds nothing
		}
		for _, c := range cs {
			t.usage[UsageKey{Lim: c.Limit, Window: c.Window, Subject: c.Subject}] += c.Inc
		}
	}
	return t, nil
}

func buyerUnits(ctx context.Context, tx *sql.Tx, sale, user string) (int64, error) {
	var n int64
	err := tx.QueryRowContext(ctx, `SELECT units FROM user_purchases WHERE sale_id = ? AND user_id = ? FOR UPDATE`, sale, user).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("lane %s: user %s: %w", sale, user, err)
	}
	return n, nil
}

func limitUsed(ctx context.Context, tx *sql.Tx, sale string, c flashgate.Charge) (int64, error) {
	var n int64
	err := tx.QueryRowContext(ctx, `SELECT used FROM limit_usage WHERE sale_id = ? AND lim = ? AND window_id = ? AND subject = ? FOR UPDATE`,
		sale, c.Limit, c.Window, c.Subject).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("lane %s: limit %d: %w", sale, c.Limit, err)
	}
	return n, nil
}

// errLaneDuplicateID: the order id is taken (the insert met the primary key;
// the idempotency key was checked under the lock).
var errLaneDuplicateID = errors.New("order id taken")

// errLaneGuard is a guard that refused what the checks let through: the
// checks and the guards disagree, and nothing is written.
var errLaneGuard = errors.New("a guard refused what the lane's checks admitted")

// laneWrite counts the admitted order under the writer's guards, in its lock
// order (sale, region, buyer, limits), marks the sale stale (with the sale's
// guard) and inserts the order confirmed.
func laneWrite(ctx context.Context, tx *sql.Tx, row *SaleRow, o *flashgate.Order, charges []flashgate.Charge, now time.Time) error {
	now = now.UTC()
	guards := []func() (bool, error){
		// GuardSold's guard, and the stale mark in the same statement.
		func() (bool, error) {
			return changed(tx.ExecContext(ctx, `UPDATE sales SET sold = sold + ?, stale = stale + 1, updated_at = ?
				WHERE id = ? AND closed = 0 AND sold + ? <= total`, o.Quantity, now, row.ID, o.Quantity))
		},
		func() (bool, error) {
			if o.Region == "" {
				return true, nil
			}
			return GuardRegion(ctx, tx, row.ID, o.Region, o.Quantity)
		},
		func() (bool, error) { return GuardBuyer(ctx, tx, row.ID, o.UserID, o.Quantity, row.PerUserLimit) },
	}
	for _, c := range charges {
		l := row.Limits[c.Limit]
		u := Usage{UsageKey: UsageKey{Lim: c.Limit, Window: c.Window, Subject: c.Subject}, Dimension: l.Dimension, Inc: c.Inc, Max: l.Max}
		guards = append(guards, func() (bool, error) { return GuardLimit(ctx, tx, row.ID, u) })
	}
	for _, g := range guards {
		ok, err := g()
		if err != nil {
			return fmt.Errorf("lane %s: %w", row.ID, err)
		}
		if !ok {
			return fmt.Errorf("lane %s order %d: %w", row.ID, o.ID, errLaneGuard)
		}
	}
	o.Status, o.Reason = flashgate.OrderConfirmed, ""
	err := InsertOrders(ctx, tx, []flashgate.Order{*o}, now)
	if Errno(err) == ErDupEntry {
		return errLaneDuplicateID
	}
	if err != nil {
		return fmt.Errorf("lane %s: %w", row.ID, err)
	}
	return nil
}

// StaleSales lists the sales the lane wrote orders of since Redis last
// matched MySQL, with their stale counts.
func StaleSales(ctx context.Context, db Querier) (map[string]int64, error) {
	rows, err := db.QueryContext(ctx, `SELECT id, stale FROM sales WHERE stale > 0`)
	if err != nil {
		return nil, fmt.Errorf("stale sales: %w", err)
	}
	out := map[string]int64{}
	err = scanRows(rows, func() error {
		var id string
		var n int64
		err := rows.Scan(&id, &n)
		out[id] = n
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("stale sales: %w", err)
	}
	return out, nil
}

// LockStale takes the sale row lock and reads its stale count; the leader
// holds it while it warms the sale again, so no order of the sale (lane or
// stream) commits meanwhile.
func LockStale(ctx context.Context, tx Querier, sale string) (int64, error) {
	var n int64
	err := tx.QueryRowContext(ctx, `SELECT stale FROM sales WHERE id = ? FOR UPDATE`, sale).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("sale %s: %w", sale, ErrSaleNotFound)
	}
	return n, err
}

// ClearStale marks the sale fresh again: Redis has been warmed from MySQL.
// The caller holds the sale row (LockStale).
func ClearStale(ctx context.Context, tx Querier, sale string) error {
	_, err := tx.ExecContext(ctx, `UPDATE sales SET stale = 0 WHERE id = ?`, sale)
	return err
}

// laneNodeLock names the MySQL lock of lane node n of database db (a named
// lock is the server's: two databases on one server have nodes of their own).
func laneNodeLock(db string, n int) string {
	name := "fg_lane_" + strconv.Itoa(n) + "_" + db
	return name[:min(len(name), 64)]
}

// LaneNode is an order-id node of the degraded lane, held with a MySQL named
// lock (GET_LOCK) on a connection of its own: the lock lives as long as that
// session, and Held says whether it still does.
type LaneNode struct {
	Node int
	conn *sql.Conn
	name string
}

// LeaseLaneNode takes the first free of the lane's nodes (first .. first+n-1).
func LeaseLaneNode(ctx context.Context, db *sql.DB, first, n int) (*LaneNode, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	var dbName sql.NullString
	if err := conn.QueryRowContext(ctx, `SELECT DATABASE()`).Scan(&dbName); err != nil {
		conn.Close()
		return nil, fmt.Errorf("lane node: %w", err)
	}
	for i := range n {
		name := laneNodeLock(dbName.String, first+i)
		var got sql.NullInt64
		if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, 0)`, name).Scan(&got); err != nil {
			conn.Close()
			return nil, fmt.Errorf("lane node: %w", err)
		}
		if got.Int64 == 1 {
			return &LaneNode{Node: first + i, conn: conn, name: name}, nil
		}
	}
	conn.Close()
	return nil, errors.New("lane node: every lane node is taken")
}

// Held reports whether the node's lock is still this session's.
func (l *LaneNode) Held(ctx context.Context) bool {
	var mine sql.NullInt64
	err := l.conn.QueryRowContext(ctx, `SELECT IS_USED_LOCK(?) = CONNECTION_ID()`, l.name).Scan(&mine)
	return err == nil && mine.Int64 == 1
}

// Close frees the node.
func (l *LaneNode) Close() error {
	_, _ = l.conn.ExecContext(context.Background(), `SELECT RELEASE_LOCK(?)`, l.name)
	return l.conn.Close()
}
