package backend

// The live view's time series (live.go, docs/observability.md): per sale, the
// last historyLen seconds at one point a second of what the backend already
// hears and reads — requests, admissions and refusals by code per second and
// the 202s' p99 from the gateways' stats messages, sold, remaining and the
// backlog (the sale's messages still in the orders stream) from its reads of
// the books.
//
// Each sale's series live in a ring of historyLen slots, slot = second mod
// historyLen; a slot holds the second it was last written for, so a slot of an
// older second reads as empty and nothing needs advancing. At most
// maxHistorySales sales have a ring (a new one waits for one to fall silent)
// and each counts at most maxHistoryCodes refusal codes, so
// the memory is bounded whatever the gateways send: under 80 KiB a sale, 5 MiB
// in all. Rings nobody wrote for historyLen seconds are dropped whenever a
// stats message or a read of the books arrives.

import (
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/metrics"
)

const (
	// historyLen is the seconds of series kept per sale: five minutes.
	historyLen = 300
	// maxHistorySales bounds the sales with series.
	maxHistorySales = 64
	// maxHistoryCodes bounds the refusal codes counted per sale; the others
	// are counted as "other".
	maxHistoryCodes = 16
	// p99 is the quantile of the 202s' latency the series show.
	p99 = 0.99
)

var nan = math.NaN()

// ring is one value a second over historyLen seconds; NaN: none that second.
type ring [historyLen]float64

func newRing() *ring {
	r := new(ring)
	for i := range r {
		r[i] = nan
	}
	return r
}

// add adds v to slot i, an empty slot counting as 0.
func (r *ring) add(i int, v float64) {
	if math.IsNaN(r[i]) {
		r[i] = 0
	}
	r[i] += v
}

// saleHistory is one sale's series.
type saleHistory struct {
	last       int64                                     // the newest second written
	sec        [historyLen]int64                         // the second each slot holds
	requests   ring                                      // answers a second, summed over the gateways
	admissions ring                                      // 202s a second
	refused    map[string]*ring                          // refusals a second by code
	lat        [historyLen][metrics.LatencyCounts]uint32 // the 202s of the second by latency bucket
	sold       ring
	remaining  ring
	backlog    ring
}

func newSaleHistory() *saleHistory {
	h := &saleHistory{refused: map[string]*ring{}}
	for _, r := range []*ring{&h.requests, &h.admissions, &h.sold, &h.remaining, &h.backlog} {
		for i := range r {
			r[i] = nan
		}
	}
	return h
}

// slot is sec's slot, emptied if it held another second; false when sec is
// too old for the ring (it would overwrite a newer second).
func (h *saleHistory) slot(sec int64) (int, bool) {
	if sec <= h.last-historyLen || sec <= 0 {
		return 0, false
	}
	i := int(sec % historyLen)
	if h.sec[i] != sec {
		h.sec[i] = sec
		for _, r := range []*ring{&h.requests, &h.admissions, &h.sold, &h.remaining, &h.backlog} {
			r[i] = nan
		}
		for _, r := range h.refused {
			r[i] = nan
		}
		h.lat[i] = [metrics.LatencyCounts]uint32{}
	}
	h.last = max(h.last, sec)
	return i, true
}

// refusedRing is code's ring, made if the sale has fewer than maxHistoryCodes;
// past that, "other"'s.
func (h *saleHistory) refusedRing(code string) *ring {
	if r := h.refused[code]; r != nil {
		return r
	}
	if len(h.refused) >= maxHistoryCodes-1 && code != codeOtherLive {
		code = codeOtherLive
		if r := h.refused[code]; r != nil {
			return r
		}
	}
	r := newRing()
	h.refused[code] = r
	return r
}

// codeOtherLive is where the refusals of codes past maxHistoryCodes go.
const codeOtherLive = "other"

// historyFor is sale's series, made if it has none. At maxHistorySales, the
// one written longest ago makes way if nobody wrote it for gatewayForget (its
// sale is no longer reported); otherwise nil: the sales already followed keep
// their series rather than all losing them in turn. l.mu is held.
func (l *live) historyFor(sale string, sec int64) *saleHistory {
	if h := l.hist[sale]; h != nil {
		return h
	}
	if len(l.hist) >= maxHistorySales {
		oldest, at := "", int64(math.MaxInt64)
		for id, h := range l.hist {
			if h.last < at {
				oldest, at = id, h.last
			}
		}
		if at > sec-int64(gatewayForget/time.Second) {
			return nil
		}
		delete(l.hist, oldest)
	}
	h := newSaleHistory()
	l.hist[sale] = h
	return h
}

// pruneHistory drops the series nobody wrote for historyLen seconds. l.mu is
// held.
func (l *live) pruneHistory(now time.Time) {
	for id, h := range l.hist {
		if h.last <= now.Unix()-historyLen {
			delete(l.hist, id)
		}
	}
}

// recordTraffic writes into the series what one gateway answered between its
// reports prev and cur, heard at now: each sale's answers a second, spread
// over the seconds since the previous report (one, unless a report was lost),
// and its 202s by latency in cur's second. The seconds are the gateway's
// (its reports are a second apart on its clock, whatever their delay on the
// way); a gateway whose clock is more than gatewayForget ahead of this
// backend's is left out, lest its seconds push the others' out of the rings
// (the clock-skew alert fires long before). l.mu is held.
func (l *live) recordTraffic(prev, cur *bus.GatewayStats, now time.Time) {
	dt := cur.At.Sub(prev.At).Seconds()
	if prev.At.IsZero() || dt <= 0 || dt > gatewayForget.Seconds() || cur.At.After(now.Add(gatewayForget)) {
		return // no previous report, one too old to make a rate of, or a clock far ahead
	}
	from, to := prev.At.Unix(), cur.At.Unix()
	if to-from > historyLen {
		from = to - historyLen
	}
	for sale, codes := range cur.Sales {
		h := l.historyFor(sale, to)
		if h == nil {
			continue
		}
		var req, adm float64
		refused := map[string]float64{}
		for code, n := range codes {
			before := prev.Sales[sale][code]
			if before > n {
				before = 0 // the gateway's counter began again (the sale was reloaded)
			}
			rate := float64(n-before) / dt
			req += rate
			switch code {
			case string(flashgate.CodeAccepted):
				adm += rate
			case string(metrics.CodeOK):
			default:
				refused[code] += rate
			}
		}
		for sec := from + 1; sec <= to; sec++ {
			i, ok := h.slot(sec)
			if !ok {
				continue
			}
			h.requests.add(i, req)
			h.admissions.add(i, adm)
			for code, r := range refused {
				h.refusedRing(code).add(i, r)
			}
		}
		if lat, ok := cur.AcceptedLatency[sale]; ok && len(lat) == metrics.LatencyCounts {
			i, ok := h.slot(to)
			if !ok {
				continue
			}
			before := prev.AcceptedLatency[sale]
			if len(before) != len(lat) {
				before = make([]uint64, len(lat))
			}
			for b := range lat {
				if lat[b] < before[b] {
					before = make([]uint64, len(lat)) // begun again
					break
				}
			}
			for b := range lat {
				d := lat[b] - before[b]
				h.lat[i][b] = uint32(min(uint64(h.lat[i][b])+d, math.MaxUint32))
			}
		}
	}
}

// recordBooks writes sale's books as read at at into its series.
func (l *live) recordBooks(sale string, at time.Time, st metrics.SaleState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pruneHistory(at)
	h := l.historyFor(sale, at.Unix())
	if h == nil {
		return
	}
	i, ok := h.slot(at.Unix())
	if !ok {
		return
	}
	h.sold[i], h.remaining[i], h.backlog[i] = float64(st.Sold), float64(st.Remaining), float64(st.Pending)
}

// Series are one sale's last seconds in the live view, one entry a second
// from Start (a Unix time in seconds) to the second of the view, null where
// nothing is known: the traffic before anything was heard or of a second some
// live gateway has not reported yet, the books of a second this backend did
// not read them (the leader reads them every second; another backend only
// while a live view is open on it).
type Series struct {
	Start            int64              `json:"start"`
	RequestsPerSec   numbers            `json:"requests_per_sec"`
	AdmissionsPerSec numbers            `json:"admissions_per_sec"`
	RefusalsPerSec   map[string]numbers `json:"refusals_per_sec"`
	AcceptedP99Ms    numbers            `json:"accepted_p99_ms"`
	Sold             numbers            `json:"sold"`
	Remaining        numbers            `json:"remaining"`
	Backlog          numbers            `json:"backlog"`
}

// numbers are a series' values, NaN for null, written with at most three
// decimals.
type numbers []float64

func (n numbers) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 2+len(n)*6)
	b = append(b, '[')
	for i, v := range n {
		if i > 0 {
			b = append(b, ',')
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			b = append(b, "null"...)
			continue
		}
		b = strconv.AppendFloat(b, math.Round(v*1000)/1000, 'f', -1, 64)
	}
	return append(b, ']'), nil
}

// series is sale's series up to now's second, from its first second with
// anything known (at most historyLen seconds ago); nil if it has none. The
// traffic of the seconds after complete, the last every live gateway has
// reported, is left null: a sum of some gateways only would read as a dip.
// l.mu is held.
func (l *live) series(sale string, now time.Time, complete int64) *Series {
	h := l.hist[sale]
	if h == nil {
		return nil
	}
	end := now.Unix()
	start := end - historyLen + 1
	for ; start <= end; start++ {
		if i := int(start % historyLen); h.sec[i] == start {
			break
		}
	}
	if start > end {
		return nil
	}
	n := int(end - start + 1)
	s := &Series{Start: start, RefusalsPerSec: map[string]numbers{}}
	for _, p := range []*numbers{&s.RequestsPerSec, &s.AdmissionsPerSec, &s.AcceptedP99Ms, &s.Sold, &s.Remaining, &s.Backlog} {
		*p = make(numbers, n)
	}
	codes := make([]string, 0, len(h.refused))
	for c := range h.refused {
		codes = append(codes, c)
		s.RefusalsPerSec[c] = make(numbers, n)
	}
	slices.Sort(codes)
	counts := make([]uint64, metrics.LatencyCounts)
	for k := range n {
		sec := start + int64(k)
		i := int(sec % historyLen)
		if h.sec[i] != sec {
			for _, p := range []numbers{s.RequestsPerSec, s.AdmissionsPerSec, s.AcceptedP99Ms, s.Sold, s.Remaining, s.Backlog} {
				p[k] = nan
			}
			for _, c := range codes {
				s.RefusalsPerSec[c][k] = nan
			}
			continue
		}
		s.Sold[k], s.Remaining[k], s.Backlog[k] = h.sold[i], h.remaining[i], h.backlog[i]
		heard := !math.IsNaN(h.requests[i]) && sec <= complete
		s.AcceptedP99Ms[k] = nan
		if !heard {
			s.RequestsPerSec[k], s.AdmissionsPerSec[k] = nan, nan
			for _, c := range codes {
				s.RefusalsPerSec[c][k] = nan
			}
			continue
		}
		s.RequestsPerSec[k], s.AdmissionsPerSec[k] = h.requests[i], h.admissions[i]
		for _, c := range codes {
			v := h.refused[c][i]
			if math.IsNaN(v) {
				v = 0 // heard from, and none of this code
			}
			s.RefusalsPerSec[c][k] = v
		}
		for b := range counts {
			counts[b] = uint64(h.lat[i][b])
		}
		if q, ok := metrics.LatencyQuantile(counts, p99); ok {
			s.AcceptedP99Ms[k] = q * 1000
		}
	}
	return s
}

// completeThrough is the newest second every live gateway has reported (now's
// when none is live). l.mu is held.
func (l *live) completeThrough(now time.Time) int64 {
	c := now.Unix()
	for _, g := range l.gws {
		if now.Sub(g.heard) <= gatewayForget {
			c = min(c, g.cur.At.Unix())
		}
	}
	return c
}
