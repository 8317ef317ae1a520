package backend

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/metrics"
)

// latencyAt is counts by latency bucket with n answers in the bucket whose
// bound is b (seconds).
func latencyAt(t *testing.T, b float64, n uint64) []uint64 {
	t.Helper()
	out := make([]uint64, metrics.LatencyCounts)
	for i, v := range metrics.LatencyBounds() {
		if v == b {
			out[i] = n
			return out
		}
	}
	t.Fatalf("no latency bound %v", b)
	return nil
}

func addCounts(a, b []uint64) []uint64 {
	out := make([]uint64, len(a))
	for i := range a {
		out[i] = a[i] + b[i]
	}
	return out
}

// TestLiveSeries: two gateways' reports become one point a second per sale
// — their answers summed, refusals by code, the 202s' p99 from both
// gateways' latency counts — a lost report's rate covers the seconds it
// spanned, a second one gateway has not reported yet is left null, and the
// books land beside the traffic.
func TestLiveSeries(t *testing.T) {
	l := newLive(nil, nil, nil)
	base := time.Now().Truncate(time.Second).Add(-20 * time.Second)
	const sale = "s1"
	// Gateway a at .2 of each second, b at .7; a's report of second 5 is lost.
	type totals struct {
		acc, lim uint64
		lat      []uint64
	}
	a := totals{lat: make([]uint64, metrics.LatencyCounts)}
	b := totals{lat: make([]uint64, metrics.LatencyCounts)}
	for sec := 0; sec <= 10; sec++ {
		// Each second a answers 10 202s (1-2.5 ms) and 4 limit_reached; b 5
		// 202s, the one of second 8 slow (0.25-0.5 s), and 1 sold_out.
		a.acc, a.lim, a.lat = a.acc+10, a.lim+4, addCounts(a.lat, latencyAt(t, 2.5e-3, 10))
		if sec != 5 {
			l.onStats(bus.GatewayStats{Gateway: "a", At: base.Add(time.Duration(sec)*time.Second + 200*time.Millisecond),
				Sales:           map[string]map[string]uint64{sale: {"accepted": a.acc, "limit_reached": a.lim}},
				AcceptedLatency: map[string][]uint64{sale: a.lat}})
		}
		b.acc, b.lim = b.acc+5, b.lim+1
		if sec == 8 {
			b.lat = addCounts(b.lat, addCounts(latencyAt(t, 2.5e-3, 4), latencyAt(t, 0.5, 1)))
		} else {
			b.lat = addCounts(b.lat, latencyAt(t, 2.5e-3, 5))
		}
		if sec < 10 { // b has not reported second 10 yet
			l.onStats(bus.GatewayStats{Gateway: "b", At: base.Add(time.Duration(sec)*time.Second + 700*time.Millisecond),
				Sales:           map[string]map[string]uint64{sale: {"accepted": b.acc, "sold_out": b.lim}},
				AcceptedLatency: map[string][]uint64{sale: b.lat}})
		}
	}
	l.recordBooks(sale, base.Add(9*time.Second), metrics.SaleState{Sold: 70, Remaining: 30, Pending: 3})

	now := base.Add(10*time.Second + 800*time.Millisecond)
	l.mu.Lock()
	s := l.series(sale, now, l.completeThrough(now))
	l.mu.Unlock()
	if s == nil {
		t.Fatal("no series")
	}
	// The first report of each gateway makes no rate: the series begin at
	// second 1 and end at now's (10).
	if s.Start != base.Unix()+1 || len(s.RequestsPerSec) != 10 {
		t.Fatalf("series start %d (want %d), %d points (want 10)", s.Start, base.Unix()+1, len(s.RequestsPerSec))
	}
	at := func(sec int) int { return sec - 1 }
	for sec := 1; sec <= 9; sec++ {
		k := at(sec)
		if got := s.RequestsPerSec[k]; got != 20 {
			t.Errorf("second %d: requests/s %v, want 20", sec, got)
		}
		if got := s.AdmissionsPerSec[k]; got != 15 {
			t.Errorf("second %d: admissions/s %v, want 15", sec, got)
		}
		if got := s.RefusalsPerSec["limit_reached"][k]; got != 4 {
			t.Errorf("second %d: limit_reached/s %v, want 4", sec, got)
		}
		if got := s.RefusalsPerSec["sold_out"][k]; got != 1 {
			t.Errorf("second %d: sold_out/s %v, want 1", sec, got)
		}
	}
	// Second 10: b has not reported it; its traffic is not known yet.
	if v := s.RequestsPerSec[at(10)]; !math.IsNaN(v) {
		t.Errorf("second 10 (b's report missing): requests/s %v, want null", v)
	}
	// p99: 15 202s of 1-2.5 ms a second: 2.5 ms less a bit; second 8 has one
	// of 0.25-0.5 s among 15, past the 99th percentile: in that bucket.
	// Second 5's a report was lost: its 20 202s are in second 6 with b's 5.
	if v := s.AcceptedP99Ms[at(3)]; v < 1 || v > 2.5 {
		t.Errorf("second 3: p99 %v ms, want within (1, 2.5]", v)
	}
	if v := s.AcceptedP99Ms[at(8)]; v <= 250 || v > 500 {
		t.Errorf("second 8: p99 %v ms, want within (250, 500]", v)
	}
	if v := s.AcceptedP99Ms[at(5)]; v < 1 || v > 2.5 {
		t.Errorf("second 5 (a's report lost, b's there): p99 %v ms", v)
	}
	if v := s.Sold[at(9)]; v != 70 || s.Remaining[at(9)] != 30 || s.Backlog[at(9)] != 3 {
		t.Errorf("second 9: books sold %v remaining %v backlog %v", v, s.Remaining[at(9)], s.Backlog[at(9)])
	}
	if v := s.Sold[at(8)]; !math.IsNaN(v) {
		t.Errorf("second 8: sold %v, but the books were not read then", v)
	}

	raw, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), `"requests_per_sec":[20,20,20,20,20,20,20,20,20,null]`) {
		t.Fatalf("series JSON: %s", raw)
	}
}

// TestLiveSeriesBounded: however many sales and codes the gateways report,
// the series keep maxHistorySales sales, those already followed keeping
// theirs, and maxHistoryCodes codes a sale; a newcomer gets the place of a
// sale silent for gatewayForget; those nobody wrote for historyLen seconds go
// on the next receipt; a report older than a ring holds does not overwrite a
// newer second.
func TestLiveSeriesBounded(t *testing.T) {
	l := newLive(nil, nil, nil)
	now := time.Now()
	sales := map[string]map[string]uint64{}
	for i := range 3 * maxHistorySales {
		sales[fmt.Sprintf("sale%d", i)] = map[string]uint64{"accepted": 0}
	}
	codes := map[string]uint64{}
	for c := range 3 * maxHistoryCodes {
		codes[fmt.Sprintf("code%d", c)] = 0
	}
	for sec := range 3 {
		at := now.Add(time.Duration(sec-3) * time.Second)
		for c := range codes {
			codes[c]++
		}
		l.onStats(bus.GatewayStats{Gateway: "codes", At: at, Sales: map[string]map[string]uint64{"codes": maps.Clone(codes)}})
		// A copy: each report decodes into maps of its own.
		many := map[string]map[string]uint64{}
		for id, cs := range sales {
			cs["accepted"]++
			many[id] = maps.Clone(cs)
		}
		l.onStats(bus.GatewayStats{Gateway: "many", At: at, Sales: many})
	}
	l.mu.Lock()
	if n := len(l.hist); n != maxHistorySales {
		t.Errorf("%d sales with series, want %d", n, maxHistorySales)
	}
	if h := l.hist["codes"]; h == nil {
		t.Error("a sale followed from the start lost its series to the newcomers")
	} else {
		if n := len(h.refused); n != maxHistoryCodes {
			t.Errorf("%d refusal codes, want %d", n, maxHistoryCodes)
		}
		var sum float64
		for _, r := range h.refused {
			for _, v := range r {
				if !math.IsNaN(v) {
					sum += v
				}
			}
		}
		if sum != 2*3*maxHistoryCodes { // two rates of 1 a second per code, none lost
			t.Errorf("%v refusals counted, want %d", sum, 2*3*maxHistoryCodes)
		}
	}

	// Once a followed sale is silent for gatewayForget, a newcomer takes its place.
	if h := l.historyFor("newcomer", now.Unix()); h != nil {
		t.Error("a newcomer got a series while every followed sale is reported")
	}
	if h := l.hist["codes"]; h != nil {
		h.last = now.Unix() - int64(gatewayForget/time.Second) - 1
	}
	if h := l.historyFor("newcomer", now.Unix()); h == nil || l.hist["codes"] != nil || len(l.hist) != maxHistorySales {
		t.Errorf("newcomer's series %p, codes' %p, %d sales: want the newcomer's in codes' place", h, l.hist["codes"], len(l.hist))
	}
	l.mu.Unlock()

	// A report historyLen+ seconds later: the old series go, the new sale's stays.
	later := now.Add(2 * historyLen * time.Second)
	l.mu.Lock()
	l.pruneHistory(later)
	if n := len(l.hist); n != 0 {
		t.Errorf("%d series left historyLen seconds after their last write", n)
	}
	h := l.historyFor("x", later.Unix())
	i, ok := h.slot(later.Unix())
	if !ok {
		t.Fatal("no slot for now")
	}
	h.sold[i] = 7
	if _, ok := h.slot(later.Unix() - historyLen); ok {
		t.Error("a second historyLen old got a slot: it would overwrite now's")
	}
	if h.sold[i] != 7 {
		t.Error("now's slot was overwritten")
	}
	l.mu.Unlock()

	// A gateway whose clock runs an hour ahead is left out of the series.
	l = newLive(nil, nil, nil)
	ahead := time.Now().Add(time.Hour)
	for sec := range 3 {
		l.onStats(bus.GatewayStats{Gateway: "ahead", At: ahead.Add(time.Duration(sec) * time.Second),
			Sales: map[string]map[string]uint64{"s": {"accepted": uint64(sec)}}})
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.hist) != 0 {
		t.Errorf("a gateway an hour ahead wrote series: %d", len(l.hist))
	}
}
