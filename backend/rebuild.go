package backend

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/mysql"
)

// One rebuild (docs/recovery.md, "One rebuild"). Redis's books of a sale —
// stock, buyers' units, reservations, order records, idempotency keys, the
// restocked set, purchase-limit counters, holds, transfer ledgers — are a
// projection of MySQL and the orders stream, and rebuild is the one function
// that derives the whole projection. Every path that finds Redis wrong calls
// it: the warm of a sale Redis does not know (at start, on create, on a
// gateway's request), the refill of a split sale's lost buckets, the
// degraded lane's return to Redis, and the ledger repair. A new kind of state
// is taught to this one place.
//
// It runs under the sale row lock (no batch, cancel, expiry or lane order of
// the sale commits meanwhile, so MySQL and the stream are read at one moment)
// and raises the sale's epoch in the same transaction. Each hash tag of the
// sale is fenced with the new epoch first (admissions answer not_warmed, and
// every write-back of a decision committed before the lock is refused: the
// rebuild reads it from MySQL), then rebuilt under staged names and installed
// in one step that checks nothing it kept from the live keys moved. Nothing
// written before a rebuild changes what it decided (invariant 9).

// rebuildTries bounds the rebuilds begun again because the live books moved
// during one (a gateway released an order the rebuild counted as pending).
const rebuildTries = 5

// errRebuildBusy means another process holds the sale's warm lock.
var errRebuildBusy = errors.New("another rebuild of the sale is under way")

// rebuildReport is what one rebuild did.
type rebuildReport struct {
	Epoch int64
	// Pending counts the orders in flight it kept as reservations: admitted
	// in Redis or in the stream, with no MySQL row yet.
	Pending int
	// Tombstones counts the records of released orders it kept.
	Tombstones int
	// Holds counts the undecided purchase-limit holds it kept.
	Holds int
	// Tries is how many times it read the books (more than 1: they moved).
	Tries int
}

// rebuild derives everything Redis holds of sale from MySQL and the stream
// and installs it under a new epoch. inTx, if set, runs in the rebuild's
// transaction before it commits (the lane clears the sale's stale mark
// there). It answers errRebuildBusy while another process rebuilds the sale.
func (w *warmer) rebuild(ctx context.Context, sale string, inTx func(context.Context, *sql.Tx) error) (rebuildReport, error) {
	unlock, ok, err := w.lock(ctx, sale)
	if err != nil {
		return rebuildReport{}, err
	}
	if !ok {
		return rebuildReport{}, errRebuildBusy
	}
	defer unlock()
	for try := 1; ; try++ {
		rep, err := w.rebuildOnce(ctx, sale, inTx)
		rep.Tries = try
		if !errors.Is(err, lua.ErrRebuildMoved) || try == rebuildTries {
			if err == nil {
				w.log.Info("sale rebuilt from MySQL and the stream", "sale", sale, "epoch", rep.Epoch,
					"pending", rep.Pending, "tombstones", rep.Tombstones, "holds", rep.Holds, "tries", try)
			}
			return rep, err
		}
	}
}

func (w *warmer) rebuildOnce(ctx context.Context, sale string, inTx func(context.Context, *sql.Tx) error) (rebuildReport, error) {
	var rep rebuildReport
	tx, err := mysql.Begin(ctx, w.db)
	if err != nil {
		return rep, fmt.Errorf("rebuild %s: %w", sale, err)
	}
	defer tx.Rollback()
	found, err := mysql.LockSale(ctx, tx, sale)
	if err != nil {
		return rep, fmt.Errorf("rebuild %s: lock: %w", sale, err)
	}
	if !found {
		return rep, fmt.Errorf("sale %s: %w", sale, errSaleNotFound)
	}
	if rep.Epoch, err = mysql.BumpEpoch(ctx, tx, sale); err != nil {
		return rep, err
	}
	row, err := loadSale(ctx, tx, sale)
	if err != nil {
		return rep, err
	}
	k := lua.KeysOf(&row.Sale)
	if err := lua.Fence(ctx, w.rc, k, rep.Epoch); err != nil {
		return rep, err
	}
	if w.afterFence != nil {
		w.afterFence()
	}
	// When the books were rebuilt, by each tag's own clock, read after its
	// fence: every order admitted on the tag later writes its record there,
	// so a gateway may answer 404 for a newer id the buyer's tag does not
	// hold (gateway/orderids.go).
	rebuilt := map[*lua.Keys]string{}
	for _, t := range k.Tags() {
		at, err := lua.ServerTime(ctx, w.rc, t.Meta)
		if err != nil {
			return rep, fmt.Errorf("rebuild %s: %w", sale, err)
		}
		rebuilt[t] = strconv.FormatInt(at.UnixMilli(), 10)
	}
	// From here on the tags answer not_warmed: whatever fails below, the next
	// warm request rebuilds again.
	p, err := w.project(ctx, tx, row, k)
	if err != nil {
		return rep, fmt.Errorf("rebuild %s: %w", sale, err)
	}
	rep.Pending, rep.Tombstones, rep.Holds = p.pending, p.tombstones, p.holds
	for t, at := range rebuilt {
		p.books[t].Meta = append(slices.Clip(p.books[t].Meta), lua.MetaRebuilt, at)
	}
	for _, t := range k.Tags() {
		if err := lua.Install(ctx, w.rc, t, rep.Epoch, p.books[t], p.live[t]); err != nil {
			return rep, err
		}
	}
	if inTx != nil {
		if err := inTx(ctx, tx); err != nil {
			w.unwarm(ctx, k)
			return rep, err
		}
	}
	if err := tx.Commit(); err != nil {
		// Redis holds the new epoch and MySQL the old: every write-back would
		// be refused. Take the sale out of Redis; the next warm rebuilds it.
		w.unwarm(ctx, k)
		return rep, fmt.Errorf("rebuild %s: commit: %w", sale, err)
	}
	if err := lua.Index(ctx, w.rc, &row.Sale); err != nil {
		return rep, fmt.Errorf("rebuild %s: index: %w", sale, err)
	}
	return rep, nil
}

// unwarm deletes every meta of the sale after a rebuild that installed and
// could not commit: admissions answer not_warmed until the next rebuild.
func (w *warmer) unwarm(ctx context.Context, k *lua.Keys) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	for _, t := range k.Tags() {
		_ = w.rc.Do(uctx, w.rc.B().Del().Key(t.Meta).Build()).Error()
	}
}

// projection is the books of every tag of a sale, derived.
type projection struct {
	books                      map[*lua.Keys]*lua.Books
	live                       map[*lua.Keys]*lua.Live
	pending, tombstones, holds int
}

// project derives the books of every tag of the sale from MySQL (read in tx,
// under the sale row lock), the stream, and what only Redis knows: the orders
// admitted and not yet published, the tombstones of released orders, and the
// undecided holds.
func (w *warmer) project(ctx context.Context, tx *sql.Tx, row *saleRow, k *lua.Keys) (*projection, error) {
	p := &projection{books: map[*lua.Keys]*lua.Books{}, live: map[*lua.Keys]*lua.Live{}}
	meta := lua.MetaFields(&row.Sale)
	data := k.Buckets()
	if len(data) == 0 {
		data = []*lua.Keys{k}
	}
	for _, t := range k.Tags() {
		b := lua.NewBooks()
		b.Meta = meta
		p.books[t] = b
	}
	// limitTag is the tag counting subject's purchase limits (its home).
	limitTag := func(subject string) *lua.Books { return p.books[k.Home(subject)] }
	homeOf := func(user string) *lua.Books { return p.books[k.Home(user)] }

	loc, err := row.Location()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	// expiry is when window's counter expires (zero: never), as an instant:
	// the script sets it with PEXPIREAT, on Redis's clock.
	expiry := func(window string) (time.Time, bool) {
		end := flashgate.WindowEnd(window, loc)
		if end.IsZero() {
			return time.Time{}, true
		}
		if !end.After(now) {
			return time.Time{}, false // the window is over: nothing counts in it
		}
		return now.Add(flashgate.Charge{Ends: end}.TTL(now)), true // its end and the grace
	}
	count := func(c flashgate.Charge) {
		if d, ok := expiry(c.Window); ok {
			limitTag(c.Subject).Count(c.Window, c.Field(), c.Inc, d)
		}
	}
	// Every window a limit of the sale counts in now is rebuilt, empty if need
	// be, so that a live counter MySQL does not back goes.
	for _, b := range data {
		for _, l := range row.Limits {
			win, _ := flashgate.Window(l.Per, now, loc)
			if d, ok := expiry(win); ok {
				p.books[b].Count(win, "", 0, d)
				delete(p.books[b].Limits[win], "")
			}
		}
	}

	// What only Redis knows, per tag.
	candidates := map[uint64]flashgate.Order{}
	for _, t := range data {
		l, err := lua.ReadLive(ctx, w.rc, t)
		if err != nil {
			return nil, err
		}
		p.live[t] = l
		for sid, v := range l.Resv {
			id, err := strconv.ParseUint(sid, 10, 64)
			if err != nil {
				continue
			}
			o, err := lua.DecodeResv(row.ID, id, v)
			if err != nil {
				return nil, err
			}
			if rec, ok := l.Orders[sid]; ok {
				if r, err := lua.DecodeRecord(row.ID, id, rec); err == nil {
					o.Status = r.Status
				}
			}
			candidates[id] = o
		}
	}
	// The stream: every message there has been published (claimed or about
	// to be), so its order is processing.
	if w.stream != nil {
		msgs, err := w.stream.streamOrders(ctx, row.ID)
		if err != nil {
			return nil, fmt.Errorf("stream: %w", err)
		}
		for id, m := range msgs {
			if _, ok := candidates[id]; !ok {
				m.Status, m.Reason = lua.StatusProcessing, ""
				candidates[id] = m
			}
		}
	}
	ids := make([]uint64, 0, len(candidates))
	for id := range candidates {
		ids = append(ids, id)
	}
	written, err := orderRows(ctx, tx, row.ID, ids)
	if err != nil {
		return nil, err
	}

	// MySQL: buyers, limit counters, orders.
	err = mysql.EachBuyer(ctx, tx, row.ID, func(user string, units int64) error {
		homeOf(user).Users[user] = units
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("buyers: %w", err)
	}
	err = mysql.EachLimitUsage(ctx, tx, row.ID, func(lim int, win, subject string, used int64) error {
		count(flashgate.Charge{Limit: lim, Window: win, Subject: subject, Inc: used})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("limits: %w", err)
	}
	inMySQL := map[string]bool{}
	err = mysql.EachOrder(ctx, tx, row.ID, func(o flashgate.Order) error {
		sid := strconv.FormatUint(o.ID, 10)
		inMySQL[sid] = true
		home := homeOf(o.UserID)
		home.Orders[sid] = lua.EncodeRecord(&o)
		if o.IdemKey != "" {
			home.Idem[o.UserID+"|"+o.IdemKey] = sid
		}
		if o.Status == flashgate.OrderCanceled {
			// Its units came back in MySQL: a restock of it is done.
			home.Restocked = append(home.Restocked, sid)
		}
		if o.Status.Live() {
			return addHeld(p, k, &o)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("orders: %w", err)
	}

	// The orders in flight: admitted (in Redis or the stream), not written.
	rem := row.Remaining()
	for _, id := range slices.Sorted(maps.Keys(candidates)) {
		o := candidates[id]
		sid := strconv.FormatUint(id, 10)
		if _, ok := written[id]; ok {
			continue // MySQL decided it: counted above
		}
		if rec, ok := p.live[k.Home(o.UserID)].Orders[sid]; ok && lua.IsReleased(rec) {
			continue // the gateway released it: its message is dropped
		}
		if _, ok := rem[o.Region]; !ok {
			continue // a region the sale lacks: MySQL fails it, it holds nothing
		}
		home := homeOf(o.UserID)
		rem[o.Region] -= o.Quantity
		home.Users[o.UserID] += o.Quantity
		cs, err := flashgate.ParseCharges(o.Charges)
		if err != nil {
			return nil, fmt.Errorf("order %d: %w", id, err)
		}
		for _, c := range cs {
			count(c)
		}
		if err := addHeld(p, k, &o); err != nil {
			return nil, err
		}
		home.Resv[sid] = lua.EncodeResv(&o)
		home.Orders[sid] = lua.EncodeRecord(&o)
		if o.IdemKey != "" {
			// MySQL's order of the key, written first, wins: this one then
			// fails as a duplicate when it lands.
			if _, taken := home.Idem[o.UserID+"|"+o.IdemKey]; !taken {
				home.Idem[o.UserID+"|"+o.IdemKey] = sid
			}
		}
		p.pending++
	}

	// Tombstones and undecided holds stay.
	for _, t := range data {
		l, b := p.live[t], p.books[t]
		for sid, rec := range l.Orders {
			if _, ok := b.Orders[sid]; !ok && !inMySQL[sid] && lua.IsReleased(rec) {
				b.Orders[sid] = rec
				p.tombstones++
			}
		}
		for sid, v := range l.Holds {
			id, _ := strconv.ParseUint(sid, 10, 64)
			if o, ok := candidates[id]; ok && homeOf(o.UserID).Resv[sid] != "" {
				continue // admitted, in flight: its charges count through the order
			}
			if inMySQL[sid] {
				continue // admitted and decided: MySQL counts it, or nothing does
			}
			_, cs, err := lua.HoldCharges(v)
			if err != nil {
				return nil, err
			}
			for _, c := range cs {
				if d, ok := expiry(c.Window); ok {
					b.Count(c.Window, c.Field(), c.Inc, d)
				}
			}
			b.Holds[sid] = v
			p.holds++
		}
	}

	// The stock: what MySQL has left less what is in flight, shared over the
	// buckets as a warm shares it.
	for r, n := range rem {
		n = max(n, 0)
		if len(k.Buckets()) == 0 {
			p.books[k].Stock[r] = n
			continue
		}
		for i, b := range k.Buckets() {
			p.books[b].Stock[r] = lua.SplitUnits(n, len(k.Buckets()), i)
		}
	}
	return p, nil
}

// addHeld adds the kept holds of a live order to the buckets counting its
// charges away from its home.
func addHeld(p *projection, k *lua.Keys, o *flashgate.Order) error {
	es, err := lua.HeldEntries(k, o)
	if err != nil {
		return err
	}
	for i, v := range es {
		p.books[k.Buckets()[i]].Held[strconv.FormatUint(o.ID, 10)] = v
	}
	return nil
}
