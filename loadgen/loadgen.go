// Package loadgen is flashgate's load generator: C workers fire purchase requests
// (POST /v1/sales/{sale}/orders, docs/design.md §3) at a gateway or at nginx in front
// of it, each as one of a fixed set of users, and collect what came back — the
// counts by status and code, the latencies, and the order ids of every 202, which
// an audit then checks against MySQL and Redis (docs/design.md §2).
//
// By default the load is closed-loop: each worker sends its next request as
// soon as the last one is answered, which finds the peak rate. With a Rate the
// load is open-loop, as in wrk2: requests are due on a fixed timeline, and a
// request's latency runs from when it was due, not from when a worker got round
// to sending it, so a server that stalls is charged for every request its stall
// held back (no coordinated omission).
//
// The hot loop allocates nothing per request: each worker owns one fasthttp
// request and response and its own counters, and shares a few sharded
// histograms; all are merged at the end.
package loadgen

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/valyala/fasthttp"
)

// Config is one load run.
type Config struct {
	// Target is the base URL of the gateway (http://127.0.0.1:8080) or of nginx
	// in front of it (http://127.0.0.1:8000).
	Target string
	Sale   string
	// Tokens holds one Authorization header value per user ("Bearer …").
	Tokens      [][]byte
	Concurrency int
	// Requests and Duration stop the run, whichever comes first; at least one
	// must be set.
	Requests int64
	Duration time.Duration
	// Rate, when above 0, paces the run open-loop at Rate requests per second
	// across all workers: request i is due at start + i/Rate, the next free
	// worker sends it (at once if it is already late), and its latency is
	// measured from when it was due. Concurrency is then only the most requests
	// in flight; too few workers for the rate show as latency (and as send lag).
	// With a Rate, Duration sets the number of requests (Rate × Duration, the
	// smaller of that and Requests when both are set) and the run ends once
	// every one of them is answered, however late, so that none of a stall's
	// victims goes unrecorded. 0 sends as fast as the workers go.
	Rate float64
	// Quantity is the units per order (0 means 1); Region is sent if not "".
	Quantity int64
	Region   string
	// Idempotency sends a fresh Idempotency-Key with every request.
	Idempotency bool
	// ClientIPs sends X-Forwarded-For with a fixed address per user, from
	// 198.18.0.0/15 (the range RFC 2544 sets aside for benchmarks; no packet
	// goes there), as nginx would for buyers behind it. The gateway believes
	// the header only from a trusted proxy, which loopback is by default.
	ClientIPs bool
	// Progress receives a line a second and a final one; nil means none.
	Progress io.Writer
	// Record keeps every request and its answer in Result.Calls, for a
	// checker of the run's history (package history). It allocates per
	// request: leave it off for a benchmark.
	Record bool
}

// Call is one request of a recorded run and its answer.
type Call struct {
	// User is the index in Config.Tokens of the user who sent it.
	User int
	// Key is the Idempotency-Key sent ("" without one).
	Key string
	// Status is the HTTP status, 0 when no answer came (a transport error
	// or a timeout: the request may have been served all the same).
	Status int
	// Code is the body's "code"; Order the order id of a 202 (0 if none).
	Code  string
	Order uint64
	// Sent and Answered bound the request (Answered when the error came,
	// for a transport error).
	Sent, Answered time.Time
}

// Result is what a run saw.
type Result struct {
	// Requests counts every request sent, transport errors included.
	Requests int64
	ByStatus map[int]int64
	// ByCode counts the "code" of the response bodies; a body without one
	// (an nginx error page, say) counts under NoCode.
	ByCode map[string]int64
	// Accepted holds the order ids of the 202 answers, sorted and deduplicated.
	Accepted []uint64
	Elapsed  time.Duration
	// Latency (µs) covers every request that got a response; AcceptedLatency
	// only the 202s. With a Rate both run from when each request was due.
	Latency         *hdrhistogram.Histogram
	AcceptedLatency *hdrhistogram.Histogram
	// Rate is Config.Rate. SendLag (µs; nil without a Rate) is how long after
	// its due time each request left: the part of the latency spent waiting for
	// a free worker or for the load generator's own clock.
	Rate    float64
	SendLag *hdrhistogram.Histogram
	// Errors counts transport errors: refused or reset connections, timeouts.
	Errors int64
	// BadOrderIDs counts 202 answers without a readable order_id.
	BadOrderIDs int64
	// Calls are every request and its answer, with Config.Record (in no
	// particular order); nil without.
	Calls []Call
}

// NoCode is the ByCode key of responses whose body has no "code".
const NoCode = "(none)"

// Histogram bounds: 1 µs to 60 s, 3 significant figures.
const (
	histMin    = 1
	histMax    = int64(60 * time.Second / time.Microsecond)
	histDigits = 3
)

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(histMin, histMax, histDigits) }

// ioTimeout bounds each read and write; a request is never retried.
const ioTimeout = 10 * time.Second

// Run fires requests until cfg.Requests were sent, cfg.Duration passed or ctx
// is done. Requests in flight when it stops are awaited, so that every 202 the
// server sent is in Accepted.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	u, err := url.Parse(cfg.Target)
	if err != nil {
		return nil, fmt.Errorf("loadgen: target %q: %w", cfg.Target, err)
	}
	addr, tls, err := hostAddr(u)
	if err != nil {
		return nil, fmt.Errorf("loadgen: target %q: %w", cfg.Target, err)
	}
	reqURI := strings.TrimSuffix(u.String(), "/") + "/v1/sales/" + url.PathEscape(cfg.Sale) + "/orders"
	body, err := orderBody(cfg.Quantity, cfg.Region)
	if err != nil {
		return nil, err
	}
	client := &fasthttp.HostClient{
		Addr:               addr,
		IsTLS:              tls,
		Name:               "flashgate-loadgen",
		MaxConns:           cfg.Concurrency,
		ReadTimeout:        ioTimeout,
		WriteTimeout:       ioTimeout,
		MaxConnWaitTimeout: ioTimeout,
		// A flood of connects can overflow the server's SYN backlog; the kernel
		// retransmits after 1 s and 3 s, past fasthttp's default 3 s dial timeout.
		Dial:                      func(addr string) (net.Conn, error) { return fasthttp.DialTimeout(addr, ioTimeout) },
		MaxIdemponentCallAttempts: 1,
		// A purchase is not idempotent: a retry after a lost response could buy twice.
		RetryIfErr: func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
	}
	defer client.CloseIdleConnections()

	// Every user clicks, in an order shuffled once per run.
	perm := mrand.Perm(len(cfg.Tokens))
	users := make([][]byte, len(cfg.Tokens))
	var ips [][]byte
	// userOf[i] is the token index of users[i] (for a recorded run).
	userOf := perm
	if cfg.ClientIPs {
		ips = make([][]byte, len(cfg.Tokens))
	}
	for i, p := range perm {
		users[i] = cfg.Tokens[p]
		if ips != nil {
			ips[i] = fmt.Appendf(nil, "198.%d.%d.%d", 18+(p>>16)&1, (p>>8)&255, p&255)
		}
	}
	var idemPrefix []byte
	if cfg.Idempotency {
		var b [6]byte
		_, _ = rand.Read(b[:])
		idemPrefix = hex.AppendEncode([]byte("lg"), b[:])
		idemPrefix = append(idemPrefix, '-')
	}

	r := &run{cfg: cfg, client: client, uri: reqURI, body: body, users: users, ips: ips, idemPrefix: idemPrefix,
		limit: cfg.Requests, userOf: userOf}
	if cfg.Rate > 0 {
		r.interval = float64(time.Second) / cfg.Rate
		if cfg.Duration > 0 {
			n := max(1, int64(math.Round(cfg.Rate*cfg.Duration.Seconds())))
			if r.limit == 0 || n < r.limit {
				r.limit = n
			}
		}
	}
	r.shards = make([]histShard, min(cfg.Concurrency, 4*runtime.GOMAXPROCS(0)))
	for i := range r.shards {
		r.shards[i].lat, r.shards[i].accLat = newHist(), newHist()
		if r.paced() {
			r.shards[i].lag = newHist()
		}
	}
	r.workers = make([]*worker, cfg.Concurrency)
	for i := range r.workers {
		r.workers[i] = newWorker(&r.shards[i%len(r.shards)])
	}

	// The clock starts now: a Duration runs from here.
	start := time.Now()
	r.start = start
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if cfg.Duration > 0 && !r.paced() {
		var cancelT context.CancelFunc
		runCtx, cancelT = context.WithDeadline(runCtx, start.Add(cfg.Duration))
		defer cancelT()
	}
	// Workers poll a flag, not the context, between requests; a paced worker
	// waiting for its next request also wakes on done.
	r.done = runCtx.Done()
	go func() {
		<-runCtx.Done()
		r.stop.Store(true)
	}()

	var wg sync.WaitGroup
	if r.paced() {
		r.due = make(chan struct{}, cfg.Concurrency)
		wg.Go(r.pace)
	}
	for _, w := range r.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.work(w)
		}()
	}
	progressDone := make(chan struct{})
	var progressWG sync.WaitGroup
	if cfg.Progress != nil {
		progressWG.Add(1)
		go func() {
			defer progressWG.Done()
			r.progress(start, progressDone)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(progressDone)
	progressWG.Wait()
	if cfg.Progress != nil {
		r.progressLine(elapsed, true)
	}
	return r.merge(elapsed), nil
}

func (c *Config) validate() error {
	switch {
	case c.Target == "":
		return errors.New("loadgen: no target")
	case c.Sale == "":
		return errors.New("loadgen: no sale")
	case len(c.Tokens) == 0:
		return errors.New("loadgen: no tokens")
	case c.Concurrency < 1:
		return errors.New("loadgen: concurrency must be at least 1")
	case c.Requests < 0 || c.Duration < 0:
		return errors.New("loadgen: requests and duration must not be negative")
	case c.Requests == 0 && c.Duration == 0:
		return errors.New("loadgen: set requests or duration")
	case c.Quantity < 0:
		return errors.New("loadgen: quantity must not be negative")
	case c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0):
		return errors.New("loadgen: rate must be a finite number, at least 0")
	case c.Rate > 0 && c.Duration > 0 && c.Rate*c.Duration.Seconds() > math.MaxInt64/2:
		return errors.New("loadgen: rate × duration is too many requests")
	}
	return nil
}

func hostAddr(u *url.URL) (addr string, tls bool, err error) {
	switch u.Scheme {
	case "http":
	case "https":
		tls = true
	default:
		return "", false, fmt.Errorf("scheme must be http or https")
	}
	if u.Host == "" {
		return "", false, errors.New("no host")
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return "", false, errors.New("no query or fragment, please")
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "80"
		if tls {
			port = "443"
		}
	}
	return net.JoinHostPort(host, port), tls, nil
}

func orderBody(qty int64, region string) ([]byte, error) {
	if qty == 0 {
		qty = 1
	}
	b := struct {
		Quantity int64  `json:"quantity"`
		Region   string `json:"region,omitempty"`
	}{qty, region}
	return json.Marshal(b)
}

type run struct {
	cfg        Config
	client     *fasthttp.HostClient
	uri        string
	body       []byte
	users      [][]byte
	idemPrefix []byte
	ips        [][]byte // X-Forwarded-For per user, or nil
	userOf     []int    // token index of each of users
	workers    []*worker
	shards     []histShard
	// limit is the number of requests to send (0: until stopped).
	limit int64
	// interval is the time between due times in ns (0: unpaced); request i is
	// due at start + i×interval. The pacer puts a token in due for each
	// request that has come due; closed, it means no more.
	interval float64
	start    time.Time
	due      chan struct{}
	done     <-chan struct{}

	next atomic.Int64 // index of the next request
	stop atomic.Bool
}

func (r *run) paced() bool { return r.interval > 0 }

// dueAt is when request i is due on a paced run's timeline.
func (r *run) dueAt(i int64) time.Time {
	return r.start.Add(time.Duration(float64(i) * r.interval))
}

// maxNap bounds one sleep of the pacer, so that it sees a stop soon at low rates.
const maxNap = 50 * time.Millisecond

// pace is a paced run's clock: it hands the workers a token per request as the
// request comes due, all those already due at once when it wakes late, until
// the run's requests are all due or the run stops. On Linux it sleeps in
// nanosleep(2), which wakes within ~0.1 ms: a Go timer, rounded to the
// millisecond of the runtime's poller when the process is idle, would make the
// generator itself add up to a millisecond to every latency of a light load (as
// measured on a 2-core VM: 0.6-1 ms late on average, against 0.1-0.2). A worker
// that takes a token takes the next request and measures from its due time, so
// a token that waits for a busy worker costs that request its wait, as it should.
func (r *run) pace() {
	defer close(r.due)
	for i := int64(0); r.limit == 0 || i < r.limit; i++ {
		due := r.dueAt(i)
		for {
			d := time.Until(due)
			if d <= 0 {
				break
			}
			if r.stop.Load() {
				return
			}
			nap(min(d, maxNap))
		}
		select {
		case r.due <- struct{}{}:
		case <-r.done:
			return
		}
	}
}

// worker is one goroutine's state. Its live counters are atomics written only
// by their owner, read by the progress line; padding keeps workers off each
// other's cache lines.
type worker struct {
	_        [64]byte
	done     atomic.Int64
	accepted atomic.Int64
	errors   atomic.Int64
	badIDs   int64
	_        [64]byte

	byStatus map[int]int64
	byCode   map[string]*int64
	ids      []uint64
	calls    []Call // with Config.Record
	hist     *histShard
}

// histShard is the latency histograms shared by a few workers. A
// histogram is ~200 KB: one per worker would cost gigabytes at a concurrency of
// thousands, and merging them all would take longer than the run. A lock held
// for one RecordValue is nothing next to an HTTP round trip.
type histShard struct {
	mu     sync.Mutex
	lat    *hdrhistogram.Histogram
	accLat *hdrhistogram.Histogram
	lag    *hdrhistogram.Histogram // send lag of a paced run, else nil
	_      [64]byte
}

func newWorker(h *histShard) *worker {
	return &worker{
		byStatus: make(map[int]int64, 8),
		byCode:   make(map[string]*int64, 8),
		hist:     h,
	}
}

var (
	hdrAuthorization  = []byte(fasthttp.HeaderAuthorization)
	hdrIdempotencyKey = []byte("Idempotency-Key")
	hdrXFF            = []byte("X-Forwarded-For")
	jsonContentType   = []byte("application/json")
)

func (r *run) work(w *worker) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(r.uri)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentTypeBytes(jsonContentType)
	req.SetBodyRaw(r.body)
	var idem []byte
	if r.idemPrefix != nil {
		idem = append(make([]byte, 0, len(r.idemPrefix)+20), r.idemPrefix...)
	}
	n := int64(len(r.users))
	limit := r.limit
	paced := r.paced()

	for !r.stop.Load() {
		if paced {
			// The pacer hands out exactly limit tokens, one per request.
			select {
			case _, ok := <-r.due:
				if !ok {
					return
				}
			case <-r.done:
				return
			}
		}
		i := r.next.Add(1) - 1
		if limit > 0 && i >= limit {
			return
		}
		var due time.Time
		if paced {
			due = r.dueAt(i)
		}
		req.Header.SetCanonical(hdrAuthorization, r.users[i%n])
		if r.ips != nil {
			req.Header.SetCanonical(hdrXFF, r.ips[i%n])
		}
		if idem != nil {
			idem = strconv.AppendInt(idem[:len(r.idemPrefix)], i, 10)
			req.Header.SetCanonical(hdrIdempotencyKey, idem)
		}
		t0 := time.Now()
		err := r.client.Do(req, resp)
		t1 := time.Now()
		us := t1.Sub(t0).Microseconds()
		if paced {
			// Open loop: the request's latency runs from when it was due.
			us = t1.Sub(due).Microseconds()
			w.recordLag(t0.Sub(due).Microseconds())
		}
		if r.cfg.Record {
			c := Call{User: r.userOf[i%n], Key: string(idem), Sent: t0, Answered: t1}
			if err == nil {
				c.Status, c.Code = resp.StatusCode(), string(jsonString(resp.Body(), keyCode))
				if c.Status == fasthttp.StatusAccepted {
					c.Order, _ = parseUint(jsonString(resp.Body(), keyOrderID))
				}
			}
			w.calls = append(w.calls, c)
		}
		if err != nil {
			w.errors.Add(1)
			w.done.Add(1)
			continue
		}
		w.record(resp.StatusCode(), resp.Body(), us)
		w.done.Add(1)
	}
}

// recordLag notes how late a paced request left.
func (w *worker) recordLag(us int64) {
	us = min(max(us, 0), histMax)
	w.hist.mu.Lock()
	_ = w.hist.lag.RecordValue(us)
	w.hist.mu.Unlock()
}

func (w *worker) record(status int, body []byte, us int64) {
	us = min(max(us, histMin), histMax)
	w.hist.mu.Lock()
	_ = w.hist.lat.RecordValue(us)
	if status == fasthttp.StatusAccepted {
		_ = w.hist.accLat.RecordValue(us)
	}
	w.hist.mu.Unlock()
	w.byStatus[status]++
	code := jsonString(body, keyCode)
	if code == nil {
		code = []byte(NoCode)
	}
	if p := w.byCode[string(code)]; p != nil { // no allocation: lookup only
		*p++
	} else {
		one := int64(1)
		w.byCode[string(code)] = &one
	}
	if status != fasthttp.StatusAccepted {
		return
	}
	w.accepted.Add(1)
	id, ok := parseUint(jsonString(body, keyOrderID))
	if !ok {
		w.badIDs++
		return
	}
	w.ids = append(w.ids, id)
}

var (
	keyCode    = []byte(`"code":"`)
	keyOrderID = []byte(`"order_id":"`)
)

// jsonString returns the string value after key (which ends in its opening
// quote) in body, or nil. The bodies of docs/design.md §3 carry codes and decimal
// ids, which need no unescaping.
func jsonString(body, key []byte) []byte {
	i := bytes.Index(body, key)
	if i < 0 {
		return nil
	}
	v := body[i+len(key):]
	j := bytes.IndexByte(v, '"')
	if j < 0 {
		return nil
	}
	return v[:j]
}

// parseUint reads a decimal uint64 (strconv.ParseUint would need a string).
func parseUint(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if n > (math.MaxUint64-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}

func (r *run) progress(start time.Time, done <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			r.progressLine(now.Sub(start), false)
		}
	}
}

func (r *run) progressLine(elapsed time.Duration, final bool) {
	var done, acc, errs int64
	for _, w := range r.workers {
		done += w.done.Load()
		acc += w.accepted.Load()
		errs += w.errors.Load()
	}
	secs := elapsed.Seconds()
	el := strconv.FormatFloat(secs, 'f', 0, 64) + "s"
	if final {
		el = strconv.FormatFloat(secs, 'f', 1, 64) + "s"
	}
	rate := 0.0
	if secs > 0 {
		rate = float64(done) / secs
	}
	fmt.Fprintf(r.cfg.Progress, "bench: %s %d req %.0f req/s accepted %d errors %d\n", el, done, rate, acc, errs)
}

func (r *run) merge(elapsed time.Duration) *Result {
	res := &Result{
		ByStatus:        make(map[int]int64),
		ByCode:          make(map[string]int64),
		Elapsed:         elapsed,
		Latency:         newHist(),
		AcceptedLatency: newHist(),
		Rate:            r.cfg.Rate,
	}
	if r.paced() {
		res.SendLag = newHist()
	}
	for _, w := range r.workers {
		res.Requests += w.done.Load()
		res.Errors += w.errors.Load()
		res.BadOrderIDs += w.badIDs
		for s, n := range w.byStatus {
			res.ByStatus[s] += n
		}
		for c, n := range w.byCode {
			res.ByCode[c] += *n
		}
		res.Accepted = append(res.Accepted, w.ids...)
		res.Calls = append(res.Calls, w.calls...)
	}
	for i := range r.shards {
		res.Latency.Merge(r.shards[i].lat)
		res.AcceptedLatency.Merge(r.shards[i].accLat)
		if res.SendLag != nil {
			res.SendLag.Merge(r.shards[i].lag)
		}
	}
	slices.Sort(res.Accepted)
	res.Accepted = slices.Compact(res.Accepted)
	return res
}

// Throughput is requests per second over the run.
func (r *Result) Throughput() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Elapsed.Seconds()
}

// Write prints the result: totals and throughput, counts by status and by
// code, latency percentiles of all responses and of the accepted ones.
func (r *Result) Write(w io.Writer) {
	fmt.Fprintf(w, "requests   %d in %.2fs, %.0f req/s, transport errors %d\n",
		r.Requests, r.Elapsed.Seconds(), r.Throughput(), r.Errors)

	statuses := make([]int, 0, len(r.ByStatus))
	for s := range r.ByStatus {
		statuses = append(statuses, s)
	}
	sort.Ints(statuses)
	var sb strings.Builder
	for i, s := range statuses {
		if i > 0 {
			sb.WriteString("  ")
		}
		fmt.Fprintf(&sb, "%d: %d", s, r.ByStatus[s])
	}
	fmt.Fprintf(w, "status     %s\n", sb.String())

	codes := make([]string, 0, len(r.ByCode))
	for c := range r.ByCode {
		codes = append(codes, c)
	}
	// Most frequent first; ties by name for a stable listing.
	sort.Slice(codes, func(i, j int) bool {
		if r.ByCode[codes[i]] != r.ByCode[codes[j]] {
			return r.ByCode[codes[i]] > r.ByCode[codes[j]]
		}
		return codes[i] < codes[j]
	})
	for i, c := range codes {
		label := "code"
		if i > 0 {
			label = ""
		}
		fmt.Fprintf(w, "%-10s %-16s %d\n", label, c, r.ByCode[c])
	}
	fmt.Fprintf(w, "accepted   %d order ids", len(r.Accepted))
	if r.BadOrderIDs > 0 {
		fmt.Fprintf(w, " (%d 202s without a readable order_id)", r.BadOrderIDs)
	}
	fmt.Fprintln(w)
	if r.Rate > 0 {
		fmt.Fprintf(w, "%-10s asked %.0f req/s, sent %.0f req/s; latency runs from each request's due time\n",
			"rate", r.Rate, r.Throughput())
	}
	writeLatency(w, "latency", "all", r.Latency)
	writeLatency(w, "", "202", r.AcceptedLatency)
	if r.SendLag != nil {
		writeLatency(w, "send lag", "all", r.SendLag)
	}
}

func writeLatency(w io.Writer, label, of string, h *hdrhistogram.Histogram) {
	if h == nil || h.TotalCount() == 0 {
		fmt.Fprintf(w, "%-10s %-4s none\n", label, of)
		return
	}
	fmt.Fprintf(w, "%-10s %-4s p50 %s  p99 %s  p999 %s  max %s\n", label, of,
		us(h.ValueAtQuantile(50)), us(h.ValueAtQuantile(99)), us(h.ValueAtQuantile(99.9)), us(h.Max()))
}

// us renders microseconds the way a person reads latencies.
func us(v int64) string {
	d := time.Duration(v) * time.Microsecond
	switch {
	case d < time.Millisecond:
		return strconv.FormatInt(v, 10) + "µs"
	case d < time.Second:
		return strconv.FormatFloat(float64(v)/1e3, 'f', 2, 64) + "ms"
	default:
		return strconv.FormatFloat(d.Seconds(), 'f', 2, 64) + "s"
	}
}

// Summary is a Result in figures, the shape `flashgate bench --json` writes.
type Summary struct {
	Requests int64 `json:"requests"`
	// TransportErrors counts requests without a response.
	TransportErrors int64            `json:"transport_errors"`
	ByStatus        map[int]int64    `json:"by_status"`
	ByCode          map[string]int64 `json:"by_code"`
	// Accepted counts distinct order ids of 202 answers.
	Accepted    int     `json:"accepted"`
	BadOrderIDs int64   `json:"bad_order_ids"`
	ElapsedS    float64 `json:"elapsed_s"`
	// Throughput is requests sent per second over the run.
	Throughput float64 `json:"throughput"`
	// Rate is the rate asked for (0: as fast as possible); LatencyFrom says
	// where latencies start: "due" (paced: the request's place on the
	// timeline) or "sent".
	Rate            float64     `json:"rate"`
	LatencyFrom     string      `json:"latency_from"`
	Latency         Percentiles `json:"latency_us"`
	AcceptedLatency Percentiles `json:"accepted_latency_us"`
	// SendLag is how late paced requests left (absent unpaced).
	SendLag *Percentiles `json:"send_lag_us,omitempty"`
}

// Percentiles of a latency histogram, in µs.
type Percentiles struct {
	Count int64 `json:"count"`
	P50   int64 `json:"p50"`
	P90   int64 `json:"p90"`
	P99   int64 `json:"p99"`
	P999  int64 `json:"p999"`
	Max   int64 `json:"max"`
}

// PercentilesOf reads h (all zero for a nil or empty histogram).
func PercentilesOf(h *hdrhistogram.Histogram) Percentiles {
	if h == nil || h.TotalCount() == 0 {
		return Percentiles{}
	}
	return Percentiles{
		Count: h.TotalCount(),
		P50:   h.ValueAtQuantile(50),
		P90:   h.ValueAtQuantile(90),
		P99:   h.ValueAtQuantile(99),
		P999:  h.ValueAtQuantile(99.9),
		Max:   h.Max(),
	}
}

// Summary condenses the result.
func (r *Result) Summary() Summary {
	s := Summary{
		Requests: r.Requests, TransportErrors: r.Errors, ByStatus: r.ByStatus, ByCode: r.ByCode,
		Accepted: len(r.Accepted), BadOrderIDs: r.BadOrderIDs, ElapsedS: r.Elapsed.Seconds(),
		Throughput: r.Throughput(), Rate: r.Rate, LatencyFrom: "sent",
		Latency: PercentilesOf(r.Latency), AcceptedLatency: PercentilesOf(r.AcceptedLatency),
	}
	if r.Rate > 0 {
		s.LatencyFrom = "due"
	}
	if r.SendLag != nil {
		p := PercentilesOf(r.SendLag)
		s.SendLag = &p
	}
	return s
}
