package loadgen

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashgate/flashgate/audit"
	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/config"
)

func TestSummaryLine(t *testing.T) {
	good := audit.Report{
		SaleID: "demo-1", Total: 1000, Sold: 1000, LiveUnits: 1000, Orders: 1000,
		ByStatus: map[string]int64{"confirmed": 1000}, LedgerHolds: true, DistinctBuyers: 1000,
	}
	for _, tc := range []struct {
		name  string
		label string
		r     func(audit.Report) audit.Report
		bad   int64
		want  string
	}{
		{"all well", "demo", func(r audit.Report) audit.Report { return r }, 0,
			"demo: sold 1000/1000, orders 1000, oversold 0, over-limit users 0, lost 0"},
		{"partly sold", "bench", func(r audit.Report) audit.Report { r.LiveUnits, r.Orders = 640, 700; return r }, 0,
			"bench: sold 640/1000, orders 700, oversold 0, over-limit users 0, lost 0"},
		{"broken", "demo", func(r audit.Report) audit.Report {
			r.LiveUnits, r.Oversold, r.OverLimitUsers, r.Lost, r.Duplicated = 1003, 3, 2, 1, 4
			r.LedgerHolds, r.LedgerDiff = false, -3
			return r
		}, 0, "demo: sold 1003/1000, orders 1000, oversold 3, over-limit users 2, lost 1, duplicated 4, ledger off by -3"},
		{"unreadable 202s", "demo", func(r audit.Report) audit.Report { return r }, 2,
			"demo: sold 1000/1000, orders 1000, oversold 0, over-limit users 0, lost 0, 202s without order id 2"},
	} {
		if got := SummaryLine(tc.label, tc.r(good), tc.bad); got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, tc.want)
		}
	}
}

func TestWriteAudit(t *testing.T) {
	var b bytes.Buffer
	WriteAudit(&b, audit.Report{
		SaleID: "s", Total: 10, Sold: 9, LiveUnits: 10, Orders: 11,
		ByStatus: map[string]int64{"pending": 1, "confirmed": 9, "failed": 1}, LedgerHolds: true,
	}, 10, 1500*time.Millisecond, true)
	out := b.String()
	for _, want := range []string{"orders     11 (confirmed 9, failed 1, pending 1)", "ledger holds", "lost 0 of 10 accepted", "drained    in 1.5s"} {
		if !strings.Contains(out, want) {
			t.Errorf("audit lacks %q:\n%s", want, out)
		}
	}
}

func TestMintTokens(t *testing.T) {
	toks, err := MintTokens("s3cret", "", "", 100, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	v, err := auth.NewVerifier(config.Auth{JWTSecret: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	for i, tok := range toks {
		rest, ok := bytes.CutPrefix(tok, []byte("Bearer "))
		if !ok {
			t.Fatalf("token %d: %q", i, tok)
		}
		c, err := v.Verify(string(rest))
		if err != nil || c.Subject != User(i) {
			t.Fatalf("token %d: %v, sub %q", i, err, c.Subject)
		}
	}
}

// The load waits for its new sale to show active, and runs anyway, with a
// warning, when it does not in time.
func TestAwaitActive(t *testing.T) {
	var asked atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		state := "upcoming"
		if r.URL.Path == "/v1/sales/s1" && asked.Add(1) >= 3 {
			state = "active"
		}
		fmt.Fprintf(w, `{"id":"s","state":%q}`, state)
	}))
	defer srv.Close()
	var warn bytes.Buffer
	AwaitActive(context.Background(), srv.URL, "s1", time.Minute, &warn)
	if asked.Load() != 3 || warn.Len() != 0 {
		t.Fatalf("asked %d times, warned %q", asked.Load(), warn.String())
	}
	AwaitActive(context.Background(), srv.URL, "s2", 300*time.Millisecond, &warn)
	if !strings.Contains(warn.String(), `sale s2 not active`) || !strings.Contains(warn.String(), `state "upcoming"`) {
		t.Fatalf("warning %q", warn.String())
	}
}
