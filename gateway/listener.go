package gateway

import (
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
)

// edgeListener is the public port's listener. fasthttp's Serve returns for
// good on the first accept error that is not a timeout, so a burst of
// connections that runs the process out of descriptors (EMFILE) would end the
// port until a restart; this listener backs off and retries instead, as
// net/http does. It also caps the open connections below the descriptor limit
// (and per peer address), refusing the excess at once with the API's JSON,
// gives every new connection a deadline for its first byte (fasthttp reads it
// with none), and lingers on a refused connection so the client reads the
// refusal instead of a reset.
type edgeListener struct {
	net.Listener
	max         int64 // open connections at most
	perIP       int   // per peer address (0: none); trusted proxies are exempt
	proxies     proxies
	firstByte   time.Duration // deadline of a new connection's first byte
	lingerTime  time.Duration
	lingerBytes int64

	open    atomic.Int64
	backoff atomic.Bool // sleeping after a failed Accept
	mu      sync.Mutex
	byIP    map[netip.Addr]int

	// lingerSlots bounds the refused connections lingering at once outside
	// fasthttp's workers: each holds a descriptor above the cap.
	lingerSlots chan struct{}
	lingering   sync.WaitGroup // the refusals' lingering closes (wait: Shutdown)
	// wake cuts a back-off short when a connection closes: a descriptor
	// has just been freed, so accept may succeed again.
	wake      chan struct{}
	done      chan struct{}
	closeOnce sync.Once

	acceptErrors prometheus.Counter
	refusedMax   prometheus.Counter
	refusedIP    prometheus.Counter
	onRefuse     func() // also counts every refusal (the limiter refusals' "conns")
}

type edgeOptions struct {
	maxConns, perIP int
	proxies         proxies
	firstByte       time.Duration
	lingerTime      time.Duration
	lingerBytes     int64
	reg             prometheus.Registerer
	onRefuse        func()
}

func newEdgeListener(ln net.Listener, o edgeOptions) *edgeListener {
	l := &edgeListener{
		Listener: ln, max: int64(o.maxConns), perIP: o.perIP, proxies: o.proxies,
		firstByte: o.firstByte, lingerTime: o.lingerTime, lingerBytes: o.lingerBytes,
		onRefuse: o.onRefuse, byIP: map[netip.Addr]int{}, lingerSlots: make(chan struct{}, 64),
		wake: make(chan struct{}, 1), done: make(chan struct{}),
	}
	const ns, sub = "flashgate", "gateway"
	l.acceptErrors = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
		Name: "accept_errors_total", Help: "Temporary accept errors (EMFILE, ENFILE, ENOBUFS, ...) on the public port, each followed by a back-off."})
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
		Name: "conns_refused_total", Help: "Connections closed at accept: over gateway.max_conns (max_conns) or gateway.max_conns_per_ip (per_ip)."},
		[]string{"reason"})
	l.refusedMax = refused.WithLabelValues("max_conns")
	l.refusedIP = refused.WithLabelValues("per_ip")
	open := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
		Name: "open_conns", Help: "Connections open on the public port."},
		func() float64 { return float64(l.open.Load()) })
	capG := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
		Name: "max_conns", Help: "The cap on open connections of the public port."},
		func() float64 { return float64(l.max) })
	if o.reg != nil {
		o.reg.MustRegister(l.acceptErrors, refused, open, capG)
	}
	return l
}

// Refusals written to a connection before it is closed: built once, so a
// flood of refused connections costs no allocation. Each comes with every
// Retry-After retryAfter(0) can draw (1-3 s), one picked at random per
// refusal (refusal), so the refused come back spread out.
var (
	refuseBusy = rawJSONRefusals(503, "Service Unavailable", `{"code":"unavailable","message":"too many connections: retry shortly"}`)
	refuseIP   = rawJSONRefusals(429, "Too Many Requests", `{"code":"rate_limited","message":"too many connections from your address"}`)
)

// rawJSONRefusals is a refusal with a Retry-After of 1, 2 and 3 seconds.
func rawJSONRefusals(status int, reason, body string) [3][]byte {
	var out [3][]byte
	for i := range out {
		out[i] = rawJSONResponse(status, reason, body, i+1)
	}
	return out
}

// refusal picks one of rs at random.
func refusal(rs *[3][]byte) []byte { return rs[rand.IntN(len(rs))] }

func rawJSONResponse(status int, reason, body string, retryAfter int) []byte {
	s := "HTTP/1.1 " + strconv.Itoa(status) + " " + reason + "\r\nContent-Type: application/json\r\n"
	if retryAfter > 0 {
		s += "Retry-After: " + strconv.Itoa(retryAfter) + "\r\n"
	}
	return []byte(s + "Connection: close\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}

// temporaryAccept reports whether an accept error passes: the process (or
// system) is out of descriptors or buffers, or the peer gave up first.
func temporaryAccept(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.ECONNRESET)
}

func (l *edgeListener) Accept() (net.Conn, error) {
	var delay time.Duration
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if !temporaryAccept(err) {
				return nil, err
			}
			// net/http's schedule: 5 ms doubling to 1 s. The pending
			// connections wait in the kernel's backlog meanwhile.
			l.acceptErrors.Inc()
			l.backoff.Store(true)
			if delay == 0 {
				delay = 5 * time.Millisecond
			} else if delay *= 2; delay > time.Second {
				delay = time.Second
			}
			slog.Warn("gateway: accept failed, retrying", "err", err, "in", delay)
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-l.wake:
				t.Stop()
			case <-l.done:
				t.Stop()
			}
			// Not ready only while backing off: if the connections that
			// failed went away, the next Accept blocks with nothing wrong.
			l.backoff.Store(false)
			continue
		}
		delay = 0
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			l.refusedMax.Inc()
			l.refuse(c, refusal(&refuseBusy))
			continue
		}
		ec := &edgeConn{Conn: c, l: l}
		if l.perIP > 0 {
			ip := peerAddr(c.RemoteAddr())
			if !l.proxies.trusted(ip) {
				ip = connKey(ip)
				l.mu.Lock()
				if l.byIP[ip] >= l.perIP {
					l.mu.Unlock()
					l.open.Add(-1)
					l.refusedIP.Inc()
					l.refuse(c, refusal(&refuseIP))
					continue
				}
				l.byIP[ip]++
				l.mu.Unlock()
				ec.ip, ec.counted = ip, true
			}
		}
		if l.firstByte > 0 {
			// fasthttp sets its read deadline only once the first byte is
			// in: without this a connection that never sends holds its
			// descriptor until the client leaves.
			_ = c.SetReadDeadline(time.Now().Add(l.firstByte))
		}
		return ec, nil
	}
}

// connKey is the per-address cap's key: an IPv6 client by its /64, the
// smallest block a site is given (one host may hold all of it).
func connKey(ip netip.Addr) netip.Addr {
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.Addr()
	}
	return ip
}

// refuse answers a connection the caps leave no room for and closes it. The
// request may already be in the socket: closing over unread bytes sends a
// reset that can destroy the answer in flight, so while a slot is free the
// close lingers (briefly) in its own goroutine; otherwise it is immediate.
func (l *edgeListener) refuse(c net.Conn, answer []byte) {
	if l.onRefuse != nil {
		l.onRefuse()
	}
	_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	_, _ = c.Write(answer)
	select {
	case l.lingerSlots <- struct{}{}:
		l.lingering.Add(1)
		go func() {
			defer func() { <-l.lingerSlots; l.lingering.Done() }()
			lingerClose(c, min(l.lingerTime, 500*time.Millisecond), 64<<10)
		}()
	default:
		_ = c.Close()
	}
}

func (l *edgeListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// notAccepting says why new connections are not being served, or "".
func (l *edgeListener) notAccepting() string {
	if l.backoff.Load() {
		return "public port: accept failing (out of file descriptors?), backing off"
	}
	if n := l.open.Load(); n >= l.max {
		return "public port: at gateway.max_conns (" + strconv.FormatInt(n, 10) + " open)"
	}
	return ""
}

// edgeConn is one accepted connection: it gives its slots back on close, and
// lingers first when a refusal was written over a request not read whole.
type edgeConn struct {
	net.Conn
	l       *edgeListener
	ip      netip.Addr
	counted bool
	linger  atomic.Bool
	once    sync.Once
	err     error
}

func (c *edgeConn) Close() error {
	c.once.Do(func() {
		if c.linger.Load() {
			c.err = lingerClose(c.Conn, c.l.lingerTime, c.l.lingerBytes)
		} else {
			c.err = c.Conn.Close()
		}
		// Released after the descriptor is: the cap counts descriptors.
		if c.counted {
			c.l.mu.Lock()
			if c.l.byIP[c.ip]--; c.l.byIP[c.ip] <= 0 {
				delete(c.l.byIP, c.ip)
			}
			c.l.mu.Unlock()
		}
		c.l.open.Add(-1)
		select {
		case c.l.wake <- struct{}{}:
		default:
		}
	})
	return c.err
}

// lingerClose is nginx's lingering close: send FIN after the answer, then
// read and discard what the client still sends, for at most d and n bytes,
// before closing. A client still writing its body then reads the answer
// instead of a reset (closing over unread input makes the kernel send RST).
func lingerClose(c net.Conn, d time.Duration, n int64) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok && d > 0 && n > 0 {
		if cw.CloseWrite() == nil {
			_ = c.SetReadDeadline(time.Now().Add(d))
			_, _ = io.CopyN(io.Discard, c, n)
		}
	}
	return c.Close()
}

// lingerOnClose marks the request's connection to linger when it closes.
func lingerOnClose(ctx *fasthttp.RequestCtx) {
	if c, ok := ctx.Conn().(*edgeConn); ok {
		c.linger.Store(true)
	}
}
