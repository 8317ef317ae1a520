package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func figs() *Figures {
	return &Figures{
		RedisP1: ptr(30000), RedisP16: ptr(200000), NginxPerS: ptr(60000), SeedsPerS: ptr(500),
		PurchasesPerS: ptr(18000), RefusalsPerS: ptr(54000), P99MS: ptr(4.2), SendLagP99MS: ptr(0.3),
		HalfPeakRate: ptr(9000), IngestPerS: ptr(5000), RSSMB: ptr(150), RSSMiB: ptr(143.05),
		CPUPerPurchaseUS: ptr(200), GatewayCPUPerPurchaseUS: ptr(60), RefusalsNginxPerS: ptr(54000), NginxHalfPeakP99MS: ptr(2.1),
	}
}

func byName(ts []Target) map[string]Target {
	m := map[string]Target{}
	for _, t := range ts {
		m[t.Name] = t
	}
	return m
}

func TestTargetsAtTheirBounds(t *testing.T) {
	// 18000/30000 = 0.6, 54000/60000 = 0.9, 18000/500 = 36, 5000/500 = 10, 4.2 < 5, 150 <= 150: all met,
	// the ratios exactly on their goals.
	ts := targets(figs(), map[string]string{})
	if len(ts) != 10 {
		t.Fatalf("%d targets, want 10", len(ts))
	}
	want := []string{"purchases_vs_redis", "refusals_vs_nginx", "purchases_vs_seeds", "ingest_vs_seeds", "p99_half_peak", "rss_10k",
		"cpu_per_purchase", "gateway_cpu_per_purchase", "refusal_via_nginx_vs_nginx", "p99_vs_nginx_at_half_peak"}
	for i, tg := range ts {
		if tg.Name != want[i] {
			t.Errorf("target %d is %s, want %s", i, tg.Name, want[i])
		}
		if !tg.Met {
			t.Errorf("%s: missed: %s", tg.Name, tg.Line())
		}
	}
	m := byName(ts)
	if got := *m["purchases_vs_seeds"].Value; got != 36 {
		t.Errorf("purchases_vs_seeds = %v, want 36", got)
	}
}

func TestTargetsJustMissed(t *testing.T) {
	f := figs()
	f.PurchasesPerS = ptr(17999) // 0.59997 × redis; 35.998 × seeds (still met)
	f.RefusalsPerS = ptr(53999)  // just under 0.9
	f.IngestPerS = ptr(4999)     // 9.998 × seeds
	f.P99MS = ptr(5)             // the goal is strictly below 5 ms
	f.RSSMB = ptr(150.01)        // over 150 MB
	f.CPUPerPurchaseUS = ptr(200.5)
	f.GatewayCPUPerPurchaseUS = ptr(60.2)
	f.RefusalsNginxPerS = ptr(53999)
	f.NginxHalfPeakP99MS = ptr(1.66) // 5 / 1.66 > 3
	m := byName(targets(f, map[string]string{}))
	for _, name := range []string{"purchases_vs_redis", "refusals_vs_nginx", "ingest_vs_seeds", "p99_half_peak", "rss_10k",
		"cpu_per_purchase", "gateway_cpu_per_purchase", "refusal_via_nginx_vs_nginx", "p99_vs_nginx_at_half_peak"} {
		if m[name].Met {
			t.Errorf("%s met: %s", name, m[name].Line())
		}
	}
	if !m["purchases_vs_seeds"].Met {
		t.Errorf("purchases_vs_seeds missed: %s", m["purchases_vs_seeds"].Line())
	}
}

func TestTargetsMissingOrFailedParts(t *testing.T) {
	f := figs()
	f.SeedsPerS = nil // seeds_sync produced nothing
	problems := map[string]string{"seeds_sync": "seeds_sync failed", "purchases": "purchases audit FAILED"}
	m := byName(targets(f, problems))
	for _, name := range []string{"purchases_vs_seeds", "ingest_vs_seeds"} {
		tg := m[name]
		if tg.Met || tg.Value != nil || !strings.Contains(tg.Line(), ": n/a") || !strings.Contains(tg.Problem, "seeds_sync failed") {
			t.Errorf("%s: %+v / %s", name, tg, tg.Line())
		}
	}
	// A fast run that failed its audit does not count, whatever its figure.
	tg := m["purchases_vs_redis"]
	if tg.Met || tg.Value == nil || !strings.Contains(tg.Problem, "purchases audit FAILED") {
		t.Errorf("purchases_vs_redis with a failed audit: %s", tg.Line())
	}
	if !m["rss_10k"].Met || !m["p99_half_peak"].Met {
		t.Error("targets of other parts changed")
	}
}

func TestTargetLine(t *testing.T) {
	m := byName(targets(figs(), map[string]string{}))
	cases := map[string]string{
		"purchases_vs_redis": "target purchases_vs_redis: 0.60 (goal >= 0.6) met",
		"p99_half_peak":      "target p99_half_peak: 4.20 ms (goal < 5 ms) met",
		"rss_10k":            "target rss_10k: 150.0 MB (goal <= 150 MB) met",
	}
	for name, want := range cases {
		if got := m[name].Line(); got != want {
			t.Errorf("%s:\n got %s\nwant %s", name, got, want)
		}
	}
	f := figs()
	f.RSSMB, f.RSSMiB = nil, nil
	got := byName(targets(f, map[string]string{}))["rss_10k"].Line()
	if want := "target rss_10k: n/a (goal <= 150 MB) missed"; got != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
}

func TestReplaceSectionBetweenMarkers(t *testing.T) {
	doc := "# T\n\nintro\n\n" + beginMarker + "\nold\nstuff\n" + endMarker + "\n\n## Hand written\n\nkept | as is\n"
	got, err := replaceSection(doc, "new section\n")
	if err != nil {
		t.Fatal(err)
	}
	want := "# T\n\nintro\n\n" + beginMarker + "\nnew section\n" + endMarker + "\n\n## Hand written\n\nkept | as is\n"
	if got != want {
		t.Errorf("got\n%q\nwant\n%q", got, want)
	}
	// Again: the same result (idempotent).
	again, err := replaceSection(got, "new section")
	if err != nil || again != got {
		t.Errorf("second replacement changed the file: %q, %v", again, err)
	}
}

func TestReplaceSectionInsertsMarkers(t *testing.T) {
	doc := "# flashgate benchmarks\n\nMeasured on the machine.\n\n```\n## not a heading (code)\n```\n\n## Edge\n\ntext\n\n## Other\n"
	got, err := replaceSection(doc, "S")
	if err != nil {
		t.Fatal(err)
	}
	want := "# flashgate benchmarks\n\nMeasured on the machine.\n\n```\n## not a heading (code)\n```\n\n" +
		beginMarker + "\nS\n" + endMarker + "\n\n## Edge\n\ntext\n\n## Other\n"
	if got != want {
		t.Errorf("got\n%q\nwant\n%q", got, want)
	}
	// No heading: at the end. Empty file: the block alone.
	if got, _ := replaceSection("# T\nintro", "S"); got != "# T\nintro\n\n"+beginMarker+"\nS\n"+endMarker+"\n" {
		t.Errorf("no heading: %q", got)
	}
	if got, _ := replaceSection("", "S"); got != beginMarker+"\nS\n"+endMarker+"\n" {
		t.Errorf("empty: %q", got)
	}
}

func TestReplaceSectionRefusesBrokenMarkers(t *testing.T) {
	for name, doc := range map[string]string{
		"begin alone":  "a\n" + beginMarker + "\nb\n",
		"end alone":    "a\n" + endMarker + "\n",
		"out of order": endMarker + "\nx\n" + beginMarker + "\n",
		"twice":        beginMarker + endMarker + beginMarker + endMarker,
	} {
		if _, err := replaceSection(doc, "S"); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestRunFromParts runs the report on a var/bench made by hand: the figures,
// the audits, the exit code, the files it writes, and that the hand-written
// part of the Markdown survives.
func TestRunFromParts(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bench := func(accepted, s202, s409 int64, elapsed float64, auditOK *bool) string {
		b := map[string]any{
			"label": "x", "users": 200000, "concurrency": 256,
			"load": map[string]any{
				"requests": s202 + s409, "by_status": map[string]int64{"202": s202, "409": s409},
				"accepted": accepted, "elapsed_s": elapsed, "throughput": float64(s202+s409) / elapsed,
				"rate": 0.0, "latency_us": map[string]int64{"p50": 900, "p99": 3000},
				"accepted_latency_us": map[string]int64{"count": s202, "p50": 1000, "p99": 4100},
				"send_lag_us":         map[string]int64{"p99": 200},
			},
			"audit": nil,
		}
		if auditOK != nil {
			b["audit"] = map[string]any{"ok": *auditOK, "total": 10000000, "live_units": accepted, "orders": accepted,
				"ledger_holds": *auditOK, "drained": true, "drain_s": 1.5}
		}
		out, _ := json.Marshal(b)
		return string(out)
	}
	yes, no := true, false
	for _, p := range partNames {
		write(p+".rc", "0\n")
		write(p+".cmd", "bin/flashgate something --for "+p+"\n")
	}
	// The stack's secrets as the script's environment holds them: none may reach what the report writes.
	const pw, dsnPW, tok = "s3cretRedisPassw0rd", "d7220acf0641444352e9", "eyJhbGciOiJIUzI1NiJ9.payload.sig"
	write("run.json", `{"started":"2026-11-22T10:00:00Z","finished":"2026-11-22T10:04:30Z","elapsed_s":270,"loadavg_start":"1.0 1.0 1.0","loadavg_end":"2.0 2.0 2.0","stack":"running",`+
		`"gateway":"FLASHGATE_MYSQL_DSN=flashgate_admin:`+dsnPW+`@tcp(127.0.0.1:13306)/flashgate FLASHGATE_REDIS_PASSWORD=`+pw+` FLASHGATE_NATS_URL=nats://fg:`+pw+`@127.0.0.1:14222 bin/flashgate gateway",`+
		`"settings":{"duration":"10s","concurrency":256,"users":200000}}`)
	write("refusals.cmd", "curl -H 'Authorization: Bearer "+tok+"' http://127.0.0.1:18080/ FLASHGATE_JWT_SECRET="+pw+"\n")
	// CPU readings (clock ticks at 100 Hz): purchases 180,000 accepted; refusals_nginx 540,000 409s.
	write("purchases.cpu", "clk_tck 100\nbefore gateway 1000\nbefore redis 500\nbefore nats 10\nbefore backend 0\nbefore mariadb 0\nbefore at 100.0\n"+
		"load gateway 2800\nload redis 1400\nload nats 910\nload backend 450\nload mariadb 900\nload at 110.0\n"+
		"after gateway 4600\nafter redis 1400\nafter nats 910\nafter backend 900\nafter mariadb 1800\nafter at 112.0\n")
	write("refusals_nginx.cpu", "clk_tck 100\nbefore gateway 0\nbefore nginx 0\nbefore at 1\nafter gateway 54\nafter nginx 540\nafter at 11\ngateway_purchases_before 7\ngateway_purchases_after 17\n")
	write("redis_evalsha.json", `{"name":"redis_evalsha","rps_p1":30000,"rps_p16":200000,"pipeline":16,"clients":64,"requests":200000,"threads":2,"admitted_fraction":1}`)
	write("nginx_fixed.json", bench(0, 0, 600000, 10, nil))
	write("seeds_sync.json", `{"name":"seeds_sync","orders_per_s":500,"req_per_s":510,"accepted":5000,"orders_in_db":5000,"elapsed_s":10}`)
	write("purchases.json", bench(180000, 180000, 0, 10, &no)) // a failed audit
	write("purchases.rc", "1\n")
	write("sellout.json", bench(1000, 1000, 19000, 1, &yes))
	write("refusals.json", bench(0, 0, 540000, 10, nil))
	write("refusals_audit.json", bench(0, 0, 1000, 0.1, &yes))
	write("refusals_nginx.json", bench(0, 0, 540000, 10, nil))
	write("p99_half_peak.json", bench(90000, 90000, 0, 10, &yes))
	write("nginx_half_peak.json", bench(0, 0, 90000, 10, nil)) // p99 3 ms: 4.1 / 3
	write("backend_ingest.json", `{"orders":50000,"elapsed_s":10,"orders_per_s":5000,"audit_ok":true,"audit":{"ok":true,"by_status":{"confirmed":50000},"ledger_holds":true}}`)
	write("rss_10k.json", `{"conns":10000,"opened":10000,"still_open":10000,"after":{"rss_kb":97656}}`)

	md := filepath.Join(dir, "BENCHMARKS.md")
	hand := "\n## Edge\n\nhand-written, kept.\n"
	if err := os.WriteFile(md, []byte("# flashgate benchmarks\n\nintro\n"+hand), 0o644); err != nil {
		t.Fatal(err)
	}
	res := filepath.Join(dir, "results.json")
	var out strings.Builder
	code, err := run(dir, res, md, "", false, &out)
	if err != nil {
		t.Fatal(err)
	}
	if code != 1 {
		t.Errorf("exit %d with a failed audit, want 1", code)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) < 10 {
		t.Fatalf("output:\n%s", out.String())
	}
	last := lines[len(lines)-10:]
	wantPrefix := []string{
		"target purchases_vs_redis: 0.60 (goal >= 0.6) missed",
		"target refusals_vs_nginx: 0.90 (goal >= 0.9) met",
		"target purchases_vs_seeds: 36.00",
		"target ingest_vs_seeds: 10.00 (goal >= 10) met",
		"target p99_half_peak: 4.10 ms",
		"target rss_10k: 100.0 MB (goal <= 150 MB) met",
		// (3600+900+900+900+1800) ticks = 81 s over 180,000 purchases: 450 µs; the purchases part failed.
		"target cpu_per_purchase: 450 us (goal <= 200) missed",
		"target gateway_cpu_per_purchase: 200 us (goal <= 60) missed",
		"target refusal_via_nginx_vs_nginx: 0.90 (goal >= 0.9) met",
		"target p99_vs_nginx_at_half_peak: 1.37 (goal <= 3) met",
	}
	for i, w := range wantPrefix {
		if !strings.HasPrefix(last[i], w) {
			t.Errorf("line %d:\n got %s\nwant %s…", i, last[i], w)
		}
	}
	if !strings.Contains(out.String(), "audit purchases: FAILED") {
		t.Errorf("the failed audit is not shown:\n%s", out.String())
	}

	b, err := os.ReadFile(res)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Date    string `json:"date"`
		OK      bool   `json:"ok"`
		Machine struct {
			Cores int `json:"cores"`
		} `json:"machine"`
		Parts []struct {
			Name     string          `json:"name"`
			Status   string          `json:"status"`
			Commands []string        `json:"commands"`
			Result   json.RawMessage `json:"result"`
		} `json:"parts"`
		Targets []struct {
			Name string `json:"name"`
			Met  bool   `json:"met"`
		} `json:"targets"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.OK || got.Date != "2026-11-22T10:04:30Z" || got.Machine.Cores < 1 || len(got.Parts) != len(partNames) || len(got.Targets) != 10 {
		t.Errorf("results.json: %+v", got)
	}
	for _, p := range got.Parts {
		if len(p.Commands) != 1 || len(p.Result) == 0 {
			t.Errorf("part %s: commands %v, result %d bytes", p.Name, p.Commands, len(p.Result))
		}
		if want := map[bool]string{true: "failed", false: "ok"}[p.Name == "purchases"]; p.Status != want {
			t.Errorf("part %s: status %s, want %s", p.Name, p.Status, want)
		}
	}

	doc, err := os.ReadFile(md)
	if err != nil {
		t.Fatal(err)
	}
	s := string(doc)
	if !strings.HasPrefix(s, "# flashgate benchmarks\n\nintro\n\n"+beginMarker+"\n") || !strings.HasSuffix(s, endMarker+"\n\n"+hand[1:]) {
		t.Errorf("BENCHMARKS.md:\n%s", s)
	}
	for _, w := range []string{"2026-11-22 10:04 UTC", "`purchases_vs_redis`", "bin/flashgate something --for rss_10k", "**FAILED**",
		"| `purchases` | accepted purchase | 180,000 | — | 200.0 | 50.0 | 50.0 | 50.0 | 100.0 | **450.0** |",
		"| `purchases`, the load alone (10.0 s of 12.0 s) | accepted purchase | 180,000 | — | 100.0 | 50.0 | 50.0 | 25.0 | 50.0 | **275.0** |",
		"| `refusals_nginx` | 409 | 540,000 | 10.0 | 1.0 | — | — | — | — | **11.0** |", "10 of them reached the gateway",
		"FLASHGATE_REDIS_PASSWORD=<redacted>", "flashgate_admin:<redacted>@tcp(127.0.0.1:13306)"} {
		if !strings.Contains(s, w) {
			t.Errorf("BENCHMARKS.md lacks %q", w)
		}
	}

	for name, text := range map[string]string{"results.json": string(b), "BENCHMARKS.md": s, "stdout": out.String()} {
		for _, secret := range []string{pw, dsnPW, tok} {
			if strings.Contains(text, secret) {
				t.Errorf("%s holds the secret %q", name, secret)
			}
		}
	}

	// A second run over its own output leaves the hand-written part alone and the section the same.
	if _, err := run(dir, res, md, "", false, &strings.Builder{}); err != nil {
		t.Fatal(err)
	}
	doc2, _ := os.ReadFile(md)
	if string(doc2) != s {
		t.Error("a second run changed BENCHMARKS.md")
	}
}

func TestNum(t *testing.T) {
	for in, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 1234567.4: "1,234,567", -45678: "-45,678"} {
		if got := num(in); got != want {
			t.Errorf("num(%v) = %q, want %q", in, got, want)
		}
	}
}

func TestTopRows(t *testing.T) {
	s := "File: flashgate\nType: cpu\nShowing nodes\n      flat  flat%   sum%        cum   cum%\n     1.2s 40.00% 40.00%      1.2s 40.00%  syscall.Syscall\n     0.6s 20.00% 60.00%      0.6s 20.00%  runtime.futex\n"
	got := topRows(s, 10)
	if len(got) != 3 || !strings.Contains(got[0], "flat%") || !strings.HasSuffix(got[2], "runtime.futex") {
		t.Errorf("topRows: %q", got)
	}
	if got := topRows(s, 1); len(got) != 2 {
		t.Errorf("topRows(1): %q", got)
	}
}

func TestRedact(t *testing.T) {
	cases := map[string]string{
		"FLASHGATE_REDIS_PASSWORD=abc123 FLASHGATE_REDIS_ADDRS=127.0.0.1:16379":             "FLASHGATE_REDIS_PASSWORD=<redacted> FLASHGATE_REDIS_ADDRS=127.0.0.1:16379",
		"FLASHGATE_MYSQL_DSN=admin:pw@tcp(127.0.0.1:13306)/flashgate":                       "FLASHGATE_MYSQL_DSN=admin:<redacted>@tcp(127.0.0.1:13306)/flashgate",
		"nats://user:pw@127.0.0.1:4222 redis://:pw2@h:6379":                                 "nats://user:<redacted>@127.0.0.1:4222 redis://:<redacted>@h:6379",
		`"FLASHGATE_ADMIN_TOKEN='x y'" FLASHGATE_JWT_SECRET="q" admin_api_key=k`:            `"FLASHGATE_ADMIN_TOKEN=<redacted>" FLASHGATE_JWT_SECRET=<redacted> admin_api_key=<redacted>`,
		"Authorization: Bearer eyJhbGciOi.abc.def":                                          "Authorization: Bearer <redacted>",
		"FLASHGATE_REDIS_CLUSTER_ADDRS=127.0.0.1:17001,127.0.0.1:17002 --rate 1934 a:b c@d": "FLASHGATE_REDIS_CLUSTER_ADDRS=127.0.0.1:17001,127.0.0.1:17002 --rate 1934 a:b c@d",
	}
	for in, want := range cases {
		if got := redact(in); got != want {
			t.Errorf("redact(%q)\n got %q\nwant %q", in, got, want)
		}
		if got := redact(redact(in)); got != want {
			t.Errorf("redact twice (%q) = %q", in, got)
		}
	}
}
