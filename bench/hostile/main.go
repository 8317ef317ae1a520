// Command hostile is the hostile-client suite behind `make hostile` (scripts/hostile.sh; see
// docs/hostile.md). It plays a set of attacks that need no credentials, only connections,
// against the gateway's own port and against nginx in front of it, one attack and one port at a
// time, and beside each it runs two probes that do what a buyer's page does: one
// `GET /v1/sales/{id}` every 50 ms on a new connection, and one every 50 ms on a kept-alive
// connection. Per attack and port it prints one line: the probes' success, their p99 against the
// same probes' p99 with no attack (the baseline), and whether the port served a new connection
// again by itself after the attack stopped, and how soon. Last come the targets:
//
//	target <name>: <figure> (goal <goal>) met|missed
//
// Everything is bounded in count and time, and every byte goes to 127.0.0.1 (or ::1): attackers
// and probes use source addresses of their own in 127.0.0.0/8 so that per-address limits see many
// clients (nginx's limit_req/limit_conn, the gateway's per-IP limits) and the probes are never
// limited for what the attackers do. With --nginx6, the slow bodies through nginx come from one
// IPv6 /64 instead (--slow-body-net, routed to the loopback): one host, many addresses.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// target is one port under test.
type target struct {
	Name string `json:"name"` // "gateway" or "nginx"
	Addr string `json:"addr"`
}

type settings struct {
	sale           string
	duration       time.Duration
	baseline       time.Duration
	fdConns        int
	fdOpenRate     int
	slowloris      int
	silent         int
	slowBodies     int
	slowBodyAddrs  int
	slowBodyEvery  time.Duration
	slowBodyNet    netip.Prefix
	nginx6         string
	pipeConns      int
	churnRate      int
	smuggleRate    int
	oversizeTries  int
	recoveryWithin time.Duration
	probeTimeout   time.Duration
	preBaseline    time.Duration
	trace          string
	probeAddr      string
	// the junk-command attack (junk.go)
	junkRate  int
	junkUsers int
	payRate   int
	config    string
}

// probeAddr is where the probes go: the port under attack, or --probe-addr.
func probeAddr(t target) string {
	if set.probeAddr != "" {
		return set.probeAddr
	}
	return t.Addr
}

var set settings

func main() {
	os.Exit(run())
}

func run() int {
	gw := flag.String("gateway", "127.0.0.1:8080", "the gateway's public port")
	ngx := flag.String("nginx", "127.0.0.1:8000", "nginx's port")
	ports := flag.String("ports", "nginx,gateway", "ports to attack, in order: nginx, gateway")
	only := flag.String("attacks", "", "comma-separated attacks to run (default: all): "+strings.Join(attackNames(), ","))
	flag.StringVar(&set.sale, "sale", "", "id of an existing sale: the probes GET /v1/sales/{id} (required)")
	flag.DurationVar(&set.duration, "duration", 12*time.Second, "length of each attack")
	flag.DurationVar(&set.baseline, "baseline", 5*time.Second, "length of the suite's first no-attack baseline, per port")
	flag.DurationVar(&set.preBaseline, "pre-baseline", 0, "length of the no-attack baseline taken right before each attack, the p99 ratio's denominator (0: as long as the attack, so that both p99s come from as many requests)")
	flag.IntVar(&set.fdConns, "fd-conns", 20000, "fd exhaustion: idle keep-alive connections to open (split over child processes by their open-file limit)")
	flag.IntVar(&set.fdOpenRate, "open-rate", 2500, "fd exhaustion: connections opened per second, all children together (0: unpaced, as fast as 64 dialers per child get answers)")
	flag.IntVar(&set.slowloris, "slowloris", 3000, "slowloris connections")
	flag.IntVar(&set.silent, "silent", 2000, "connections that send nothing")
	flag.IntVar(&set.slowBodies, "slow-bodies", 2000, "slow-body connections")
	flag.IntVar(&set.slowBodyAddrs, "slow-body-addrs", 100, "source addresses the slow bodies come from")
	flag.DurationVar(&set.slowBodyEvery, "slow-body-every", 2*time.Second, "a slow body sends one byte this often")
	flag.StringVar(&set.nginx6, "nginx6", "", "nginx's IPv6 loopback port ([::1]:<port>): the slow bodies through nginx come from --slow-body-net to it (empty: from IPv4 addresses to --nginx)")
	slowNet := flag.String("slow-body-net", "fd66:6c61:7465:1::/64", "with --nginx6: the IPv6 /64 the slow bodies through nginx come from, routed to this host (ip -6 route add local <net> dev lo)")
	flag.IntVar(&set.pipeConns, "pipeline-conns", 8, "pipelining connections (each sends 50 requests at once, 10 times a second)")
	flag.IntVar(&set.churnRate, "churn-rate", 1000, "connection churn: new connections per second")
	flag.IntVar(&set.smuggleRate, "smuggle-rate", 200, "smuggling attempts per second")
	flag.IntVar(&set.oversizeTries, "oversize-tries", 800, "oversized bodies: 64 KiB POSTs per port, spread over the attack")
	flag.DurationVar(&set.recoveryWithin, "recovery", time.Second, "goal: a new connection served within this after an attack")
	flag.DurationVar(&set.probeTimeout, "probe-timeout", 2*time.Second, "a probe request slower than this failed")
	flag.StringVar(&set.trace, "trace", "", "append every probe request to this file: <attack> <port> <phase> <seconds from the phase's start> <new|keep> <ms> <ok|failure>")
	flag.IntVar(&set.junkRate, "junk-rate", 2000, "junk commands: cancels of made-up order ids per second, all accounts together")
	flag.IntVar(&set.junkUsers, "junk-users", 500, "junk commands: the buyer accounts (and source addresses) they come from")
	flag.IntVar(&set.payRate, "pay-rate", 50, "junk commands: real payments per second beside the junk")
	flag.StringVar(&set.config, "config", "configs/flashgate.yaml", "junk commands: the stack's configuration, read (with the FLASHGATE_* environment) for the token and payments secrets")
	flag.StringVar(&set.probeAddr, "probe-addr", "", "probe this 127.0.0.1 address instead of the port under attack (e.g. the gateway while nginx is attacked): what the attack costs the machine, not the port")
	holdAddr := flag.String("hold-idle", "", "(internal: a child of the fd exhaustion) hold idle connections to this address")
	holdN := flag.Int("hold-n", 0, "(internal) how many")
	holdOffset := flag.Int("hold-offset", 0, "(internal) first source address")
	note := flag.String("note", "", "a line for the results: what was measured (e.g. the commit)")
	jsonOut := flag.String("json", "bench/hostile-results.json", "write the results here (empty: don't)")
	mdOut := flag.String("markdown", "BENCHMARKS.md", "rewrite the make hostile section of this file (empty: don't)")
	flag.Parse()
	ownLimit = raiseNofile()
	if *holdAddr != "" {
		return holdChild(*holdAddr, *holdN, *holdOffset)
	}
	if set.sale == "" {
		fmt.Fprintln(os.Stderr, "hostile: --sale is required (an existing sale's id)")
		return 2
	}
	all := map[string]target{"gateway": {"gateway", *gw}, "nginx": {"nginx", *ngx}}
	var targets []target
	for _, p := range strings.Split(*ports, ",") {
		t, ok := all[strings.TrimSpace(p)]
		if !ok {
			fmt.Fprintf(os.Stderr, "hostile: unknown port %q (nginx, gateway)\n", p)
			return 2
		}
		// This tool attacks: it must never be pointed anywhere but this machine.
		if host, _, err := net.SplitHostPort(t.Addr); err != nil || host != "127.0.0.1" {
			fmt.Fprintf(os.Stderr, "hostile: %s address %q: only 127.0.0.1:<port> is allowed\n", t.Name, t.Addr)
			return 2
		}
		targets = append(targets, t)
	}
	if set.nginx6 != "" {
		if host, _, err := net.SplitHostPort(set.nginx6); err != nil || host != "::1" {
			fmt.Fprintf(os.Stderr, "hostile: --nginx6 %q: only [::1]:<port> is allowed\n", set.nginx6)
			return 2
		}
		p, err := netip.ParsePrefix(*slowNet)
		if err != nil || !p.Addr().Is6() || p.Bits() != 64 {
			fmt.Fprintf(os.Stderr, "hostile: --slow-body-net %q: an IPv6 /64\n", *slowNet)
			return 2
		}
		set.slowBodyNet = p.Masked()
	}
	if set.probeAddr != "" {
		if host, _, err := net.SplitHostPort(set.probeAddr); err != nil || host != "127.0.0.1" {
			fmt.Fprintf(os.Stderr, "hostile: --probe-addr %q: only 127.0.0.1:<port> is allowed\n", set.probeAddr)
			return 2
		}
	}
	attacks := allAttacks()
	if *only != "" {
		var sel []attack
		for _, name := range strings.Split(*only, ",") {
			a, ok := findAttack(strings.TrimSpace(name))
			if !ok {
				fmt.Fprintf(os.Stderr, "hostile: unknown attack %q (%s)\n", name, strings.Join(attackNames(), ","))
				return 2
			}
			sel = append(sel, a)
		}
		attacks = sel
	}
	limit := ownLimit
	logf("open-file limit %d; fd exhaustion opens %d connections from child processes", limit, set.fdConns)

	res := &results{
		Started: time.Now().UTC(), Sale: set.sale, Limit: limit, CPUs: runtime.NumCPU(),
		Settings: map[string]string{
			"duration": set.duration.String(), "baseline": set.baseline.String(), "pre_baseline": preBaselineText(),
			"fd_open_rate": strconv.Itoa(set.fdOpenRate),
			"fd_conns":     strconv.Itoa(set.fdConns), "slowloris": strconv.Itoa(set.slowloris),
			"silent": strconv.Itoa(set.silent), "slow_bodies": strconv.Itoa(set.slowBodies),
			"slow_body_addrs": strconv.Itoa(set.slowBodyAddrs), "slow_body_every": set.slowBodyEvery.String(),
			"slow_body_net":  slowBodyNetText(),
			"pipeline_conns": strconv.Itoa(set.pipeConns), "churn_rate": strconv.Itoa(set.churnRate),
			"smuggle_rate":   strconv.Itoa(set.smuggleRate),
			"oversize_tries": strconv.Itoa(set.oversizeTries), "probe_timeout": set.probeTimeout.String(),
			"junk_rate": strconv.Itoa(set.junkRate), "junk_users": strconv.Itoa(set.junkUsers), "pay_rate": strconv.Itoa(set.payRate),
		},
		Baselines: map[string]probeSummary{}, Note: *note, LoadStart: loadavg(),
	}
	for _, t := range targets {
		if !serves(t, set.probeTimeout) {
			fmt.Fprintf(os.Stderr, "hostile: %s (%s) does not answer GET /v1/sales/%s with 200: is the stack up and the sale there?\n", t.Name, t.Addr, set.sale)
			return 1
		}
		logf("baseline %s %s for %v", t.Name, t.Addr, set.baseline)
		ctx, cancel := context.WithTimeout(context.Background(), set.baseline)
		p := startProbes(ctx, t)
		<-ctx.Done()
		cancel()
		res.Baselines[t.Name] = p.wait()
		b := res.Baselines[t.Name]
		logf("baseline %s: probe %.2f%%, p99 %s", t.Name, b.SuccessPct, ms(b.P99))
	}
	// The attacks in order, each on every port before the next; the fd exhaustion last, since an
	// accept loop that dies for good would spoil every line after it.
	for _, a := range attacks {
		for _, t := range targets {
			if a.ports != nil && !slices.Contains(a.ports, t.Name) {
				logf("%s: not run on %s (%s only)", a.Name, t.Name, strings.Join(a.ports, ", "))
				continue
			}
			if a.setup != nil {
				if err := a.setup(t); err != nil {
					logf("%s on %s: setup: %v", a.Name, t.Name, err)
				}
			}
			r := runAttack(a, t, res.Baselines[t.Name])
			res.Runs = append(res.Runs, r)
			fmt.Println(r.line())
		}
	}
	res.Finished, res.LoadEnd = time.Now().UTC(), loadavg()
	res.Targets = targetsOf(res)
	for _, tg := range res.Targets {
		fmt.Println(tg.line())
	}
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(res, "", "  ")
		if err := writeFile(*jsonOut, append(b, '\n')); err != nil {
			fmt.Fprintln(os.Stderr, "hostile:", err)
			return 1
		}
	}
	if *mdOut != "" {
		doc, err := os.ReadFile(*mdOut)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			fmt.Fprintln(os.Stderr, "hostile:", err)
			return 1
		}
		out, err := replaceSection(string(doc), res.markdown(*jsonOut))
		if err == nil {
			err = writeFile(*mdOut, []byte(out))
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "hostile: %s: %v\n", *mdOut, err)
			return 1
		}
	}
	return 0
}

// loadavg is the machine's 1, 5 and 15 minute load averages: on a shared machine the probes'
// latency says as much about the neighbours as about the attack.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "hostile: [%s] %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// raiseNofile lifts this process's open-file limit: to 65536 when it may raise the hard limit
// (root), else to the hard limit. The fd exhaustion needs more descriptors than the port under
// attack has.
func raiseNofile() uint64 {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 1024
	}
	want := uint64(65536)
	if l.Max < want {
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: want, Max: want}); err == nil {
			return want
		}
		want = l.Max
	}
	_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: want, Max: l.Max})
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l)
	return l.Cur
}

// ---------------------------------------------------------------------------------------------
// addresses

// Probes and attackers each have source addresses of their own, so that no per-address limit
// on the way confuses the one with the other. 127.0.0.0/8 is all loopback on Linux.
var (
	probeNewSrc  = map[string]net.IP{"gateway": net.IPv4(127, 0, 0, 2), "nginx": net.IPv4(127, 0, 0, 4)}
	probeKeepSrc = map[string]net.IP{"gateway": net.IPv4(127, 0, 0, 3), "nginx": net.IPv4(127, 0, 0, 5)}
)

// attackerSrc is the i-th attacker address, in 127.10.0.0/16.
func attackerSrc(i int) net.IP {
	i %= 250 * 250
	return net.IPv4(127, 10, byte(i/250), byte(i%250+1))
}

func dial(src net.IP, addr string, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout, LocalAddr: &net.TCPAddr{IP: src}}
	if src.To4() == nil {
		// An address of a prefix routed to lo ("local" route) is this host's, but Linux lets a
		// socket bind to it only with IPV6_FREEBIND: no address of it is configured.
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IPV6, ipv6Freebind, 1)
			}); err != nil {
				return err
			}
			return serr
		}
	}
	return d.Dial("tcp", addr)
}

// ipv6Freebind is IPV6_FREEBIND of linux/in6.h (not in package syscall).
const ipv6Freebind = 78

// netSrc is the i-th address of the /64 p: interface ids spread over the 64 bits, as the
// addresses one host picks for itself (RFC 8981) are.
func netSrc(p netip.Prefix, i int) net.IP {
	b := p.Addr().As16()
	binary.BigEndian.PutUint64(b[8:], uint64(i+1)*0x9e3779b97f4a7c15)
	return net.IP(b[:])
}

func slowBodyNetText() string {
	if set.nginx6 == "" {
		return "none (IPv4 addresses)"
	}
	return set.slowBodyNet.String() + " to " + set.nginx6
}

// ---------------------------------------------------------------------------------------------
// the probes

// probe is one of the two probes' tallies.
type probe struct {
	mu   sync.Mutex
	ok   int
	fail int
	errs map[string]int
	lat  []time.Duration
}

func (p *probe) record(d time.Duration, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.fail++
		if p.errs == nil {
			p.errs = map[string]int{}
		}
		p.errs[errClass(err)]++
		return
	}
	p.ok++
	p.lat = append(p.lat, d)
}

type probes struct {
	newConn, keep probe
	wg            sync.WaitGroup
	start         time.Time
	tmu           sync.Mutex
	trace         []string // with --trace: one line per probe request
}

// traced notes one probe request for --trace: when it started (from the probes' start), the
// probe, how long it took and how it ended.
func (ps *probes) traced(kind string, start time.Time, d time.Duration, err error) {
	if set.trace == "" {
		return
	}
	how := "ok"
	if err != nil {
		how = errClass(err)
	}
	ps.tmu.Lock()
	ps.trace = append(ps.trace, fmt.Sprintf("%.3f %s %.3f %s", start.Sub(ps.start).Seconds(), kind, float64(d)/float64(time.Millisecond), how))
	ps.tmu.Unlock()
}

// writeTrace appends the probes' lines to the --trace file, each after label.
func (ps *probes) writeTrace(label string) {
	if set.trace == "" {
		return
	}
	f, err := os.OpenFile(set.trace, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		logf("trace: %v", err)
		return
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	for _, l := range ps.trace {
		fmt.Fprintf(w, "%s %s\n", label, l)
	}
	if err := w.Flush(); err != nil {
		logf("trace: %v", err)
	}
}

// probeSummary is what the probes saw over one period.
type probeSummary struct {
	Requests      int            `json:"requests"`
	Failed        int            `json:"failed"`
	SuccessPct    float64        `json:"success_pct"`
	NewConnPct    float64        `json:"new_conn_success_pct"`
	KeepAlivePct  float64        `json:"keepalive_success_pct"`
	P50           time.Duration  `json:"p50_ns"`
	P99           time.Duration  `json:"p99_ns"`
	NewConnP99    time.Duration  `json:"new_conn_p99_ns"`
	KeepAliveP99  time.Duration  `json:"keepalive_p99_ns"`
	FailureKinds  map[string]int `json:"failure_kinds,omitempty"`
	latenciesOKNs []time.Duration
}

func pct(ok, n int) float64 {
	if n == 0 {
		return 0
	}
	return 100 * float64(ok) / float64(n)
}

func quantile(l []time.Duration, q float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), l...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(q*float64(len(s))+0.5) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(s) {
		i = len(s) - 1
	}
	return s[i]
}

func (ps *probes) wait() probeSummary {
	ps.wg.Wait()
	n, k := &ps.newConn, &ps.keep
	all := append(append([]time.Duration(nil), n.lat...), k.lat...)
	s := probeSummary{
		Requests: n.ok + n.fail + k.ok + k.fail, Failed: n.fail + k.fail,
		NewConnPct: pct(n.ok, n.ok+n.fail), KeepAlivePct: pct(k.ok, k.ok+k.fail),
		P50: quantile(all, 0.50), P99: quantile(all, 0.99),
		NewConnP99: quantile(n.lat, 0.99), KeepAliveP99: quantile(k.lat, 0.99),
	}
	s.SuccessPct = pct(s.Requests-s.Failed, s.Requests)
	for _, p := range []*probe{n, k} {
		for e, c := range p.errs {
			if s.FailureKinds == nil {
				s.FailureKinds = map[string]int{}
			}
			s.FailureKinds[e] += c
		}
	}
	return s
}

const probeEvery = 50 * time.Millisecond

// startProbes runs both probes against t until ctx ends.
func startProbes(ctx context.Context, t target) *probes {
	ps := &probes{start: time.Now()}
	req := []byte("GET /v1/sales/" + set.sale + " HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: hostile-probe\r\n\r\n")
	closeReq := []byte("GET /v1/sales/" + set.sale + " HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: hostile-probe\r\nConnection: close\r\n\r\n")
	// New connection per request: each tick its own goroutine, so that one stuck request does
	// not hide the next ticks (a request that fails counts once; at most probeTimeout/probeEvery
	// are in flight).
	ps.wg.Add(1)
	go func() {
		defer ps.wg.Done()
		tick := time.NewTicker(probeEvery)
		defer tick.Stop()
		var inflight sync.WaitGroup
		defer inflight.Wait()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			inflight.Add(1)
			go func() {
				defer inflight.Done()
				start := time.Now()
				err := getOnce(probeNewSrc[t.Name], probeAddr(t), closeReq, set.probeTimeout)
				ps.newConn.record(time.Since(start), err)
				ps.traced("new", start, time.Since(start), err)
			}()
		}
	}()
	// Kept-alive connection: one request at a time on one connection; a failed one drops the
	// connection and the next tick dials again.
	ps.wg.Add(1)
	go func() {
		defer ps.wg.Done()
		tick := time.NewTicker(probeEvery)
		defer tick.Stop()
		var c net.Conn
		var br *bufio.Reader
		defer func() {
			if c != nil {
				c.Close()
			}
		}()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			start := time.Now()
			err := func() error {
				if c == nil {
					var err error
					if c, err = dial(probeKeepSrc[t.Name], probeAddr(t), set.probeTimeout); err != nil {
						c = nil
						return err
					}
					br = bufio.NewReader(c)
				}
				_ = c.SetDeadline(start.Add(set.probeTimeout))
				if _, err := c.Write(req); err != nil {
					return err
				}
				return readOK(br)
			}()
			if err != nil && c != nil {
				c.Close()
				c = nil
			}
			ps.keep.record(time.Since(start), err)
			ps.traced("keep", start, time.Since(start), err)
		}
	}()
	return ps
}

type statusError int

func (s statusError) Error() string { return "status " + strconv.Itoa(int(s)) }

// readOK reads one response and wants a 200.
func readOK(br *bufio.Reader) error {
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if err != nil {
		return err
	}
	if res.StatusCode != 200 {
		return statusError(res.StatusCode)
	}
	return nil
}

// getOnce sends req on a new connection from src and wants a 200 within timeout.
func getOnce(src net.IP, addr string, req []byte, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	c, err := dial(src, addr, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(deadline)
	if _, err := c.Write(req); err != nil {
		return err
	}
	return readOK(bufio.NewReader(c))
}

func serves(t target, timeout time.Duration) bool {
	req := []byte("GET /v1/sales/" + set.sale + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
	return getOnce(probeNewSrc[t.Name], t.Addr, req, timeout) == nil
}

// errClass names a failure briefly, for the failure counts.
func errClass(err error) string {
	var se statusError
	var ne net.Error
	switch {
	case errors.As(err, &se):
		return se.Error()
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	case errors.Is(err, syscall.EPIPE):
		return "broken pipe"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "closed"
	case errors.Is(err, syscall.EMFILE):
		return "emfile (this tool)"
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return "no local port"
	}
	return "other"
}

// ---------------------------------------------------------------------------------------------
// running one attack

// attack is one way of being a hostile client. Its run lasts until ctx ends, then closes every
// connection it opened before it returns, and reports what it did and what it saw.
type attack struct {
	Name  string
	What  string
	run   func(ctx context.Context, t target) map[string]int64
	extra time.Duration // on top of --duration: time to set the attack up (opening connections)
	// setup, if set, readies the attack before its baseline (the junk commands buy the orders
	// they pay); ports, if set, are the only ports it runs on.
	setup func(t target) error
	ports []string
}

func allAttacks() []attack {
	return []attack{
		{"none", "no attack: the probes alone, the yardstick of how far the p99 ratio moves by itself on this machine", none, 0, nil, nil},
		{"slowloris", "connections sending a request's headers one line every 2 s, never ending them", slowloris, 0, nil, nil},
		{"silent", "connections that send no byte", silent, 0, nil, nil},
		{"slow_body", "purchases whose body arrives one byte at a time", slowBody, 0, nil, nil},
		{"pipelining", "50 GETs written at once on each connection, 10 times a second", pipelining, 0, nil, nil},
		{"churn", "new connection, one GET, close (RST), as fast as the rate allows", churn, 0, nil, nil},
		{"smuggling", "CL+TE, TE with a space before the colon, obs-folded TE, two TE, two CL: does the appended request run?", smuggling, 0, nil, nil},
		{"oversize", "Go net/http client POSTing a 64 KiB body: a 413 or a broken connection?", oversize, 0, nil, nil},
		{"junk_commands", "2,000 cancels/s of made-up order ids from 500 buyer accounts, beside 50 real payments/s: do the payments hold?", junkCommands, 0, junkSetup, []string{"gateway"}},
		{"fd_exhaustion", "idle keep-alive connections, as many as the file limits allow", fdExhaustion, 8 * time.Second, nil, nil},
	}
}

func attackNames() []string {
	var n []string
	for _, a := range allAttacks() {
		n = append(n, a.Name)
	}
	return n
}

func findAttack(name string) (attack, bool) {
	for _, a := range allAttacks() {
		if a.Name == name {
			return a, true
		}
	}
	return attack{}, false
}

// runResult is one attack on one port.
type runResult struct {
	Attack        string           `json:"attack"`
	Port          string           `json:"port"`
	Addr          string           `json:"addr"`
	Probe         probeSummary     `json:"probe"`
	Baseline      time.Duration    `json:"baseline_p99_ns"` // the probes' p99 just before the attack
	BaselinePct   float64          `json:"baseline_success_pct"`
	SuiteBaseline time.Duration    `json:"suite_baseline_p99_ns"` // the suite's first baseline, for comparison
	P99Ratio      float64          `json:"p99_ratio"`
	Recovered     bool             `json:"recovered"`
	Recovery      time.Duration    `json:"recovery_ns"` // from the attack's end to the first new connection served
	Seen          map[string]int64 `json:"attack_counts"`
	Took          time.Duration    `json:"took_ns"`
}

// How long to wait for a port to come back before calling it dead.
const recoveryGiveUp = 10 * time.Second

func runAttack(a attack, t target, base probeSummary) runResult {
	logf("%s on %s (%s) for %v", a.Name, t.Name, t.Addr, set.duration+a.extra)
	start := time.Now()
	// The baseline is taken right before each attack: on a shared machine the load of the
	// moment moves a p99 more than many attacks do. The suite's first baseline is kept beside it.
	// As long as the attack by default: a p99 over 3 s of probes (120 requests: the second
	// slowest) against a p99 over 12 s (480: the fifth slowest) compared two different
	// statistics, and the short one swung tenfold from run to run on a shared machine.
	preFor := set.preBaseline
	if preFor <= 0 {
		preFor = set.duration + a.extra
	}
	bctx, bcancel := context.WithTimeout(context.Background(), preFor)
	pre := startProbes(bctx, t)
	<-bctx.Done()
	bcancel()
	preSum := pre.wait()
	pre.writeTrace(a.Name + " " + t.Name + " before")
	ctx, cancel := context.WithTimeout(context.Background(), set.duration+a.extra)
	defer cancel()
	ps := startProbes(ctx, t)
	seen := a.run(ctx, t) // returns once its connections are closed
	cancel()
	stopped := time.Now()
	r := runResult{Attack: a.Name, Port: t.Name, Addr: t.Addr, Probe: ps.wait(), Baseline: preSum.P99,
		BaselinePct: preSum.SuccessPct, SuiteBaseline: base.P99, Seen: seen}
	ps.writeTrace(a.Name + " " + t.Name + " attack")
	if r.Baseline > 0 {
		r.P99Ratio = float64(r.Probe.P99) / float64(r.Baseline)
	}
	// Recovery: new connections until one is served, each given the goal's time.
	req := []byte("GET /v1/sales/" + set.sale + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
	for time.Since(stopped) < recoveryGiveUp {
		if getOnce(probeNewSrc[t.Name], t.Addr, req, set.recoveryWithin) == nil {
			r.Recovery = time.Since(stopped)
			r.Recovered = r.Recovery <= set.recoveryWithin
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r.Recovery == 0 {
		r.Recovery = -1
	}
	r.Took = time.Since(start)
	// Let the port settle (TIME_WAITs, nginx's lingering closes) before the next attack.
	time.Sleep(time.Second)
	return r
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64) + "ms"
}

func (r runResult) recoveryText() string {
	switch {
	case r.Recovery < 0:
		return fmt.Sprintf("NOT within %v", recoveryGiveUp)
	case r.Recovered:
		return "yes in " + ms(r.Recovery)
	default:
		return "late: " + ms(r.Recovery)
	}
}

func (r runResult) line() string {
	return fmt.Sprintf("hostile: %-13s %-7s %-15s probe %6.2f%% (new %6.2f%%, keep-alive %6.2f%%)  p99 %8s = %5.1fx baseline %s  recovered %s  %s",
		r.Attack, r.Port, r.Addr, r.Probe.SuccessPct, r.Probe.NewConnPct, r.Probe.KeepAlivePct,
		ms(r.Probe.P99), r.P99Ratio, ms(r.Baseline), r.recoveryText(), counts(r.Seen))
}

func counts(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteByte('[')
	for i, k := range keys {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s=%d", k, m[k])
	}
	b.WriteByte(']')
	return b.String()
}

// ---------------------------------------------------------------------------------------------
// counters shared by the attacks

type tally struct {
	mu sync.Mutex
	m  map[string]int64
}

func newTally() *tally { return &tally{m: map[string]int64{}} }

func (t *tally) add(k string, n int64) {
	t.mu.Lock()
	t.m[k] += n
	t.mu.Unlock()
}

func (t *tally) max(k string, v int64) {
	t.mu.Lock()
	if v > t.m[k] {
		t.m[k] = v
	}
	t.mu.Unlock()
}

func (t *tally) snapshot() map[string]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]int64, len(t.m))
	for k, v := range t.m {
		out[k] = v
	}
	return out
}

// statusOf is the status code at the start of what a server sent before closing ("" if none).
func statusOf(b []byte) string {
	if len(b) >= 12 && bytes.HasPrefix(b, []byte("HTTP/1.")) {
		return string(b[9:12])
	}
	return ""
}

// holder keeps n connections open as an attacker would: each one writes its opening, then every
// `every` its next bytes, and when the server closes it, notes how (the status it sent, if any)
// and connects again after a pause. ctx ending closes them all.
func holder(ctx context.Context, t target, n, addrs int, opening []byte, every time.Duration, next func(i int) []byte, tl *tally) {
	holderFrom(ctx, t.Addr, n, func(i int) net.IP { return attackerSrc(i % addrs) }, opening, every, next, tl)
}

// holderFrom is holder with the i-th connection from src(i) to addr.
func holderFrom(ctx context.Context, addr string, n int, src func(int) net.IP, opening []byte, every time.Duration, next func(i int) []byte, tl *tally) {
	var open atomic.Int64
	var wg sync.WaitGroup
	// Dialled at a bounded pace, so that the attack is connections held, not a connect flood.
	pace := time.NewTicker(time.Second / 2000)
	defer pace.Stop()
	for i := 0; i < n; i++ {
		select {
		case <-ctx.Done():
		case <-pace.C:
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			src := src(i)
			buf := make([]byte, 512)
			for ctx.Err() == nil {
				c, err := dial(src, addr, 2*time.Second)
				if err != nil {
					tl.add("dial_failed", 1)
					sleepCtx(ctx, 200*time.Millisecond)
					continue
				}
				tl.max("held_max", open.Add(1))
				stop := context.AfterFunc(ctx, func() { c.Close() })
				closedBy := ""
				if len(opening) > 0 {
					if _, err := c.Write(opening); err != nil {
						closedBy = "write_error"
					}
				}
				for k := 1; closedBy == "" && ctx.Err() == nil; k++ {
					_ = c.SetReadDeadline(time.Now().Add(every))
					m, err := c.Read(buf)
					if err == nil || m > 0 {
						if s := statusOf(buf[:m]); s != "" {
							closedBy = "answered_" + s
						} else {
							closedBy = "answered"
						}
						break
					}
					var ne net.Error
					if errors.As(err, &ne) && ne.Timeout() {
						if next != nil {
							if _, err := c.Write(next(k)); err != nil {
								closedBy = "write_error"
							}
						}
						continue
					}
					if ctx.Err() == nil {
						closedBy = "closed_" + errClass(err)
					}
				}
				stop()
				c.Close()
				open.Add(-1)
				if closedBy != "" && ctx.Err() == nil {
					tl.add("cut_"+closedBy, 1)
					// The attacker comes back, but not at once: holding connections is the
					// attack here, a connect flood is churn's.
					sleepCtx(ctx, time.Second)
				}
			}
		}(i)
	}
	<-ctx.Done()
	wg.Wait()
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// ---------------------------------------------------------------------------------------------
// the attacks

// none attacks nothing: its line is the p99 ratio of two periods with no attack, measured the
// same way as every attack's. On a shared machine it shows how much of a ratio is the
// neighbours' load rather than the attack.
func none(ctx context.Context, _ target) map[string]int64 {
	<-ctx.Done()
	return map[string]int64{}
}

func slowloris(ctx context.Context, t target) map[string]int64 {
	tl := newTally()
	opening := []byte("GET /v1/sales/" + set.sale + " HTTP/1.1\r\nHost: 127.0.0.1\r\n")
	holder(ctx, t, set.slowloris, set.slowloris, opening, 2*time.Second,
		func(k int) []byte { return []byte("X-Slow-" + strconv.Itoa(k) + ": x\r\n") }, tl)
	return tl.snapshot()
}

func silent(ctx context.Context, t target) map[string]int64 {
	tl := newTally()
	holder(ctx, t, set.silent, set.silent, nil, time.Second, nil, tl)
	return tl.snapshot()
}

func slowBody(ctx context.Context, t target) map[string]int64 {
	tl := newTally()
	opening := []byte("POST /v1/sales/" + set.sale + "/orders HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
		"Authorization: Bearer hostile\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
	next := func(int) []byte { return []byte(" ") }
	if t.Name == "nginx" && set.nginx6 != "" {
		// One host with a /64 of its own: every slow body from another address of it.
		holderFrom(ctx, set.nginx6, set.slowBodies, func(i int) net.IP { return netSrc(set.slowBodyNet, i) },
			opening, set.slowBodyEvery, next, tl)
		return tl.snapshot()
	}
	holder(ctx, t, set.slowBodies, set.slowBodyAddrs, opening, set.slowBodyEvery, next, tl)
	return tl.snapshot()
}

func pipelining(ctx context.Context, t target) map[string]int64 {
	tl := newTally()
	const batch = 50
	one := "GET /v1/sales/" + set.sale + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
	req := []byte(strings.Repeat(one, batch))
	var wg sync.WaitGroup
	for i := 0; i < set.pipeConns; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			var c net.Conn
			var br *bufio.Reader
			defer func() {
				if c != nil {
					c.Close()
				}
			}()
			for ctx.Err() == nil {
				if c == nil {
					var err error
					if c, err = dial(attackerSrc(i), t.Addr, 2*time.Second); err != nil {
						c = nil
						tl.add("dial_failed", 1)
						sleepCtx(ctx, 100*time.Millisecond)
						continue
					}
					br = bufio.NewReader(c)
				}
				_ = c.SetDeadline(time.Now().Add(3 * time.Second))
				tl.add("sent", batch)
				if _, err := c.Write(req); err != nil {
					tl.add("conn_broken", 1)
					c.Close()
					c = nil
					continue
				}
				for k := 0; k < batch; k++ {
					res, err := http.ReadResponse(br, nil)
					if err != nil {
						tl.add("conn_broken", 1)
						c.Close()
						c = nil
						break
					}
					_, _ = io.Copy(io.Discard, res.Body)
					res.Body.Close()
					tl.add("answered_"+strconv.Itoa(res.StatusCode), 1)
					if res.Close {
						tl.add("closed_by_server", 1)
						c.Close()
						c = nil
						break
					}
				}
				select {
				case <-ctx.Done():
				case <-tick.C:
				}
			}
		}(i)
	}
	wg.Wait()
	return tl.snapshot()
}

func churn(ctx context.Context, t target) map[string]int64 {
	tl := newTally()
	req := []byte("GET /v1/sales/" + set.sale + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	const workers = 32
	per := time.Duration(workers) * time.Second / time.Duration(set.churnRate)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			tick := time.NewTicker(per)
			defer tick.Stop()
			for k := 0; ctx.Err() == nil; k++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				c, err := dial(attackerSrc(w*1000+k%1000), t.Addr, time.Second)
				if err != nil {
					tl.add("dial_failed", 1)
					continue
				}
				_ = c.SetDeadline(time.Now().Add(2 * time.Second))
				tl.add("conns", 1)
				if _, err := c.Write(req); err == nil {
					if res, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
						_, _ = io.Copy(io.Discard, res.Body)
						res.Body.Close()
						tl.add("answered_"+strconv.Itoa(res.StatusCode), 1)
					} else {
						tl.add("failed_"+errClass(err), 1)
					}
				}
				// RST on close: no TIME_WAIT left on either side, the attacker's cheapest churn.
				if tc, ok := c.(*net.TCPConn); ok {
					_ = tc.SetLinger(0)
				}
				c.Close()
			}
		}(w)
	}
	wg.Wait()
	return tl.snapshot()
}

// smuggle is one request framed two ways. framedAs is what a correct server must do: refuse it.
// The bytes after the first request's body (by one of the framings) are a second, complete
// request; if it runs, the connection carries two answers.
type smuggle struct {
	name string
	raw  func(second string) string
}

func smuggles() []smuggle {
	post := "POST /v1/sales/" + set.sale + "/orders HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
	// chunked framing ends at "0\r\n\r\n"; Content-Length framing swallows the second request
	// as body. A server that frames by chunked runs the second request.
	clte := func(te string) func(string) string {
		return func(second string) string {
			body := "0\r\n\r\n" + second
			return post + te + "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
		}
	}
	return []smuggle{
		{"cl_te", clte("Transfer-Encoding: chunked\r\n")},
		{"te_space_colon", clte("Transfer-Encoding : chunked\r\n")},
		{"te_obs_fold", clte("Transfer-Encoding: identity\r\n chunked\r\n")},
		{"two_te", clte("Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n")},
		{"te_tab", clte("Transfer-Encoding:\tchunked\r\n")},
		// Two Content-Lengths: by the first the body is "{}", by the second "{}" + the second request.
		{"two_cl", func(second string) string {
			return post + "Content-Length: 2\r\nContent-Length: " + strconv.Itoa(2+len(second)) + "\r\n\r\n{}" + second
		}},
	}
}

func smuggling(ctx context.Context, t target) map[string]int64 {
	tl := newTally()
	// The second request ends the connection, so that a server that ran it answers at once.
	second := "GET /v1/sales/" + set.sale + "?smuggled=1 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
	kinds := smuggles()
	const workers = 8
	per := time.Duration(workers) * time.Second / time.Duration(set.smuggleRate)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			tick := time.NewTicker(per)
			defer tick.Stop()
			for k := 0; ctx.Err() == nil; k++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				s := kinds[(w+k)%len(kinds)]
				c, err := dial(attackerSrc(w*100+k%100), t.Addr, time.Second)
				if err != nil {
					tl.add("dial_failed", 1)
					sleepCtx(ctx, 100*time.Millisecond)
					continue
				}
				_ = c.SetDeadline(time.Now().Add(1500 * time.Millisecond))
				_, _ = io.WriteString(c, s.raw(second))
				br := bufio.NewReader(c)
				answers, first := 0, ""
				for {
					res, err := http.ReadResponse(br, nil)
					if err != nil {
						break
					}
					_, _ = io.Copy(io.Discard, res.Body)
					res.Body.Close()
					if answers == 0 {
						first = strconv.Itoa(res.StatusCode)
					}
					answers++
				}
				c.Close()
				tl.add("tries", 1)
				tl.add(s.name+"_first_"+first, 1)
				if answers >= 2 {
					tl.add("SMUGGLED_"+s.name, 1)
					tl.add("smuggled", 1)
				}
			}
		}(w)
	}
	wg.Wait()
	m := tl.snapshot()
	if _, ok := m["smuggled"]; !ok {
		m["smuggled"] = 0
	}
	return m
}

func oversize(ctx context.Context, t target) map[string]int64 {
	tl := newTally()
	body := bytes.Repeat([]byte("x"), 64<<10)
	var next atomic.Int64
	var wg sync.WaitGroup
	// The tries are spread over the attack's length, so that the probes see it the whole time.
	const workers = 8
	per := time.Duration(workers) * set.duration * 9 / 10 / time.Duration(set.oversizeTries)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			tick := time.NewTicker(per)
			defer tick.Stop()
			d := &net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: attackerSrc(w)}}
			client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
			defer client.CloseIdleConnections()
			for ctx.Err() == nil && next.Add(1) <= int64(set.oversizeTries) {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+t.Addr+"/v1/sales/"+set.sale+"/orders", bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer hostile")
				res, err := client.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						tl.add("failed_"+errClass(err), 1)
					}
					continue
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				tl.add("answered_"+strconv.Itoa(res.StatusCode), 1)
			}
		}(w)
	}
	wg.Wait()
	return tl.snapshot()
}

// fdExhaustion opens set.fdConns idle keep-alive connections, split over child processes of
// this program (each holds at most what its own open-file limit allows, so that together they
// can hold more than the port under attack may open), and holds them until ctx ends.
func fdExhaustion(ctx context.Context, t target) map[string]int64 {
	tl := newTally()
	per := int(ownLimit) - 1000
	if per < 1000 {
		per = 1000
	}
	children := (set.fdConns + per - 1) / per
	self, err := os.Executable()
	if err != nil {
		tl.add("no_executable", 1)
		return tl.snapshot()
	}
	type child struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		out   bytes.Buffer
	}
	var cs []*child
	for k := 0; k < children; k++ {
		n := set.fdConns / children
		if k == children-1 {
			n = set.fdConns - n*(children-1)
		}
		args := []string{self, "--sale", set.sale, "--hold-idle", t.Addr,
			"--hold-n", strconv.Itoa(n), "--hold-offset", strconv.Itoa(k * per), "--open-rate", strconv.Itoa(set.fdOpenRate / children)}
		c := &child{cmd: exec.Command(args[0], args[1:]...)}
		c.cmd.Stdout, c.cmd.Stderr = &c.out, os.Stderr
		if c.stdin, err = c.cmd.StdinPipe(); err == nil {
			err = c.cmd.Start()
		}
		if err != nil {
			tl.add("child_failed", 1)
			continue
		}
		cs = append(cs, c)
	}
	<-ctx.Done()
	for _, c := range cs {
		c.stdin.Close() // the child's signal to report and close its connections
	}
	for _, c := range cs {
		if err := c.cmd.Wait(); err != nil {
			tl.add("child_failed", 1)
			continue
		}
		var m map[string]int64
		if err := json.Unmarshal(c.out.Bytes(), &m); err != nil {
			tl.add("child_failed", 1)
			continue
		}
		for k, v := range m {
			tl.add(k, v) // held_max adds up too: the children hold theirs at the same time
		}
	}
	return tl.snapshot()
}

// preBaselineText says how long each attack's own baseline is, for the results.
func preBaselineText() string {
	if set.preBaseline <= 0 {
		return "as long as the attack"
	}
	return set.preBaseline.String()
}

// ownLimit is this process's open-file limit, once raised.
var ownLimit uint64 = 1024

// holdChild is the child's side of fdExhaustion: hold n connections to addr until stdin ends,
// then print the counts as JSON.
func holdChild(addr string, n, offset int) int {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	tl := newTally()
	holdIdle(ctx, target{Addr: addr}, n, offset, tl)
	b, _ := json.Marshal(tl.snapshot())
	fmt.Println(string(b))
	return 0
}

func holdIdle(ctx context.Context, t target, n, offset int, tl *tally) {
	req := []byte("GET /v1/sales/" + set.sale + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	var mu sync.Mutex
	var conns []net.Conn
	var next atomic.Int64
	var wg sync.WaitGroup
	var held atomic.Int64
	began := time.Now()
	const dialers = 64
	for w := 0; w < dialers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var pace <-chan time.Time
			if set.fdOpenRate > 0 {
				tick := time.NewTicker(dialers * time.Second / time.Duration(set.fdOpenRate))
				defer tick.Stop()
				pace = tick.C
			}
			for ctx.Err() == nil {
				if pace != nil {
					select {
					case <-ctx.Done():
						return
					case <-pace:
					}
				}
				i := int(next.Add(1))
				if i > n {
					return
				}
				c, err := dial(attackerSrc((offset+i)%5000), t.Addr, 2*time.Second)
				if err != nil {
					tl.add("dial_failed_"+errClass(err), 1)
					sleepCtx(ctx, 10*time.Millisecond)
					continue
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
				// One request, then idle: a kept-alive connection the server must carry.
				_ = c.SetDeadline(time.Now().Add(3 * time.Second))
				if _, err := c.Write(req); err != nil {
					tl.add("request_failed", 1)
					continue
				}
				res, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					tl.add("request_failed_"+errClass(err), 1)
					continue
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				tl.add("answered_"+strconv.Itoa(res.StatusCode), 1)
				tl.max("held_max", held.Add(1))
			}
		}()
	}
	wg.Wait()
	logf("fd exhaustion child: %d connections opened in %v", held.Load(), time.Since(began).Round(time.Millisecond))
	<-ctx.Done()
	mu.Lock()
	defer mu.Unlock()
	tl.add("opened", int64(len(conns)))
	// How many of them the server had already closed by the end (a read that does not time out).
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
		var b [1]byte
		if _, err := c.Read(b[:]); err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				tl.add("closed_by_server", 1)
			}
		}
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		c.Close()
	}
}
