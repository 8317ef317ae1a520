package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestReplaceSection: the make hostile section is appended once, then rewritten in place; the
// rest of the file (the make bench section included) stays byte for byte; a lone marker is an
// error.
func TestReplaceSection(t *testing.T) {
	doc := "# Benchmarks\n\n<!-- make bench: begin -->\nbench\n<!-- make bench: end -->\n\n## Notes\nhand-written\n"
	first, err := replaceSection(doc, "one\n")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(first, doc) || !strings.HasSuffix(first, beginMarker+"\none\n"+endMarker+"\n") {
		t.Fatalf("appended section:\n%s", first)
	}
	second, err := replaceSection(first, "two\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Replace(first, "\none\n", "\ntwo\n", 1); second != want {
		t.Fatalf("rewritten section:\n%s\nwant:\n%s", second, want)
	}
	if _, err := replaceSection(doc+beginMarker+"\n", "x"); err == nil {
		t.Fatal("a lone begin marker accepted")
	}
	if _, err := replaceSection(doc+endMarker+"\n"+beginMarker+"\n", "x"); err == nil {
		t.Fatal("markers out of order accepted")
	}
}

// TestTargets: a target is missed by one bad run, and only runs on nginx count for the probe
// targets.
func TestTargets(t *testing.T) {
	set.recoveryWithin = time.Second
	ok := func(attack, port string) runResult {
		return runResult{Attack: attack, Port: port, Probe: probeSummary{SuccessPct: 100}, P99Ratio: 1.5, Recovered: true, Recovery: 5 * time.Millisecond}
	}
	met := func(gs []goal) map[string]bool {
		m := map[string]bool{}
		for _, g := range gs {
			m[g.Name] = g.Met
		}
		return m
	}
	// The control (no attack) is the ratio's noise, shown beside the target, not one of the
	// attacks it is judged on.
	control := ok("none", "nginx")
	control.P99Ratio = 6
	r := &results{Runs: []runResult{control, ok("silent", "nginx"), ok("silent", "gateway")}}
	for _, g := range targetsOf(r) {
		if !g.Met {
			t.Errorf("%s missed with every attack fine: %s", g.Name, g.line())
		}
		if g.Name == "nginx_probe_p99" && !strings.Contains(g.Figure, "with no attack 6.0x") {
			t.Errorf("the control's ratio is not shown: %s", g.line())
		}
	}
	// The gateway's own probes may suffer: that is no nginx target. Its death is.
	bad := ok("fd_exhaustion", "gateway")
	bad.Probe.SuccessPct, bad.P99Ratio, bad.Recovered, bad.Recovery = 20, 30, false, -1
	slow := ok("slow_body", "nginx")
	slow.P99Ratio = 5.5
	r.Runs = append(r.Runs, bad, slow)
	got := met(targetsOf(r))
	want := map[string]bool{"nginx_probe_success": true, "nginx_probe_p99": false, "recovery_nginx": true, "recovery_gateway": false}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s met=%v, want %v", name, got[name], w)
		}
	}
	lost := ok("churn", "nginx")
	lost.Probe.SuccessPct = 99.8
	r.Runs = append(r.Runs, lost)
	if met(targetsOf(r))["nginx_probe_success"] {
		t.Error("99.8% through nginx met the 99.9% target")
	}
}

// fakeServer answers every request it can frame on a connection with a 200, framing bodies by
// Content-Length only (Transfer-Encoding ignored) or by chunked when present, as told; the
// "strict" one answers 400 to anything with a Transfer-Encoding and closes.
func fakeServer(t *testing.T, mode string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				br := bufio.NewReader(c)
				for {
					var te, cl, closeIt bool
					n := 0
					line, err := br.ReadString('\n')
					if err != nil || line == "\r\n" {
						return
					}
					for {
						h, err := br.ReadString('\n')
						if err != nil {
							return
						}
						if h == "\r\n" {
							break
						}
						lh := strings.ToLower(h)
						switch {
						case strings.Contains(lh, "transfer-encoding"):
							te = true
						case strings.HasPrefix(lh, "content-length:"):
							cl = true
							n = atoi(strings.TrimSpace(h[len("content-length:"):]))
						case strings.HasPrefix(lh, "connection: close"):
							closeIt = true
						}
					}
					if te && mode == "strict" {
						_, _ = io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
						return
					}
					if te && mode == "chunked" {
						// Reads up to the last chunk only: "0\r\n\r\n".
						for {
							l, err := br.ReadString('\n')
							if err != nil {
								return
							}
							if l == "0\r\n" {
								_, _ = br.ReadString('\n')
								break
							}
						}
					} else if cl {
						_, _ = io.CopyN(io.Discard, br, int64(n))
					}
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
					if closeIt {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func atoi(s string) int {
	n := 0
	for _, r := range s {
		if r < '0' || r > '9' {
			break
		}
		n = n*10 + int(r-'0')
	}
	return n
}

// TestSmugglingCounted: the smuggling attack counts a second request that ran, and only then.
func TestSmugglingCounted(t *testing.T) {
	set.sale, set.smuggleRate = "s1", 100
	for _, c := range []struct {
		mode      string
		smuggling bool
	}{{"chunked", true}, {"strict", false}, {"cl", false}} {
		t.Run(c.mode, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
			defer cancel()
			m := smuggling(ctx, target{Name: "test", Addr: fakeServer(t, c.mode)})
			if m["tries"] == 0 {
				t.Fatalf("no tries: %v", m)
			}
			if (m["smuggled"] > 0) != c.smuggling {
				t.Fatalf("a %s server: %v", c.mode, m)
			}
		})
	}
}

// TestProbes: the probes count successes against a server that answers, and failures against
// one that is not there.
func TestProbes(t *testing.T) {
	set.sale, set.probeTimeout = "s1", time.Second
	up := target{Name: "gateway", Addr: fakeServer(t, "cl")}
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	s := startProbes(ctx, up).wait()
	if s.Requests < 10 || s.Failed != 0 || s.SuccessPct != 100 || s.P99 <= 0 {
		t.Fatalf("probes against a server that answers: %+v", s)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := target{Name: "nginx", Addr: ln.Addr().String()}
	ln.Close()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel2()
	s = startProbes(ctx2, down).wait()
	if s.Requests < 10 || s.Failed != s.Requests || s.FailureKinds["refused"] == 0 {
		t.Fatalf("probes against a closed port: %+v", s)
	}
}

// TestJunkGoals: the junk attack's targets are met only when every payment was paid and their
// p99 is under the goal; a run with no payment meets neither.
func TestJunkGoals(t *testing.T) {
	run := func(seen map[string]int64) map[string]bool {
		m := map[string]bool{}
		for _, g := range junkGoals(&results{Runs: []runResult{{Attack: "junk_commands", Port: "gateway", Seen: seen}}}) {
			m[g.Name] = g.Met
		}
		return m
	}
	good := run(map[string]int64{"pay_sent": 600, "pay_ok": 600, "pay_p99_ms": 31, "pay_p50_ms": 4, "pay_max_ms": 51})
	if !good["junk_pay_success_gateway"] || !good["junk_pay_p99_gateway"] {
		t.Fatalf("all paid in 31 ms: %v", good)
	}
	bad := run(map[string]int64{"pay_sent": 445, "pay_ok": 19, "pay_failed_timeout": 298, "pay_429": 128, "pay_p99_ms": 6499})
	if bad["junk_pay_success_gateway"] || bad["junk_pay_p99_gateway"] {
		t.Fatalf("19 of 445 paid, p99 6499 ms: %v", bad)
	}
	slow := run(map[string]int64{"pay_sent": 10, "pay_ok": 10, "pay_p99_ms": 500})
	if !slow["junk_pay_success_gateway"] || slow["junk_pay_p99_gateway"] {
		t.Fatalf("all paid, p99 at the goal: %v", slow)
	}
	if none := run(map[string]int64{"setup_failed": 1}); none["junk_pay_success_gateway"] || none["junk_pay_p99_gateway"] {
		t.Fatalf("no payment: %v", none)
	}
}
