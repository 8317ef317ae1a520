package main

import (
	"fmt"
	"strconv"
	"strings"
)

// evaluate works out the audits, the figures and the targets.
func (r *Report) evaluate() {
	r.OK = true
	for _, p := range r.Parts {
		if p.Status != "ok" {
			r.OK = false
			r.Problems = append(r.Problems, fmt.Sprintf("%s %s: %s", p.Name, p.Status, p.Why))
		}
	}

	// Audits: every flashgate run that ends with one, and what the others must show.
	for _, name := range partNames {
		if a, ok := r.audit(name); ok {
			r.Audits = append(r.Audits, a)
		}
	}
	for _, a := range r.Audits {
		if !a.OK {
			r.OK = false
			r.Problems = append(r.Problems, fmt.Sprintf("audit %s FAILED: %s", a.Part, a.Summary))
		}
	}

	// Figures.
	f := &r.Figures
	if r.redis != nil && r.redis.RPSP1 > 0 {
		f.RedisP1, f.RedisP16 = ptr(r.redis.RPSP1), ptr(r.redis.RPSP16)
	}
	if r.nginx != nil && r.nginx.perS(409) > 0 {
		f.NginxPerS = ptr(r.nginx.perS(409))
	}
	if r.seeds != nil && r.seeds.OrdersPerS > 0 {
		f.SeedsPerS = ptr(r.seeds.OrdersPerS)
	}
	if b := r.bench["purchases"]; b != nil && b.acceptedPerS() > 0 {
		f.PurchasesPerS = ptr(b.acceptedPerS())
		f.PurchasesP99MS = ptr(float64(b.Load.AcceptedLatency.P99) / 1000)
	}
	if b := r.bench["refusals"]; b != nil && b.perS(409) > 0 {
		f.RefusalsPerS = ptr(b.perS(409))
	}
	if b := r.bench["p99_half_peak"]; b != nil && b.Load.AcceptedLatency.Count > 0 {
		f.P99MS = ptr(float64(b.Load.AcceptedLatency.P99) / 1000)
		f.HalfPeakRate = ptr(b.Load.Rate)
		if b.Load.SendLag != nil {
			f.SendLagP99MS = ptr(float64(b.Load.SendLag.P99) / 1000)
		}
	}
	if r.ingest != nil && r.ingest.OrdersPerS > 0 {
		f.IngestPerS = ptr(r.ingest.OrdersPerS)
	}
	// CPU per answer, for the parts that were measured.
	for i := range r.Parts {
		p := &r.Parts[i]
		b := r.bench[p.Name]
		if p.cpu == nil || b == nil {
			continue
		}
		switch p.Name {
		case "purchases", "p99_half_peak":
			p.CPU = p.cpu.use(b.Load.Accepted, "accepted purchase")
		default:
			p.CPU = p.cpu.use(b.status(409), "409")
		}
	}
	if p := r.part("purchases"); p != nil && p.CPU != nil {
		f.CPUPerPurchaseUS = ptr(p.CPU.TotalUS)
		var parts []string
		for _, n := range p.CPU.procs() {
			parts = append(parts, fmt.Sprintf("%s %.0f", n, p.CPU.PerUS[n]))
		}
		f.cpuDetail = strings.Join(parts, " + ") + fmt.Sprintf(" µs, %s purchases", num(float64(p.CPU.Answers)))
		if v, ok := p.CPU.PerUS["gateway"]; ok {
			f.GatewayCPUPerPurchaseUS = ptr(v)
		}
	}
	if b := r.bench["refusals_nginx"]; b != nil && b.perS(409) > 0 {
		f.RefusalsNginxPerS = ptr(b.perS(409))
	}
	if b := r.bench["nginx_half_peak"]; b != nil && b.Load.Latency.P99 > 0 {
		f.NginxHalfPeakP99MS = ptr(float64(b.Load.Latency.P99) / 1000)
	}
	if r.conns != nil && r.conns.After.RSSKB > 0 {
		f.RSSMB = ptr(float64(r.conns.After.RSSKB) * 1024 / 1e6)
		f.RSSMiB = ptr(float64(r.conns.After.RSSKB) / 1024)
	}

	r.Targets = targets(f, r.problems())
	r.AllMet = true
	for _, t := range r.Targets {
		r.AllMet = r.AllMet && t.Met
	}
}

// audit is the verdict on one part's correctness, if it has one.
func (r *Report) audit(name string) (Audit, bool) {
	a := Audit{Part: name}
	switch name {
	case "purchases", "sellout", "refusals_audit", "p99_half_peak":
		b := r.bench[name]
		if b == nil {
			return a, false
		}
		if b.Audit == nil {
			a.Summary = "no audit in the result"
			return a, true
		}
		a.OK = b.Audit.OK
		a.Summary = b.Audit.summary()
		if b.Load.BadOrderIDs > 0 {
			a.Summary += fmt.Sprintf(", 202s without order id %d", b.Load.BadOrderIDs)
		}
	case "refusals", "refusals_nginx":
		// The refusals runs have no audit of their own (refusals_audit follows one); what
		// they must show is that nothing was sold.
		b := r.bench[name]
		if b == nil {
			return a, false
		}
		a.OK = b.status(202) == 0 && b.Load.Accepted == 0
		a.Summary = fmt.Sprintf("%s 202s on the sold-out sale (answers: %s)", num(float64(b.status(202))), b.statuses())
	case "backend_ingest":
		if r.ingest == nil {
			return a, false
		}
		a.OK = r.ingest.AuditOK
		a.Summary = r.ingest.Audit.summary()
		if c := r.ingest.Audit.ByStatus["confirmed"]; c != int64(r.ingest.Orders) {
			a.Summary += fmt.Sprintf(", confirmed %d of %d", c, r.ingest.Orders)
		}
	case "rss_10k":
		c := r.conns
		if c == nil {
			return a, false
		}
		a.OK = c.Opened == c.Conns && c.StillOpen == c.Conns
		a.Summary = fmt.Sprintf("%s of %s connections opened, %s still open at the reading, %d failed",
			num(float64(c.Opened)), num(float64(c.Conns)), num(float64(c.StillOpen)), c.Failed)
		if c.FirstErr != "" {
			a.Summary += " (first: " + c.FirstErr + ")"
		}
	default:
		return a, false
	}
	return a, true
}

// problems maps each part to why it cannot count ("" when it can), audits included.
func (r *Report) problems() map[string]string {
	m := map[string]string{}
	for _, name := range partNames {
		m[name] = r.problem(name)
	}
	for _, a := range r.Audits {
		if !a.OK {
			m[a.Part] = a.Part + " audit FAILED"
		}
	}
	return m
}

// targets are issue 6's goals, worked out from the figures. problems names,
// per part, why its figure cannot count; a target whose figure is missing or
// whose parts have a problem is missed.
func targets(f *Figures, problems map[string]string) []Target {
	ratio := func(name, what string, num, den *float64, unit string, parts []string, goal float64) Target {
		t := Target{Name: name, What: what, Goal: ">= " + trimFloat(goal), op: ">=", threshold: goal, decimals: 2}
		if num != nil && den != nil && *den > 0 {
			t.Value = ptr(*num / *den)
			t.Detail = fmt.Sprintf("%s / %s %s", numf(*num), numf(*den), unit)
		}
		return t.judge(parts, problems)
	}
	var out []Target
	out = append(out,
		ratio("purchases_vs_redis", "accepted purchases/s ÷ redis-benchmark EVALSHA admit.lua calls/s, unpipelined",
			f.PurchasesPerS, f.RedisP1, "per s", []string{"purchases", "redis_evalsha"}, 0.6),
		ratio("refusals_vs_nginx", "409s/s of the gateway on a sold-out sale ÷ 409s/s of nginx answering a fixed body",
			f.RefusalsPerS, f.NginxPerS, "per s", []string{"refusals", "refusals_audit", "sellout", "nginx_fixed"}, 0.9),
		ratio("purchases_vs_seeds", "accepted purchases/s ÷ the seeds' synchronous design's orders/s",
			f.PurchasesPerS, f.SeedsPerS, "per s", []string{"purchases", "seeds_sync"}, 20),
		ratio("ingest_vs_seeds", "backend ingestion orders/s ÷ the seeds' synchronous design's orders/s",
			f.IngestPerS, f.SeedsPerS, "per s", []string{"backend_ingest", "seeds_sync"}, 10),
	)
	p99 := Target{Name: "p99_half_peak", What: "p99 latency of accepted purchases at half the peak rate (HDR, from each request's due time)",
		Goal: "< 5 ms", Unit: "ms", op: "<", threshold: 5, decimals: 2}
	if f.P99MS != nil {
		p99.Value = f.P99MS
		p99.Detail = "at " + numf(deref(f.HalfPeakRate)) + " req/s"
		if f.SendLagP99MS != nil {
			p99.Detail += fmt.Sprintf(", send lag p99 %.2f ms", *f.SendLagP99MS)
		}
	}
	out = append(out, p99.judge([]string{"p99_half_peak"}, problems))
	rss := Target{Name: "rss_10k", What: "bench gateway RSS holding 10,000 idle keep-alive connections (MB = 10^6 bytes)",
		Goal: "<= 150 MB", Unit: "MB", op: "<=", threshold: 150, decimals: 1}
	if f.RSSMB != nil {
		rss.Value = f.RSSMB
		rss.Detail = fmt.Sprintf("%.1f MiB", deref(f.RSSMiB))
	}
	out = append(out, rss.judge([]string{"rss_10k"}, problems))

	// issue 13: what an answer costs, and the edge and the tail against nginx's.
	cpu := Target{Name: "cpu_per_purchase", What: "CPU µs per accepted purchase, the whole chain (gateway, Redis, NATS, backend, MariaDB; /proc utime+stime during `purchases`, drain included)",
		Goal: "<= 200", Unit: "us", op: "<=", threshold: 200, decimals: 0}
	cpu.Value = f.CPUPerPurchaseUS
	cpu.Detail = f.cpuDetail
	out = append(out, cpu.judge([]string{"purchases"}, problems))
	gw := Target{Name: "gateway_cpu_per_purchase", What: "the gateway's CPU µs per accepted purchase (the same reading)",
		Goal: "<= 60", Unit: "us", op: "<=", threshold: 60, decimals: 0}
	gw.Value = f.GatewayCPUPerPurchaseUS
	out = append(out, gw.judge([]string{"purchases"}, problems))
	out = append(out, ratio("refusal_via_nginx_vs_nginx",
		"sold-out 409s/s through nginx with its production config (nginx/nginx.conf) in front of the gateway ÷ nginx's fixed 409s/s, same tool, same run",
		f.RefusalsNginxPerS, f.NginxPerS, "per s", []string{"refusals_nginx", "nginx_fixed", "sellout"}, 0.9))
	tail := Target{Name: "p99_vs_nginx_at_half_peak", What: "p99 of accepted purchases ÷ p99 of nginx's fixed answer, both paced at half the purchase peak in the same run",
		Goal: "<= 3", op: "<=", threshold: 3, decimals: 2}
	if f.P99MS != nil && f.NginxHalfPeakP99MS != nil && *f.NginxHalfPeakP99MS > 0 {
		tail.Value = ptr(*f.P99MS / *f.NginxHalfPeakP99MS)
		tail.Detail = fmt.Sprintf("%.2f ms / %.2f ms at %s req/s", *f.P99MS, *f.NginxHalfPeakP99MS, numf(deref(f.HalfPeakRate)))
	}
	out = append(out, tail.judge([]string{"p99_half_peak", "nginx_half_peak"}, problems))
	return out
}

func deref(p *float64) float64 {
	if p == nil {
		return 0
	}
	return *p
}

// judge sets Met (and Problem) from the value, the goal and the parts' problems.
func (t Target) judge(parts []string, problems map[string]string) Target {
	var ps []string
	for _, p := range parts {
		if s := problems[p]; s != "" {
			ps = append(ps, s)
		}
	}
	t.Problem = strings.Join(ps, "; ")
	if t.Value == nil {
		if t.Problem == "" {
			t.Problem = "not measured"
		}
		t.Met = false
		return t
	}
	v := *t.Value
	switch t.op {
	case ">=":
		t.Met = v >= t.threshold
	case "<=":
		t.Met = v <= t.threshold
	case "<":
		t.Met = v < t.threshold
	}
	if t.Problem != "" {
		t.Met = false
	}
	return t
}

// figure is the measured value as the target line shows it.
func (t Target) figure() string {
	if t.Value == nil {
		return "n/a"
	}
	s := strconv.FormatFloat(*t.Value, 'f', t.decimals, 64)
	if t.Unit == "ms" || t.Unit == "MB" || t.Unit == "us" {
		s += " " + t.Unit
	}
	return s
}

// Line is the target's line, exactly `target <name>: <figure> (goal <goal>) met|missed`
// (what the figure is made of is in BENCHMARKS.md and results.json).
func (t Target) Line() string {
	verdict := "missed"
	if t.Met {
		verdict = "met"
	}
	return "target " + t.Name + ": " + t.figure() + " (goal " + t.Goal + ") " + verdict
}
