package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/flashgate/flashgate/bench/internal/cli"
	"github.com/flashgate/flashgate/loadgen"
)

// connsOptions is one bench-conns run.
type connsOptions struct {
	target   string
	sale     string
	pid      int
	conns    int
	dialers  int
	settle   time.Duration
	hold     time.Duration
	jsonPath string
}

func run(args []string, stdout, stderr io.Writer) error {
	c := cli.NewCommand(programName, "--pid PID | --pid-file FILE [flags]", stderr)
	o := connsOptions{}
	pidFile := c.String("pid-file", "", "read the gateway's pid from this `file` (e.g. var/run/gateway.pid)")
	c.IntVar(&o.pid, "pid", 0, "the gateway's process id, whose resident memory is read from /proc")
	c.StringVar(&o.target, "target", cli.DefaultTarget, "gateway `URL` (the gateway itself: nginx in front would hold the connections instead)")
	c.StringVar(&o.sale, "sale", "bench-conns", "sale `id` each connection asks for once (GET /v1/sales/ID; an unknown one answers 404, which is an answer too)")
	c.IntVar(&o.conns, "conns", 10000, "keep-alive connections to open and hold")
	c.IntVar(&o.dialers, "dial-concurrency", 100, "connections being opened at once")
	c.DurationVar(&o.settle, "settle", 2*time.Second, "wait this long with every connection idle before reading the gateway's memory")
	c.DurationVar(&o.hold, "hold", 0, "keep holding the connections this long after the reading (to look at the gateway meanwhile)")
	c.StringVar(&o.jsonPath, "json", "", "also write the result as JSON to this `file`")
	pos, err := c.ParseAll(args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 0:
		return c.UsageError("unexpected arguments %q", pos)
	case o.pid != 0 && *pidFile != "":
		return c.UsageError("give --pid or --pid-file, not both")
	case o.pid == 0 && *pidFile == "":
		return c.UsageError("--pid or --pid-file is required")
	case o.conns < 1 || o.dialers < 1:
		return c.UsageError("--conns and --dial-concurrency must be at least 1")
	case o.settle < 0 || o.hold < 0:
		return c.UsageError("--settle and --hold must not be negative")
	}
	if *pidFile != "" {
		b, err := os.ReadFile(*pidFile)
		if err != nil {
			return fmt.Errorf("bench-conns: %w", err)
		}
		if o.pid, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
			return fmt.Errorf("bench-conns: %s: not a pid: %w", *pidFile, err)
		}
	}
	if o.pid < 1 {
		return c.UsageError("--pid must be a process id")
	}
	cfg, err := c.Config()
	if err != nil {
		return err
	}
	// The gateway's own settings that bound the run, as far as this command's
	// configuration tells (the gateway may have been started with another).
	if n := cfg.Gateway.MaxConnsPerIP; n > 0 && n < o.conns && !trustedTarget(cfg.Gateway.TrustedProxies, o.target) {
		fmt.Fprintf(stderr, "conns: warning: gateway.max_conns_per_ip is %d: a gateway so configured refuses connections from this one address past it (run it with FLASHGATE_GATEWAY_MAX_CONNS_PER_IP=0)\n", n)
	}
	if n := cfg.Gateway.Concurrency; n > 0 && n < o.conns {
		fmt.Fprintf(stderr, "conns: warning: gateway.concurrency is %d: a gateway so configured serves no more connections at once\n", n)
	}
	if d := cfg.Gateway.IdleTimeout; d > 0 && d < o.settle+o.hold+30*time.Second {
		fmt.Fprintf(stderr, "conns: warning: gateway.idle_timeout is %s: a gateway so configured closes idle connections before the reading\n", d)
	}
	res, err := runConns(o, stderr)
	if err != nil {
		return err
	}
	res.write(stdout)
	if err := loadgen.WriteJSON(o.jsonPath, res); err != nil {
		return err
	}
	if res.Opened != o.conns || res.StillOpen != o.conns {
		return cli.ExitCode(1)
	}
	return nil
}

// connsResult is what bench-conns measured; memory in KiB as /proc gives it.
type connsResult struct {
	Target string `json:"target"`
	PID    int    `json:"pid"`
	Conns  int    `json:"conns"`
	// Opened counts connections that got their answer and were held; of them,
	// StillOpen were still open (not closed by the gateway) at the reading.
	Opened    int            `json:"opened"`
	StillOpen int            `json:"still_open"`
	Failed    int            `json:"failed"`
	FirstErr  string         `json:"first_error,omitempty"`
	ByStatus  map[int]int    `json:"by_status"`
	OpenS     float64        `json:"open_s"`
	Before    procMem        `json:"before"`
	After     procMem        `json:"after"`
	Closed    *procMem       `json:"after_close,omitempty"`
	PerConnKB float64        `json:"rss_per_conn_kb"`
	RSSMB     float64        `json:"rss_mb"` // After.RSS in MiB
	Limits    connsLimitInfo `json:"limits"`
}

// procMem is a process's memory and open descriptors at one moment.
type procMem struct {
	RSSKB int64 `json:"rss_kb"`
	HWMKB int64 `json:"hwm_kb"` // peak RSS
	FDs   int   `json:"fds"`    // -1 if /proc/PID/fd is not readable
}

// connsLimitInfo is what bounds 10,000 connections from one client to one port.
type connsLimitInfo struct {
	ClientNoFile  uint64 `json:"client_nofile"`  // this process's soft RLIMIT_NOFILE, after raising it
	GatewayNoFile string `json:"gateway_nofile"` // the gateway's "Max open files" soft limit
	PortRange     string `json:"ephemeral_ports"`
}

func runConns(o connsOptions, stderr io.Writer) (*connsResult, error) {
	u, err := url.Parse(o.target)
	if err != nil {
		return nil, fmt.Errorf("bench-conns: target %q: %w", o.target, err)
	}
	if u.Scheme != "http" || u.Host == "" {
		return nil, fmt.Errorf("bench-conns: target %q: want http://host:port", o.target)
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	res := &connsResult{Target: o.target, PID: o.pid, Conns: o.conns, ByStatus: map[int]int{}}

	// Descriptors: ours (one per connection) and the gateway's.
	nofile, err := raiseNoFile(uint64(o.conns) + 256)
	if err != nil {
		return nil, err
	}
	res.Limits.ClientNoFile = nofile
	res.Limits.GatewayNoFile = procLimit(o.pid, "Max open files")
	if n, err := strconv.ParseUint(res.Limits.GatewayNoFile, 10, 64); err == nil && n < uint64(o.conns)+64 {
		fmt.Fprintf(stderr, "conns: warning: the gateway may open %d files: not enough for %d connections\n", n, o.conns)
	}
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		f := strings.Fields(string(b))
		res.Limits.PortRange = strings.Join(f, "-")
		if len(f) == 2 {
			lo, _ := strconv.Atoi(f[0])
			hi, _ := strconv.Atoi(f[1])
			if hi-lo+1 < o.conns {
				fmt.Fprintf(stderr, "conns: warning: %d ephemeral ports (%s) for %d connections to one address\n", hi-lo+1, res.Limits.PortRange, o.conns)
			}
		}
	}

	if res.Before, err = readProcMem(o.pid); err != nil {
		return nil, err
	}
	fmt.Fprintf(stderr, "conns: gateway pid %d: RSS %s before; opening %d connections to %s\n",
		o.pid, mib(res.Before.RSSKB), o.conns, addr)

	req := []byte("GET /v1/sales/" + url.PathEscape(o.sale) + " HTTP/1.1\r\nHost: " + u.Host +
		"\r\nUser-Agent: flashgate-bench-conns\r\n\r\n")
	conns := make([]net.Conn, o.conns)
	statuses := make([]int, o.conns)
	var next, failed atomic.Int64
	var firstErr atomic.Value
	start := time.Now()
	var wg sync.WaitGroup
	for range min(o.dialers, o.conns) {
		wg.Go(func() {
			br := bufio.NewReaderSize(nil, 4096)
			for {
				i := int(next.Add(1) - 1)
				if i >= o.conns {
					return
				}
				c, status, err := openConn(addr, req, br)
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				conns[i], statuses[i] = c, status
			}
		})
	}
	wg.Wait()
	res.OpenS = time.Since(start).Seconds()
	for i, c := range conns {
		if c != nil {
			res.Opened++
			res.ByStatus[statuses[i]]++
		}
	}
	res.Failed = int(failed.Load())
	if e, ok := firstErr.Load().(string); ok {
		res.FirstErr = e
	}
	defer closeAll(conns)
	fmt.Fprintf(stderr, "conns: %d open in %.2fs (%d failed); idle for %s\n", res.Opened, res.OpenS, res.Failed, o.settle)

	time.Sleep(o.settle)
	if res.After, err = readProcMem(o.pid); err != nil {
		return nil, err
	}
	res.StillOpen = stillOpen(conns)
	if res.Opened > 0 {
		res.PerConnKB = float64(res.After.RSSKB-res.Before.RSSKB) / float64(res.Opened)
	}
	res.RSSMB = float64(res.After.RSSKB) / 1024
	if o.hold > 0 {
		fmt.Fprintf(stderr, "conns: holding them for %s\n", o.hold)
		time.Sleep(o.hold)
	}

	closeAll(conns)
	time.Sleep(time.Second)
	if m, err := readProcMem(o.pid); err == nil {
		res.Closed = &m
	}
	return res, nil
}

// openConn dials addr, sends req and reads the whole answer: the connection is
// then idle on both sides, as a buyer's browser holds it between two clicks.
func openConn(addr string, req []byte, br *bufio.Reader) (net.Conn, int, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, 0, err
	}
	fail := func(err error) (net.Conn, int, error) {
		c.Close()
		return nil, 0, err
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(req); err != nil {
		return fail(err)
	}
	br.Reset(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return fail(err)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return fail(err)
	}
	if resp.Close {
		return fail(fmt.Errorf("the gateway closes the connection after its answer (%s)", resp.Status))
	}
	if br.Buffered() > 0 {
		return fail(errors.New("unexpected bytes after the answer"))
	}
	br.Reset(nil)
	_ = c.SetDeadline(time.Time{})
	return c, resp.StatusCode, nil
}

// stillOpen counts the connections the gateway has not closed: a read that
// times out finds an open, idle connection; one that ends finds it closed.
func stillOpen(conns []net.Conn) int {
	var open atomic.Int64
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			var b [1]byte
			for {
				i := int(next.Add(1) - 1)
				if i >= len(conns) {
					return
				}
				c := conns[i]
				if c == nil {
					continue
				}
				_ = c.SetReadDeadline(time.Now().Add(2 * time.Millisecond))
				_, err := c.Read(b[:])
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					open.Add(1)
				}
				_ = c.SetReadDeadline(time.Time{})
			}
		})
	}
	wg.Wait()
	return int(open.Load())
}

// closeAll closes the connections with a reset (SO_LINGER 0): no TIME_WAIT is
// left to hold 10,000 ephemeral ports for a minute after the run. It may run twice.
func closeAll(conns []net.Conn) {
	for i, c := range conns {
		if c == nil {
			continue
		}
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
		conns[i] = nil
	}
}

// raiseNoFile raises this process's soft limit of open files to need, as far as
// the hard limit allows (Go raises it to the hard limit at start on Linux
// already; this says so when even that is not enough), and returns it.
func raiseNoFile(need uint64) (uint64, error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, fmt.Errorf("bench-conns: getrlimit: %w", err)
	}
	if l.Cur >= need {
		return l.Cur, nil
	}
	if l.Max < need {
		return l.Cur, fmt.Errorf("bench-conns: this process may open %d files (hard limit %d), %d are needed: raise `ulimit -Hn` or open fewer --conns", l.Cur, l.Max, need)
	}
	l.Cur = l.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, fmt.Errorf("bench-conns: setrlimit: %w", err)
	}
	return l.Cur, nil
}

// readProcMem reads VmRSS and VmHWM from /proc/PID/status and counts /proc/PID/fd.
func readProcMem(pid int) (procMem, error) {
	m := procMem{FDs: -1}
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return m, fmt.Errorf("bench-conns: process %d: %w", pid, err)
	}
	m.RSSKB, m.HWMKB = statusKB(b, "VmRSS:"), statusKB(b, "VmHWM:")
	if m.RSSKB < 0 {
		return m, fmt.Errorf("bench-conns: process %d: no VmRSS in /proc/%d/status", pid, pid)
	}
	if fds, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd")); err == nil {
		m.FDs = len(fds)
	}
	return m, nil
}

// statusKB is the kB figure of a /proc/PID/status line ("VmRSS:  1234 kB"), or -1.
func statusKB(status []byte, key string) int64 {
	for line := range bytes.Lines(status) {
		if v, ok := bytes.CutPrefix(line, []byte(key)); ok {
			f := bytes.Fields(v)
			if len(f) == 2 && string(f[1]) == "kB" {
				if n, err := strconv.ParseInt(string(f[0]), 10, 64); err == nil {
					return n
				}
			}
			return -1
		}
	}
	return -1
}

// procLimit is the soft value of one row of /proc/PID/limits ("" if unreadable).
func procLimit(pid int, name string) string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "limits"))
	if err != nil {
		return ""
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, name); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				return f[0]
			}
		}
	}
	return ""
}

// mib renders a /proc figure in KiB as MiB.
func mib(n int64) string { return strconv.FormatFloat(float64(n)/1024, 'f', 1, 64) + " MiB" }

func (r *connsResult) write(w io.Writer) {
	statuses := make([]int, 0, len(r.ByStatus))
	for s := range r.ByStatus {
		statuses = append(statuses, s)
	}
	sort.Ints(statuses)
	parts := make([]string, len(statuses))
	for i, s := range statuses {
		parts[i] = fmt.Sprintf("%d: %d", s, r.ByStatus[s])
	}
	fmt.Fprintf(w, "%-10s %d of %d open and idle at the reading (%d failed), opened in %.2fs; answers %s\n",
		"conns", r.StillOpen, r.Conns, r.Failed, r.OpenS, strings.Join(parts, "  "))
	if r.FirstErr != "" {
		fmt.Fprintf(w, "%-10s first failure: %s\n", "", r.FirstErr)
	}
	fmt.Fprintf(w, "%-10s pid %d: RSS %s before, %s holding them (+%.1f KiB a connection), peak %s; fds %d → %d\n",
		"gateway", r.PID, mib(r.Before.RSSKB), mib(r.After.RSSKB), r.PerConnKB, mib(r.After.HWMKB), r.Before.FDs, r.After.FDs)
	if r.Closed != nil {
		fmt.Fprintf(w, "%-10s RSS %s a second after closing them, fds %d\n", "", mib(r.Closed.RSSKB), r.Closed.FDs)
	}
	fmt.Fprintf(w, "%-10s open files: ours %d, the gateway's %s; ephemeral ports %s\n",
		"limits", r.Limits.ClientNoFile, r.Limits.GatewayNoFile, r.Limits.PortRange)
}

// trustedTarget tells whether connections to target come from a trusted
// proxy's address, which max_conns_per_ip does not cap: so for a loopback
// target when loopback is trusted (the source address of a loopback
// connection is the target's own).
func trustedTarget(proxies []string, target string) bool {
	u, err := url.Parse(target)
	if err != nil {
		return false
	}
	a, err := netip.ParseAddr(u.Hostname())
	if err != nil || !a.IsLoopback() {
		return false
	}
	for _, p := range proxies {
		if pr, err := netip.ParsePrefix(p); err == nil && pr.Contains(a.Unmap()) {
			return true
		}
	}
	return false
}
