package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/valyala/fasthttp"
)

// bench --rate --json against a stand-in gateway that accepts every purchase:
// the JSON holds the run's settings and figures, and no audit with --no-check.
func TestBenchJSON(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(fasthttp.StatusAccepted)
		ctx.SetBodyString(`{"code":"accepted","order_id":"` + strconv.FormatInt(1000+n.Add(1), 10) + `","status":"pending"}`)
	}}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Shutdown()

	t.Setenv("FLASHGATE_JWT_SECRET", "s3cret-of-32-bytes-or-more-0123456")
	path := filepath.Join(t.TempDir(), "bench.json")
	var out, errOut bytes.Buffer
	err = run([]string{"bench", "--config", "", "--target", "http://" + ln.Addr().String(), "--sale", "s1",
		"--users", "5", "--concurrency", "4", "--requests", "40", "--rate", "400", "--no-check", "--json", path}, &out, &errOut)
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, errOut.String())
	}
	if !strings.Contains(out.String(), "asked 400 req/s") {
		t.Errorf("report:\n%s", out.String())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Label       string `json:"label"`
		Sale        string `json:"sale"`
		Concurrency int    `json:"concurrency"`
		Load        struct {
			Requests    int64            `json:"requests"`
			ByStatus    map[string]int64 `json:"by_status"`
			Accepted    int              `json:"accepted"`
			Rate        float64          `json:"rate"`
			LatencyFrom string           `json:"latency_from"`
			Accepted99  struct {
				Count int64 `json:"count"`
				P99   int64 `json:"p99"`
			} `json:"accepted_latency_us"`
		} `json:"load"`
		Audit *json.RawMessage `json:"audit"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	l := got.Load
	if got.Label != "bench" || got.Sale != "s1" || got.Concurrency != 4 || l.Requests != 40 || l.ByStatus["202"] != 40 ||
		l.Accepted != 40 || l.Rate != 400 || l.LatencyFrom != "due" || l.Accepted99.Count != 40 || l.Accepted99.P99 <= 0 || got.Audit != nil {
		t.Fatalf("bench JSON:\n%s", b)
	}

	errOut.Reset()
	var code exitCode
	if err := run([]string{"bench", "--config", "", "--sale", "s1", "--rate", "-1"}, &out, &errOut); !errors.As(err, &code) ||
		!strings.Contains(errOut.String(), "--rate") {
		t.Fatalf("negative rate: %v %q", err, errOut.String())
	}
}
