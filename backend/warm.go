package backend

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/mysql"
)

const (
	// warmEvery is how often one sale is warmed on gateways' request at most.
	warmEvery = time.Second
	// warmTimeout bounds one warm.
	warmTimeout = 10 * time.Second
	// warmLockTTL bounds how long a crashed warmer blocks the others.
	warmLockTTL = 15 * time.Second
	// usersChunk is the fields of one HSET when the users hash is rebuilt.
	usersChunk = 500
)

// unlockSrc deletes a lock only if it is still ours.
const unlockSrc = `if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`

// warmer makes sales known to Redis from MySQL: at start, on sale create and
// close, and when a gateway reports a sale not warmed (bus.EventWarm). It owns
// the goroutines of the event-driven warms.
type warmer struct {
	db      *sql.DB
	rc      rueidis.Client
	scripts *lua.Scripts
	log     *slog.Logger
	unlock  *rueidis.Lua
	// inFlight, if set, is what Redis should hold of a sale being warmed, the
	// orders in flight (in the stream, not in MySQL) taken off, and counts their
	// units in the users hash (Backend.warmRemaining). Unset: total − sold.
	inFlight func(ctx context.Context, row *saleRow, k *lua.Keys) (map[string]int64, error)
	// grace, if set, is how long to wait before reading a sale that Redis
	// lost (reconciler.lossGrace).
	grace func(ctx context.Context, sale string) (time.Duration, error)

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	stopped bool
	last    map[string]time.Time // when each sale was last warmed on request
}

func newWarmer(db *sql.DB, rc rueidis.Client, scripts *lua.Scripts, log *slog.Logger) *warmer {
	ctx, cancel := context.WithCancel(context.Background())
	return &warmer{db: db, rc: rc, scripts: scripts, log: log, unlock: rueidis.NewLuaScript(unlockSrc),
		ctx: ctx, cancel: cancel, last: map[string]time.Time{}}
}

// warmLockKey carries the sale's hash tag, so it lives on the sale's shard.
func warmLockKey(sale string) string { return lua.KeysFor(sale, nil).Warming }

// warm makes sale known to Redis if its meta is missing, and answers whether it
// did. Under a short Redis lock (so backends warming the same sale at once do
// not interleave) it rebuilds the users hash from user_purchases, then lets
// lua.Warm write the stock keys and the meta: until the meta exists the admit
// script refuses everything (not_warmed), so nothing moves the counters
// meanwhile.
//
// The stock is total − sold − in flight (inFlight): after Redis lost its data,
// the orders admitted and not yet in MySQL are only in the stream.
func (w *warmer) warm(ctx context.Context, sale string) (bool, error) {
	row, err := loadSale(ctx, w.db, sale)
	if err != nil {
		return false, err
	}
	// A retired sale stays out of Redis: warming it would bring back its keys
	// (and a gateway's refresh would load it again).
	if retired, err := saleRetired(ctx, w.db, sale); err != nil || retired != nil {
		return false, err
	}
	k := lua.KeysOf(&row.Sale)
	warm, err := w.isWarm(ctx, k)
	if err != nil {
		return false, err
	}
	if warm {
		// A split sale can lose some of its buckets (a master lost its
		// data) and keep its meta: those are refilled.
		return w.refillLost(ctx, row, k)
	}

	unlock, ok, err := w.lock(ctx, sale)
	if err != nil || !ok {
		return false, err // !ok: another backend is warming it
	}
	defer unlock()
	// Warmed by someone else between the check and the lock?
	if warm, err := w.isWarm(ctx, k); err != nil || warm {
		return false, err
	}

	if row, err = w.afterGrace(ctx, row); err != nil {
		return false, err
	}
	return w.fill(ctx, row, k)
}

// lock takes the sale's warm lock (warmLockKey): held by a warm, a refill of
// lost buckets, and a stock repair (reconciler.fixStock), the three writers of
// a sale's stock keys from MySQL, so that none interleaves with another. ok is
// false when someone holds it; unlock releases it if it is still ours.
func (w *warmer) lock(ctx context.Context, sale string) (unlock func(), ok bool, err error) {
	token := randomToken()
	key := warmLockKey(sale)
	err = w.rc.Do(ctx, w.rc.B().Set().Key(key).Value(token).Nx().Px(warmLockTTL).Build()).Error()
	if rueidis.IsRedisNil(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("warm lock of %s: %w", sale, err)
	}
	return func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = w.unlock.Exec(uctx, w.rc, []string{key}, []string{token}).Error()
	}, true, nil
}

// afterGrace waits the loss grace (w.grace) and reads the sale again if it
// waited: the orders that landed meanwhile are sold now.
func (w *warmer) afterGrace(ctx context.Context, row *saleRow) (*saleRow, error) {
	if w.grace == nil {
		return row, nil
	}
	sale := row.ID
	d, err := w.grace(ctx, sale)
	if err != nil {
		return nil, fmt.Errorf("warm %s: %w", sale, err)
	}
	if d <= 0 {
		return row, nil
	}
	if err := sleep(ctx, d); err != nil {
		return nil, fmt.Errorf("warm %s: %w", sale, err)
	}
	return loadSale(ctx, w.db, sale)
}

// fill writes the sale into Redis from MySQL, under the warm lock: the
// buyers' units, the limit counters, the orders, and the stock less what is
// in flight.
func (w *warmer) fill(ctx context.Context, row *saleRow, k *lua.Keys) (bool, error) {
	sale := row.ID
	var err error
	// With inFlight set the users hash and the limit counters are rebuilt
	// there, from the MySQL snapshot it reads after the stream: read here,
	// before the stream, an order acked in between would be counted nowhere,
	// and its buyer (or phone) could buy past the limit in Redis, an order
	// MySQL's guard then fails after its 202.
	if w.inFlight == nil {
		if err := w.rebuildUsers(ctx, w.db, k); err != nil {
			return false, fmt.Errorf("warm %s: users: %w", sale, err)
		}
		if err := w.rebuildLimits(ctx, w.db, k, &row.Sale); err != nil {
			return false, fmt.Errorf("warm %s: limits: %w", sale, err)
		}
	}
	if err := w.rebuildOrders(ctx, k); err != nil {
		return false, fmt.Errorf("warm %s: orders: %w", sale, err)
	}
	remaining := row.Remaining()
	if w.inFlight != nil {
		if remaining, err = w.inFlight(ctx, row, k); err != nil {
			return false, fmt.Errorf("warm %s: in flight: %w", sale, err)
		}
	}
	return w.scripts.Warm(ctx, w.rc, &row.Sale, remaining)
}

// refillLost warms again the buckets of a split sale whose meta is gone
// while the sale's own is there (docs/buckets.md): each gets its meta copy
// and a stock of 0, and its buyers' counts, limit counters, orders and
// idempotency keys from MySQL. Its units come back with the next stock
// repair (reconcile), which finds the sale short: never more units than
// MySQL allows meanwhile. It answers whether it refilled any.
func (w *warmer) refillLost(ctx context.Context, row *saleRow, k *lua.Keys) (bool, error) {
	lost, err := lostBuckets(ctx, w.rc, k)
	if err != nil || len(lost) == 0 {
		return false, err
	}
	unlock, ok, err := w.lock(ctx, row.ID)
	if err != nil || !ok {
		return false, err // !ok: another backend is at it
	}
	defer unlock()
	if lost, err = lostBuckets(ctx, w.rc, k); err != nil || len(lost) == 0 {
		return false, err
	}
	in := map[int]bool{}
	for _, i := range lost {
		in[i] = true
	}
	keep := func(user string) bool { return in[lua.HomeBucket(user, len(k.Buckets()))] }
	if err := w.rebuildUsersBucketed(ctx, w.db, k, keep); err != nil {
		return false, fmt.Errorf("refill %s: users: %w", row.ID, err)
	}
	if len(row.Limits) > 0 {
		loc, err := row.Location()
		if err != nil {
			return false, err
		}
		if err := w.rebuildLimitsBucketed(ctx, w.db, k, loc, time.Now(), keep); err != nil {
			return false, fmt.Errorf("refill %s: limits: %w", row.ID, err)
		}
	}
	if err := w.rebuildOrdersFor(ctx, k, keep); err != nil {
		return false, fmt.Errorf("refill %s: orders: %w", row.ID, err)
	}
	if err := w.scripts.WarmBuckets(ctx, w.rc, &row.Sale, lost); err != nil {
		return false, err
	}
	w.log.Warn("refilled buckets Redis lost; their units come back with the next stock repair", "sale", row.ID, "buckets", lost)
	return true, nil
}

// lostBuckets lists the buckets of a split sale whose meta is gone.
func lostBuckets(ctx context.Context, rc rueidis.Client, k *lua.Keys) ([]int, error) {
	bs := k.Buckets()
	cmds := make(rueidis.Commands, len(bs))
	for i, b := range bs {
		cmds[i] = rc.B().Exists().Key(b.Meta).Build()
	}
	var lost []int
	for i, r := range rc.DoMulti(ctx, cmds...) {
		n, err := r.AsInt64()
		if err != nil {
			return nil, fmt.Errorf("buckets of %s: %w", k.Sale, err)
		}
		if n == 0 {
			lost = append(lost, i)
		}
	}
	return lost, nil
}

func (w *warmer) isWarm(ctx context.Context, k *lua.Keys) (bool, error) {
	n, err := w.rc.Do(ctx, w.rc.B().Exists().Key(k.Meta).Build()).AsInt64()
	if err != nil {
		return false, fmt.Errorf("warm %s: %w", k.Sale, err)
	}
	return n == 1, nil
}

// rebuildUsers replaces the users hash with the units MySQL counts per buyer.
func (w *warmer) rebuildUsers(ctx context.Context, q queryer, k *lua.Keys) error {
	if len(k.Buckets()) > 0 {
		return w.rebuildUsersBucketed(ctx, q, k, nil)
	}
	if err := w.rc.Do(ctx, w.rc.B().Del().Key(k.Users).Build()).Error(); err != nil {
		return err
	}
	var fields []string
	flush := func() error {
		if len(fields) == 0 {
			return nil
		}
		cmd := w.rc.B().Hset().Key(k.Users).FieldValue()
		for i := 0; i < len(fields); i += 2 {
			cmd = cmd.FieldValue(fields[i], fields[i+1])
		}
		fields = fields[:0]
		return w.rc.Do(ctx, cmd.Build()).Error()
	}
	err := mysql.EachBuyer(ctx, q, k.Sale, func(user string, units int64) error {
		fields = append(fields, user, strconv.FormatInt(units, 10))
		if len(fields) == 2*usersChunk {
			return flush()
		}
		return nil
	})
	if err != nil {
		return err
	}
	return flush()
}

// rebuildUsersBucketed is rebuildUsers for a split sale: each buyer's units
// go to their home bucket (docs/buckets.md).
// keep (nil: every buyer) picks the buyers rebuilt, by user; only their
// buckets' hashes are emptied first.
func (w *warmer) rebuildUsersBucketed(ctx context.Context, q queryer, k *lua.Keys, keep func(string) bool) error {
	var cmds rueidis.Commands
	for i, b := range k.Buckets() {
		if keep == nil || keep(bucketProbe(k, i)) {
			cmds = append(cmds, w.rc.B().Del().Key(b.Users).Build())
		}
	}
	flush := func() error {
		err := sendAll(ctx, w.rc, cmds)
		cmds = cmds[:0]
		return err
	}
	if err := flush(); err != nil {
		return err
	}
	err := mysql.EachBuyer(ctx, q, k.Sale, func(user string, units int64) error {
		if keep != nil && !keep(user) {
			return nil
		}
		cmds = append(cmds, w.rc.B().Hset().Key(k.Home(user).Users).FieldValue().FieldValue(user, strconv.FormatInt(units, 10)).Build())
		if len(cmds) == usersChunk {
			return flush()
		}
		return nil
	})
	if err != nil {
		return err
	}
	return flush()
}

// rebuildLimits writes the purchase-limit counters MySQL holds (limit_usage,
// read through q) for the windows that have not ended, each window's hash
// with its TTL. Like the users hash it counts what MySQL counts; the warm's
// in-flight step (restoreInFlight) then adds the orders still in the stream,
// read from the same snapshot.
func (w *warmer) rebuildLimits(ctx context.Context, q queryer, k *lua.Keys, sale *flashgate.Sale) error {
	if len(sale.Limits) == 0 {
		return nil
	}
	loc, err := sale.Location()
	if err != nil {
		return err
	}
	now := time.Now()
	if len(k.Buckets()) > 0 {
		return w.rebuildLimitsBucketed(ctx, q, k, loc, now, nil)
	}
	window, key := "", ""
	var fields []string
	flush := func() error {
		if len(fields) == 0 {
			return nil
		}
		cmds := rueidis.Commands{}
		hset := w.rc.B().Hset().Key(key).FieldValue()
		for i := 0; i < len(fields); i += 2 {
			hset = hset.FieldValue(fields[i], fields[i+1])
		}
		cmds = append(cmds, hset.Build())
		if end := flashgate.WindowEnd(window, loc); !end.IsZero() {
			ttl := flashgate.Charge{Ends: end}.TTL(now)
			cmds = append(cmds, w.rc.B().Pexpire().Key(key).Milliseconds(ttl.Milliseconds()).Build())
		}
		fields = fields[:0]
		for _, r := range w.rc.DoMulti(ctx, cmds...) {
			if err := r.Error(); err != nil {
				return err
			}
		}
		return nil
	}
	err = mysql.EachLimitUsage(ctx, q, k.Sale, func(lim int, win, subject string, used int64) error {
		if win != window || len(fields) == 2*usersChunk {
			if err := flush(); err != nil {
				return err
			}
			window, key = win, k.Limit(win)
		}
		if end := flashgate.WindowEnd(win, loc); !end.IsZero() && !end.After(now) {
			return nil // the window is over: nothing to count in it
		}
		fields = append(fields, flashgate.Charge{Limit: lim, Subject: subject}.Field(), strconv.FormatInt(used, 10))
		return nil
	})
	if err != nil {
		return err
	}
	return flush()
}

// rebuildLimitsBucketed is rebuildLimits for a split sale: each counter goes
// to its subject's bucket (lua.LimitBucket: a user's is their home; a phone,
// device, IP or address has one bucket every buyer sharing it meets at), one
// HSET (and PEXPIRE) each.
func (w *warmer) rebuildLimitsBucketed(ctx context.Context, q queryer, k *lua.Keys, loc *time.Location, now time.Time, keep func(string) bool) error {
	var cmds rueidis.Commands
	flush := func() error {
		err := sendAll(ctx, w.rc, cmds)
		cmds = cmds[:0]
		return err
	}
	err := mysql.EachLimitUsage(ctx, q, k.Sale, func(lim int, win, subject string, used int64) error {
		end := flashgate.WindowEnd(win, loc)
		if (!end.IsZero() && !end.After(now)) || (keep != nil && !keep(subject)) {
			return nil // the window is over, or the buyer's bucket is not rebuilt
		}
		key := k.Home(subject).Limit(win) // Home(subject): lua.LimitBucket's bucket
		cmds = append(cmds, w.rc.B().Hset().Key(key).FieldValue().
			FieldValue(flashgate.Charge{Limit: lim, Subject: subject}.Field(), strconv.FormatInt(used, 10)).Build())
		if !end.IsZero() {
			ttl := flashgate.Charge{Ends: end}.TTL(now)
			cmds = append(cmds, w.rc.B().Pexpire().Key(key).Milliseconds(ttl.Milliseconds()).Build())
		}
		if len(cmds) >= 2*usersChunk {
			return flush()
		}
		return nil
	})
	if err != nil {
		return err
	}
	return flush()
}

// rebuildOrders writes back what Redis lost of the orders MySQL holds: each
// order's record (so GET of an order answers after the loss) and each
// Idempotency-Key's order (so a retry replays it instead of buying again).
// HSETNX: a record Redis holds was written back after the loss, by a batch or
// a pay or cancel, and is at least as new as this read.
func (w *warmer) rebuildOrders(ctx context.Context, k *lua.Keys) error {
	return w.rebuildOrdersFor(ctx, k, nil)
}

// rebuildOrdersFor is rebuildOrders for the buyers keep picks (nil: all).
func (w *warmer) rebuildOrdersFor(ctx context.Context, k *lua.Keys, keep func(string) bool) error {
	var cmds rueidis.Commands
	flush := func() error {
		err := sendAll(ctx, w.rc, cmds)
		cmds = cmds[:0]
		return err
	}
	err := mysql.EachOrder(ctx, w.db, k.Sale, func(o flashgate.Order) error {
		// Its charges counted in other buckets than its home (by phone,
		// device, IP, address): those buckets' entries, for the give-back
		// when its units come back (docs/buckets.md).
		held, err := lua.HeldWrites(w.rc, k, &o, keep)
		if err != nil {
			return err
		}
		cmds = append(cmds, held...)
		if keep != nil && !keep(o.UserID) {
			return nil
		}
		sid := strconv.FormatUint(o.ID, 10)
		home := k.Home(o.UserID)
		cmds = append(cmds, w.rc.B().Hsetnx().Key(home.Orders).Field(sid).Value(lua.EncodeRecord(&o)).Build())
		if o.IdemKey != "" {
			cmds = append(cmds, w.rc.B().Hsetnx().Key(home.Idem).Field(o.UserID+"|"+o.IdemKey).Value(sid).Build())
		}
		if len(cmds) >= 2*usersChunk {
			return flush()
		}
		return nil
	})
	if err != nil {
		return err
	}
	return flush()
}

// lossGrace is the warmer's wait before it reads a sale Redis lost. An
// admission Redis ran just before the loss may still be on its way to the
// stream; read before it lands, its order would be neither in MySQL nor in
// flight, and a retry of its Idempotency-Key would buy again. Every such
// publish lands or fails within the gateways' publish timeout. A sale with
// no order anywhere (a new one) is warmed at once.
func (re *reconciler) lossGrace(ctx context.Context, sale string) (time.Duration, error) {
	found, err := mysql.HasOrders(ctx, re.db, sale)
	if err != nil {
		return 0, err
	}
	if !found {
		n, err := re.stream.streamCount(ctx, sale)
		if err != nil {
			return 0, err
		}
		if n == 0 {
			return 0, nil
		}
	}
	return min(re.cfg.PublishTimeout, warmTimeout/2), nil
}

// request warms sale in the background, at most once per warmEvery: every
// gateway that meets the cold sale asks, and every backend hears it.
func (w *warmer) request(sale string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	if w.stopped || now.Sub(w.last[sale]) < warmEvery {
		return
	}
	if len(w.last) >= 1024 {
		for id, at := range w.last {
			if now.Sub(at) >= warmEvery {
				delete(w.last, id)
			}
		}
	}
	w.last[sale] = now
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		ctx, cancel := context.WithTimeout(w.ctx, warmTimeout)
		defer cancel()
		did, err := w.warm(ctx, sale)
		switch {
		case errors.Is(err, errSaleNotFound):
			w.log.Warn("warm requested for a sale MySQL does not know", "sale", sale)
		case err != nil:
			w.log.Error("warm failed", "sale", sale, "err", err)
		case did:
			w.log.Info("sale warmed on request", "sale", sale)
		}
	}()
}

// stop refuses new requests and waits for the running warms; when ctx ends
// first it cancels them and waits for them to return.
func (w *warmer) stop(ctx context.Context) {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
	done := make(chan struct{})
	go func() { w.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	w.cancel()
	<-done
}

// warmOpenSales warms every sale that is neither closed nor ended and that
// Redis does not know. A failure is logged, not fatal: a gateway that meets the
// sale cold asks again.
func (b *Backend) warmOpenSales(ctx context.Context) {
	ids, err := mysql.OpenSaleIDs(ctx, b.db, time.Now().UTC())
	if err != nil {
		b.log.Error("listing sales to warm", "err", err)
		return
	}
	for _, id := range ids {
		did, err := b.warmer.warm(ctx, id)
		if err != nil {
			b.log.Error("warm at start failed", "sale", id, "err", err)
			continue
		}
		if did {
			b.log.Info("sale warmed at start", "sale", id)
		}
	}
}

// onEvent handles the sale events the backend cares about: a gateway's warm request.
func (b *Backend) onEvent(ev bus.SaleEvent) {
	if ev.Type == bus.EventWarm {
		b.warmer.request(ev.SaleID)
	}
}

func randomToken() string {
	var buf [12]byte
	_, _ = rand.Read(buf[:])
	return hex.EncodeToString(buf[:])
}

// sendAll sends cmds in one round trip and answers the first error among
// their replies.
func sendAll(ctx context.Context, rc rueidis.Client, cmds rueidis.Commands) error {
	for _, r := range rc.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return err
		}
	}
	return nil
}
