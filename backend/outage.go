package backend

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/mysql"
)

// Outages (docs/ingest.md, "Outages: orders wait"). A batch that fails
// because a dependency of its sale cannot write now — MySQL down, locked,
// read-only (mysql.Stalled); a Redis of any of the sale's tags, its buckets'
// among them, that does not answer or answers writes with a refusal (MISCONF,
// OOM, NOPERM, READONLY, LOADING, …); NATS away — is not the orders' fault.
// Its messages are held in the backend's waiting room: not nak'ed, so the
// outage spends none of their deliveries, kept from redelivery by
// InProgress, and written when a probe finds every dependency of the sale
// answering writes again. Only an order that fails while its dependencies
// write is poison (retryLater).

const (
	// waitFirst is the first pause of a waiting sale before its probe; it
	// doubles per failed probe or try, up to waitMax.
	waitFirst = 250 * time.Millisecond
	waitMax   = 2 * time.Second
	// probeKeyTTL bounds the life of the key the Redis probe writes.
	probeKeyTTL = 10 * time.Second
)

// redisRefusals are the first words of the Redis error replies that say the
// server cannot take the write now, not that the write is wrong.
var redisRefusals = map[string]bool{
	"MISCONF": true, "OOM": true, "NOPERM": true, "READONLY": true, "LOADING": true, "BUSY": true,
	"MASTERDOWN": true, "NOREPLICAS": true, "CLUSTERDOWN": true, "TRYAGAIN": true, "NOAUTH": true,
	"WRONGPASS": true, "UNBLOCKED": true, "MOVED": true, "ASK": true,
}

// redisUnavailable reports whether err says a Redis cannot take a write now:
// an error reply of redisRefusals, or what Redis 7 makes of an ACL refusal
// inside a script ("ERR The user executing the script can't run this
// command…", "… no permissions …"), or a connection that failed or closed.
func redisUnavailable(err error) bool {
	if err == nil {
		return false
	}
	var re *rueidis.RedisError
	if errors.As(err, &re) && !re.IsNil() {
		msg := re.Error()
		word, _, _ := strings.Cut(msg, " ")
		if redisRefusals[word] {
			return true
		}
		low := strings.ToLower(msg)
		return strings.Contains(low, "user executing the script") || strings.Contains(low, "no permissions") ||
			strings.Contains(low, "max number of clients") ||
			strings.Contains(low, "function not found")
	}
	return errors.Is(err, rueidis.ErrClosing) || errors.Is(err, io.EOF) || errors.Is(err, rueidis.ErrNoSlot)
}

// unavailable reports whether err says a dependency cannot write now (MySQL
// or Redis, or Redis's replicas under redis.wait_replicas): the batch waits
// instead of being taken for poison.
func unavailable(err error) bool {
	return mysql.Stalled(err) || redisUnavailable(err) || errors.Is(err, errSaleCold) || errors.Is(err, lua.ErrNotReplicated) ||
		errors.Is(err, errClaimStale)
}

// errSaleCold: an order's tag in Redis is not warm (claim.lua's 'cold'): it
// waits for the rebuild, which the gateways and the leader ask for.
var errSaleCold = errors.New("the sale is not warm in Redis")

// writable probes every dependency of sale's orders for writes: NATS
// connected, MySQL's tables answering, and a script's write on each of the
// sale's hash tags (the sale's own and each bucket's). nil when all answer.
func (ig *ingest) writable(sale string) error {
	if !ig.nc.IsConnected() {
		return errors.New("NATS: not connected")
	}
	ctx, cancel := context.WithTimeout(ig.procCtx, probeTimeout)
	defer cancel()
	if err := mysql.Probe(ctx, ig.db, sale); err != nil {
		return err
	}
	k, err := keysOf(ctx, ig.db, sale)
	if err != nil {
		return err
	}
	tags := []*lua.Keys{k}
	tags = append(tags, k.Buckets()...)
	for _, t := range tags {
		if err := lua.ProbeWrite(ctx, ig.rc, t.Meta+":probe", probeKeyTTL); err != nil {
			return err
		}
	}
	return nil
}

// waitRoom holds the messages of sales a dependency of which is away.
type waitRoom struct {
	ig     *ingest
	mu     sync.Mutex
	sales  map[string]*waitingSale
	closed bool
	stop   chan struct{}
	wg     sync.WaitGroup
}

// waitingSale is one sale's messages waiting, and why.
type waitingSale struct {
	held []entry
	// at: the index in held of each stream sequence (a message the server
	// delivered again replaces its older delivery).
	at    map[uint64]int
	cause error
	since time.Time
}

// newWaitRoom makes the room and starts its keeper, which tells the server
// every ack_wait/3 that the held messages are in progress.
func newWaitRoom(ig *ingest) *waitRoom {
	r := &waitRoom{ig: ig, sales: map[string]*waitingSale{}, stop: make(chan struct{})}
	r.wg.Add(1)
	go r.keep(max(ig.ackWait()/3, 10*time.Millisecond))
	return r
}

// keep touches every held message each period until the room closes.
func (r *waitRoom) keep(period time.Duration) {
	defer r.wg.Done()
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		r.mu.Lock()
		var es []entry
		for _, w := range r.sales {
			es = append(es, w.held...)
		}
		r.mu.Unlock()
		r.touchAll(es)
	}
}

// hold puts es in sale's waiting line (cause: why they could not be
// written), starting the sale's waiter if it has none. After close, they are
// nak'ed for another backend.
func (r *waitRoom) hold(sale string, es []entry, cause error) {
	if len(es) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		r.giveBack(es)
		return
	}
	w := r.sales[sale]
	if w == nil {
		w = &waitingSale{since: time.Now(), at: map[uint64]int{}}
		r.sales[sale] = w
		r.ig.log.Warn("a dependency of the sale cannot write: its orders wait until it can", "sale", sale, "err", cause)
		r.wg.Add(1)
		go r.wait(sale, w)
	}
	added := 0
	for _, e := range es {
		seq := streamSeq(e.msg)
		if i, ok := w.at[seq]; ok && seq != 0 {
			w.held[i] = e // delivered again: the newer delivery is the live one
			continue
		}
		w.at[seq] = len(w.held)
		w.held = append(w.held, e)
		added++
	}
	w.cause = cause
	r.ig.ops.waiting.Add(float64(added))
	r.ig.ops.held.Add(float64(len(es)))
}

// join puts es in sale's waiting line if the sale waits (untried: they would
// fail as its last try did); false if it does not.
func (r *waitRoom) join(sale string, es []entry) bool {
	r.mu.Lock()
	w := r.sales[sale]
	var cause error
	if w != nil {
		cause = w.cause
	}
	r.mu.Unlock()
	if w == nil {
		return false
	}
	r.hold(sale, es, cause)
	return true
}

// take empties sale's waiting line and returns what it held.
func (r *waitRoom) take(w *waitingSale) []entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	es := w.held
	w.held, w.at = nil, map[uint64]int{}
	r.ig.ops.waiting.Sub(float64(len(es)))
	return es
}

// wait is one waiting sale's loop: it keeps the held messages from
// redelivery, probes the sale's dependencies with a pause that doubles up to
// waitMax, and when they answer writes tries the held orders again, a batch
// at a time; it ends when nothing of the sale waits any more.
func (r *waitRoom) wait(sale string, w *waitingSale) {
	defer r.wg.Done()
	ig := r.ig
	delay := waitFirst
	for {
		select {
		case <-r.stop:
			r.giveBack(r.take(w))
			return
		case <-time.After(delay):
		}
		ig.ops.probes.Inc()
		if err := ig.writable(sale); err != nil {
			ig.log.Debug("sale's dependencies still refuse writes", "sale", sale, "err", err)
			delay = min(2*delay, waitMax)
			continue
		}
		es := r.take(w)
		size := max(ig.cfg.Backend.BatchSize, 1)
		for i := 0; i < len(es); i += size {
			part := es[i:min(i+size, len(es))]
			r.touchAll(part) // its ack wait starts now: the parts before it may have been slow
			ig.writeSale(sale, part)
			r.mu.Lock()
			again, cause := len(w.held) > 0, w.cause
			r.mu.Unlock()
			if again && i+size < len(es) {
				// Away again: the rest waits untried.
				r.hold(sale, es[i+size:], cause)
				break
			}
		}
		r.mu.Lock()
		if len(w.held) == 0 {
			delete(r.sales, sale)
			r.mu.Unlock()
			ig.log.Info("the sale's dependencies write again: its waiting orders were tried", "sale", sale,
				"orders", len(es), "waited", time.Since(w.since).Round(time.Millisecond))
			return
		}
		r.mu.Unlock()
		delay = min(2*delay, waitMax)
	}
}

// touchAll tells the server the messages are being worked on (their ack
// wait starts again, no delivery is spent).
func (r *waitRoom) touchAll(es []entry) {
	for _, e := range es {
		if err := e.msg.InProgress(); err != nil {
			r.ig.log.Debug("in progress", "sale", e.order.SaleID, "order", e.order.ID, "err", err)
		}
	}
}

// giveBack naks held messages for another backend (at shutdown).
func (r *waitRoom) giveBack(es []entry) {
	for _, e := range es {
		if err := e.msg.Nak(); err != nil {
			r.ig.log.Debug("nak on shutdown", "sale", e.order.SaleID, "order", e.order.ID, "err", err)
		}
	}
}

// close ends every waiter (their messages are nak'ed) and waits for them;
// what is held later is nak'ed at once.
func (r *waitRoom) close() {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.stop)
	}
	r.mu.Unlock()
	r.wg.Wait()
}
