package backend

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
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
	// warmWorkers warm the sales gateways ask for; warmQueue bounds the
	// sales waiting for one (a request finding it full is dropped: the
	// gateway asks again a second later).
	warmWorkers = 4
	warmQueue   = 64
	// knownEvery is how often the set of sales a request may warm is read
	// from MySQL; knownMiss the least time between two reads on a request
	// for a sale not in it, and maxMissed the requests of such sales kept
	// for that read (the rest are dropped).
	knownEvery = 30 * time.Second
	knownMiss  = time.Second
	maxMissed  = 64
)

// warmer makes sales known to Redis from MySQL: at start, on sale create and
// close, and when a gateway reports a sale not warmed (bus.EventWarm). It owns
// the goroutines of the event-driven warms.
type warmer struct {
	db      *sql.DB
	rc      rueidis.Client
	scripts *lua.Scripts
	log     *slog.Logger
	// grace, if set, is how long to wait before reading a sale that Redis
	// lost (reconciler.lossGrace).
	grace func(ctx context.Context, sale string) (time.Duration, error)
	// stream, if set, reads the orders stream: the orders in flight a
	// rebuild keeps (nil: a backend without NATS, in tests).
	stream *orderStream
	// afterFence, if set, runs in every rebuild right after its fence, with
	// the sale row locked (tests interleave writers there).
	afterFence func()

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	stopped bool
	last    map[string]time.Time // when each sale was last warmed on request

	// Requests come from gateways, and whoever holds a gateway's NATS
	// credential can ask for any id: a request acts only for a sale of the
	// known set (the sales MySQL has that retention has not removed), read
	// by one loop, and is warmed by warmWorkers workers from a bounded queue.
	// Started by the first request.
	retention time.Duration
	started   bool
	jobs      chan string
	kick      chan struct{}
	quit      chan struct{} // closed by stop
	known     map[string]bool
	missed    map[string]bool // requested, not known: checked at the next read
}

func newWarmer(db *sql.DB, rc rueidis.Client, scripts *lua.Scripts, log *slog.Logger) *warmer {
	ctx, cancel := context.WithCancel(context.Background())
	return &warmer{db: db, rc: rc, scripts: scripts, log: log,
		ctx: ctx, cancel: cancel, last: map[string]time.Time{},
		retention: config.Default().Sales.Retention, jobs: make(chan string, warmQueue), kick: make(chan struct{}, 1), quit: make(chan struct{}),
		missed: map[string]bool{}}
}

// warmLockKey carries the sale's hash tag, so it lives on the sale's shard.
func warmLockKey(sale string) string { return lua.KeysFor(sale, nil).Warming }

// warm makes sale known to Redis when any tag of it is not (its meta, or a
// split sale's bucket's, is missing: never warmed, or a master lost its
// data), and answers whether it did. It is the one rebuild (rebuild.go):
// every tag is derived again from MySQL and the stream under a new epoch;
// until it installs, admissions answer not_warmed.
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
	if warm, err := w.isWarm(ctx, k); err != nil || warm {
		return false, err
	}
	if err := w.afterGrace(ctx, sale); err != nil {
		return false, err
	}
	if _, err := w.rebuild(ctx, sale, nil); err != nil {
		if errors.Is(err, errRebuildBusy) {
			return false, nil // another backend is at it
		}
		return false, err
	}
	return true, nil
}

// lock takes the sale's warm lock (warmLockKey), held by a rebuild, so that
// backends asked to warm the same sale at once do not queue on its MySQL row.
// ok is false when someone holds it; unlock releases it if it is still ours.
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
		_ = lua.Unlock(uctx, w.rc, key, token)
	}, true, nil
}

// afterGrace waits the loss grace (w.grace) before a sale Redis lost is read:
// a publish of an admission Redis ran just before the loss then lands in the
// stream first, where the rebuild counts it.
func (w *warmer) afterGrace(ctx context.Context, sale string) error {
	if w.grace == nil {
		return nil
	}
	d, err := w.grace(ctx, sale)
	if err != nil {
		return fmt.Errorf("warm %s: %w", sale, err)
	}
	if d <= 0 {
		return nil
	}
	if err := sleep(ctx, d); err != nil {
		return fmt.Errorf("warm %s: %w", sale, err)
	}
	return nil
}

// isWarm reports whether every tag of the sale has its meta.
func (w *warmer) isWarm(ctx context.Context, k *lua.Keys) (bool, error) {
	tags := k.Tags()
	cmds := make(rueidis.Commands, len(tags))
	for i, t := range tags {
		cmds[i] = w.rc.B().Exists().Key(t.Meta).Build()
	}
	for _, r := range w.rc.DoMulti(ctx, cmds...) {
		n, err := r.AsInt64()
		if err != nil {
			return false, fmt.Errorf("warm %s: %w", k.Sale, err)
		}
		if n == 0 {
			return false, nil
		}
	}
	return true, nil
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
// gateway that meets the cold sale asks, and every backend hears it. A sale
// not in the known set is only noted (up to maxMissed of them) for the next
// read of the set, which comes within knownMiss: a made-up id costs no
// goroutine and no query of its own.
func (w *warmer) request(sale string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	w.startLocked()
	if !w.known[sale] {
		if len(w.missed) < maxMissed {
			w.missed[sale] = true
		}
		select {
		case w.kick <- struct{}{}:
		default:
		}
		return
	}
	w.queueLocked(sale, time.Now())
}

// queueLocked hands a known sale to the workers, at most once per warmEvery.
// w.mu is held.
func (w *warmer) queueLocked(sale string, now time.Time) {
	if now.Sub(w.last[sale]) < warmEvery {
		return
	}
	select {
	case w.jobs <- sale:
		w.last[sale] = now
	default: // the workers are behind: the gateway asks again
	}
}

// startLocked starts the known-set loop and the workers, once. w.mu is held.
func (w *warmer) startLocked() {
	if w.started {
		return
	}
	w.started = true
	w.wg.Go(w.knownLoop)
	for range warmWorkers {
		w.wg.Go(w.worker)
	}
}

// worker warms the sales of the queue until the warmer stops.
func (w *warmer) worker() {
	for {
		select {
		case <-w.quit:
			return
		case sale := <-w.jobs:
			ctx, cancel := context.WithTimeout(w.ctx, warmTimeout)
			did, err := w.warm(ctx, sale)
			cancel()
			switch {
			case errors.Is(err, errSaleNotFound):
				w.log.Warn("warm requested for a sale MySQL does not know", "sale", sale)
			case err != nil:
				w.log.Error("warm failed", "sale", sale, "err", err)
			case did:
				w.log.Info("sale warmed on request", "sale", sale)
			}
		}
	}
}

// knownLoop reads the known set every knownEvery, and on a request for a
// sale not in it (at most once per knownMiss), until the warmer stops.
func (w *warmer) knownLoop() {
	t := time.NewTicker(knownEvery)
	defer t.Stop()
	for {
		w.readKnown()
		select {
		case <-w.quit:
			return
		case <-t.C:
		case <-w.kick:
		}
		select {
		case <-w.quit:
			return
		case <-time.After(knownMiss):
		}
	}
}

// readKnown reads the known set, forgets what is no longer in it, and
// queues the noted requests of sales it now has.
func (w *warmer) readKnown() {
	ctx, cancel := context.WithTimeout(w.ctx, warmTimeout)
	defer cancel()
	ids, err := mysql.RecentSaleIDs(ctx, w.db, time.Now().UTC().Add(-w.retention))
	if err != nil {
		if w.ctx.Err() == nil {
			w.log.Warn("warm: reading the sales a gateway may ask for", "err", err)
		}
		return
	}
	known := make(map[string]bool, len(ids))
	for _, id := range ids {
		known[id] = true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.known = known
	for id := range w.last {
		if !known[id] {
			delete(w.last, id)
		}
	}
	now := time.Now()
	for id := range w.missed {
		if known[id] {
			w.queueLocked(id, now)
		}
	}
	clear(w.missed)
}

// begin starts the known-set loop and the workers (Backend.Start), so that
// the set is read before the first request.
func (w *warmer) begin() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped {
		w.startLocked()
	}
}

// isKnown reports whether sale is in the known set; before the set was first
// read, any sale is.
func (w *warmer) isKnown(sale string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.known == nil || w.known[sale]
}

// knownCount is the size of the known set and of the noted requests (tests).
func (w *warmer) knownCount() (known, missed, last int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.known), len(w.missed), len(w.last)
}

// stop refuses new requests and waits for the running warms; when ctx ends
// first it cancels them and waits for them to return.
func (w *warmer) stop(ctx context.Context) {
	w.mu.Lock()
	if !w.stopped {
		w.stopped = true
		close(w.quit) // the workers end after the warm in hand
	}
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
