package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/flashgate/flashgate/bench/internal/cli"
)

// startSaleServer serves GET /v1/sales/{id} the way the gateway does, with
// fasthttp, and closes connections idle for longer than idle (0: never).
func startSaleServer(t *testing.T, idle time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{IdleTimeout: idle, Handler: func(ctx *fasthttp.RequestCtx) {
		if !bytes.HasPrefix(ctx.Path(), []byte("/v1/sales/")) || !ctx.IsGet() {
			ctx.SetStatusCode(fasthttp.StatusNotFound)
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"s","state":"active","remaining":7}`)
	}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = srv.Shutdown()
		<-done
	})
	return "http://" + ln.Addr().String()
}

// Measured on this very process (it is the server too): every connection is
// opened, answered, held, counted in the descriptors, and let go.
func TestBenchConns(t *testing.T) {
	target := startSaleServer(t, 0)
	const n = 300
	res, err := runConns(connsOptions{target: target, sale: "s", pid: os.Getpid(), conns: n, dialers: 20, settle: 100 * time.Millisecond}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if res.Opened != n || res.StillOpen != n || res.Failed != 0 || res.ByStatus[200] != n || len(res.ByStatus) != 1 {
		t.Fatalf("opened %d, still open %d, failed %d (%s), statuses %v", res.Opened, res.StillOpen, res.Failed, res.FirstErr, res.ByStatus)
	}
	// Both ends of each connection are descriptors of this process.
	if res.Before.FDs < 0 || res.After.FDs-res.Before.FDs < 2*n {
		t.Fatalf("fds %d → %d for %d connections", res.Before.FDs, res.After.FDs, n)
	}
	if res.Closed == nil || res.Closed.FDs > res.After.FDs-2*n+10 {
		t.Fatalf("after closing: %+v (holding: %+v)", res.Closed, res.After)
	}
	if res.Before.RSSKB <= 0 || res.After.HWMKB < res.After.RSSKB || res.RSSMB <= 0 {
		t.Fatalf("memory %+v → %+v", res.Before, res.After)
	}
	if res.Limits.ClientNoFile < n || res.Limits.GatewayNoFile == "" || !strings.Contains(res.Limits.PortRange, "-") {
		t.Fatalf("limits %+v", res.Limits)
	}
	var out bytes.Buffer
	res.write(&out)
	for _, want := range []string{"300 of 300 open and idle", "200: 300", "a connection", "ephemeral ports"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

// Connections the server closes while they idle are not counted as held, and
// the command fails.
func TestBenchConnsClosedByServer(t *testing.T) {
	target := startSaleServer(t, 100*time.Millisecond)
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	jsonPath := filepath.Join(dir, "conns.json")
	var out, errOut bytes.Buffer
	err := run([]string{"--config", "", "--pid-file", pidFile, "--target", target, "--conns", "50",
		"--settle", "1s", "--json", jsonPath}, &out, &errOut)
	var code cli.ExitCode
	if !errors.As(err, &code) || code != 1 {
		t.Fatalf("bench-conns: %v, want exit status 1\n%s%s", err, out.String(), errOut.String())
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var res connsResult
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if res.Opened != 50 || res.StillOpen != 0 || res.PID != os.Getpid() {
		t.Fatalf("result %s", b)
	}
}

func TestBenchConnsFlags(t *testing.T) {
	var out, errOut bytes.Buffer
	var code cli.ExitCode
	for _, args := range [][]string{
		{},
		{"--pid", "1", "--pid-file", "x"},
		{"--pid", "1", "--conns", "0"},
		{"--pid", "-3"},
	} {
		errOut.Reset()
		err := run(append([]string{"--config", ""}, args...), &out, &errOut)
		if !errors.As(err, &code) || code != 2 {
			t.Errorf("%q: %v %q", args, err, errOut.String())
		}
	}
	// A gateway that closes after its answer cannot be held.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 1024)
				_, _ = c.Read(buf)
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}")
			}()
		}
	}()
	res, err := runConns(connsOptions{target: "http://" + ln.Addr().String(), sale: "s", pid: os.Getpid(), conns: 5, dialers: 2}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if res.Opened != 0 || res.Failed != 5 || !strings.Contains(res.FirstErr, "closes the connection") {
		t.Fatalf("opened %d failed %d: %s", res.Opened, res.Failed, res.FirstErr)
	}
}

func TestProcParsing(t *testing.T) {
	status := []byte("Name:\tflashgate\nVmHWM:\t  183200 kB\nVmRSS:\t  179812 kB\nThreads:\t9\n")
	if got := statusKB(status, "VmRSS:"); got != 179812 {
		t.Fatalf("VmRSS %d", got)
	}
	if got := statusKB(status, "VmHWM:"); got != 183200 {
		t.Fatalf("VmHWM %d", got)
	}
	if got := statusKB(status, "VmSwap:"); got != -1 {
		t.Fatalf("VmSwap %d", got)
	}
	if got := procLimit(os.Getpid(), "Max open files"); got == "" {
		t.Fatal("no open files limit")
	}
	if _, err := readProcMem(1 << 30); err == nil {
		t.Fatal("read a process that cannot exist")
	}
}

// TestTrustedTarget: the per-address warning is for targets whose clients
// the gateway caps, not for a loopback target when loopback is trusted.
func TestTrustedTarget(t *testing.T) {
	lo := []string{"127.0.0.1/32", "::1/128"}
	for _, c := range []struct {
		proxies []string
		target  string
		want    bool
	}{
		{lo, "http://127.0.0.1:8080", true},
		{lo, "http://[::1]:8080", true},
		{nil, "http://127.0.0.1:8080", false},
		{[]string{"10.0.0.0/8"}, "http://10.1.2.3:8080", false}, // not loopback: the source is another address
		{lo, "http://localhost:8080", false},
	} {
		if got := trustedTarget(c.proxies, c.target); got != c.want {
			t.Errorf("trustedTarget(%v, %s) = %v, want %v", c.proxies, c.target, got, c.want)
		}
	}
}
