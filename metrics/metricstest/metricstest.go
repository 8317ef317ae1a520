// Package metricstest reads a Prometheus scrape in tests: it fetches the text
// exposition a metrics handler serves and answers the value of a series.
package metricstest

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families is one scrape, by metric name.
type Families map[string]*dto.MetricFamily

// Handler scrapes h as Prometheus would (GET /metrics, text format).
func Handler(t testing.TB, h http.Handler) Families {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body.Bytes())
	}
	return parse(t, rec.Body)
}

// URL scrapes a running server's metrics endpoint.
func URL(t testing.TB, url string) Families {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, res.StatusCode, body)
	}
	return parse(t, bytes.NewReader(body))
}

func parse(t testing.TB, r io.Reader) Families {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		t.Fatalf("parse scrape: %v", err)
	}
	return fams
}

// matching calls f for every series of name whose labels include the pairs
// (name, value, name, value, …) and reports whether there was one.
func (fs Families) matching(name string, pairs []string, f func(*dto.Metric)) bool {
	fam, ok := fs[name]
	if !ok {
		return false
	}
	found := false
	for _, m := range fam.GetMetric() {
		if hasLabels(m, pairs) {
			f(m)
			found = true
		}
	}
	return found
}

func hasLabels(m *dto.Metric, pairs []string) bool {
	for i := 0; i+1 < len(pairs); i += 2 {
		ok := false
		for _, l := range m.GetLabel() {
			if l.GetName() == pairs[i] && l.GetValue() == pairs[i+1] {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// Value is the sum of the counter, gauge or untyped series of name whose labels
// include the pairs (name, value, …); ok is false when there is none.
func (fs Families) Value(name string, pairs ...string) (v float64, ok bool) {
	ok = fs.matching(name, pairs, func(m *dto.Metric) {
		switch {
		case m.Counter != nil:
			v += m.GetCounter().GetValue()
		case m.Gauge != nil:
			v += m.GetGauge().GetValue()
		case m.Untyped != nil:
			v += m.GetUntyped().GetValue()
		}
	})
	return v, ok
}

// Histogram is the summed sample count and sum of the histogram series of name
// whose labels include the pairs; ok is false when there is none.
func (fs Families) Histogram(name string, pairs ...string) (count uint64, sum float64, ok bool) {
	ok = fs.matching(name, pairs, func(m *dto.Metric) {
		count += m.GetHistogram().GetSampleCount()
		sum += m.GetHistogram().GetSampleSum()
	})
	return count, sum, ok
}

// Series is the number of series of name.
func (fs Families) Series(name string) int {
	if fam, ok := fs[name]; ok {
		return len(fam.GetMetric())
	}
	return 0
}
