// Command report is the last step of `make bench` (scripts/bench.sh; flashgate
// issue 6). It reads the parts the script left in var/bench (<part>.json, the
// tool's raw result; <part>.cmd, the commands; <part>.rc, the exit code;
// <part>.skip, why a part did not run; run.json, the run's settings and
// times), works out the figures and the targets, writes bench/results.json
// (every raw part, the machine, the commands, the date, the targets) and the
// generated section of BENCHMARKS.md (between the make bench markers; the rest
// of the file is left as it is), and prints one line per target, last:
//
//	target <name>: <figure> (goal <goal>) met|missed
//
// It exits 1 when a part failed or an audit found a broken invariant (after
// writing everything), and with --strict also when a target is missed.
//
// `report rate FILE` prints the accepted purchases per second of a `flashgate
// bench --json` result (the script halves it for the p99 run).
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The parts, in the order the script runs them.
var partNames = []string{
	"seeds_sync", "redis_evalsha", "purchases", "sellout", "nginx_fixed", "refusals",
	"refusals_audit", "p99_half_peak", "backend_ingest", "rss_10k",
}

// Markers of the generated section of BENCHMARKS.md.
const (
	beginMarker = "<!-- make bench: begin -->"
	endMarker   = "<!-- make bench: end -->"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "rate" {
		if len(os.Args) != 3 {
			fmt.Fprintln(os.Stderr, "usage: report rate FILE")
			os.Exit(2)
		}
		r, err := rateCmd(os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, "report:", err)
			os.Exit(1)
		}
		fmt.Println(r)
		return
	}
	dir := flag.String("dir", "var/bench", "where the parts are")
	results := flag.String("results", "bench/results.json", "the JSON `file` to write")
	markdown := flag.String("markdown", "BENCHMARKS.md", "the Markdown `file` whose generated section to rewrite (\"\": none)")
	profiles := flag.String("profiles", "", "`directory` of the profiles' pprof -top texts to list (\"\": none)")
	strict := flag.Bool("strict", false, "exit 1 when a target is missed")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "report: unexpected arguments", flag.Args())
		os.Exit(2)
	}
	code, err := run(*dir, *results, *markdown, *profiles, *strict, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

// rateCmd is accepted 202s per second of a `flashgate bench --json` file, rounded.
func rateCmd(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var r benchResult
	if err := json.Unmarshal(b, &r); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	v := r.acceptedPerS()
	if !(v > 0) {
		return "", fmt.Errorf("%s: no accepted purchases", path)
	}
	return strconv.FormatFloat(math.Round(v), 'f', 0, 64), nil
}

func run(dir, resultsPath, mdPath, profDir string, strict bool, stdout io.Writer) (int, error) {
	rep, err := load(dir)
	if err != nil {
		return 1, err
	}
	rep.Machine = machine()
	if profDir != "" {
		rep.Profiles = readProfiles(profDir)
	}
	rep.evaluate()

	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // ">= 0.6", not "\u003e= 0.6"
	enc.SetIndent("", "  ")
	if err := enc.Encode(rep); err != nil {
		return 1, err
	}
	if err := writeFile(resultsPath, buf.Bytes()); err != nil {
		return 1, err
	}
	if mdPath != "" {
		doc, err := os.ReadFile(mdPath)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return 1, err
		}
		out, err := replaceSection(string(doc), rep.markdown(resultsPath))
		if err != nil {
			return 1, fmt.Errorf("%s: %w", mdPath, err)
		}
		if err := writeFile(mdPath, []byte(out)); err != nil {
			return 1, err
		}
	}
	rep.printLines(stdout, resultsPath, mdPath)
	code := 0
	if !rep.OK {
		code = 1
	}
	if strict && !rep.AllMet {
		code = 1
	}
	return code, nil
}

// writeFile writes through a temporary file, so that a reader never sees half of it.
func writeFile(path string, b []byte) error {
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// ---------------------------------------------------------------------------------------------
// what the tools write (only the fields the report reads; the raw JSON is kept whole)

// benchResult is `flashgate bench --json`.
type benchResult struct {
	Label       string      `json:"label"`
	Target      string      `json:"target"`
	Sale        string      `json:"sale"`
	Users       int         `json:"users"`
	Concurrency int         `json:"concurrency"`
	Load        loadSummary `json:"load"`
	Audit       *auditInfo  `json:"audit"`
}

type loadSummary struct {
	Requests        int64            `json:"requests"`
	TransportErrors int64            `json:"transport_errors"`
	ByStatus        map[string]int64 `json:"by_status"`
	ByCode          map[string]int64 `json:"by_code"`
	Accepted        int64            `json:"accepted"`
	BadOrderIDs     int64            `json:"bad_order_ids"`
	ElapsedS        float64          `json:"elapsed_s"`
	Throughput      float64          `json:"throughput"`
	Rate            float64          `json:"rate"`
	LatencyFrom     string           `json:"latency_from"`
	Latency         percentiles      `json:"latency_us"`
	AcceptedLatency percentiles      `json:"accepted_latency_us"`
	SendLag         *percentiles     `json:"send_lag_us"`
}

type percentiles struct {
	Count int64 `json:"count"`
	P50   int64 `json:"p50"`
	P90   int64 `json:"p90"`
	P99   int64 `json:"p99"`
	P999  int64 `json:"p999"`
	Max   int64 `json:"max"`
}

// auditInfo is audit.Report plus bench's verdict.
type auditInfo struct {
	SaleID         string           `json:"sale_id"`
	Total          int64            `json:"total"`
	Sold           int64            `json:"sold"`
	LiveUnits      int64            `json:"live_units"`
	Orders         int64            `json:"orders"`
	ByStatus       map[string]int64 `json:"by_status"`
	Oversold       int64            `json:"oversold"`
	OverLimitUsers int64            `json:"over_limit_users"`
	Lost           int64            `json:"lost"`
	Duplicated     int64            `json:"duplicated"`
	RedisRemaining int64            `json:"redis_remaining"`
	RedisReserved  int64            `json:"redis_reserved"`
	LedgerHolds    bool             `json:"ledger_holds"`
	LedgerDiff     int64            `json:"ledger_diff"`
	OK             bool             `json:"ok"`
	Drained        bool             `json:"drained"`
	DrainS         float64          `json:"drain_s"`
}

func (a *auditInfo) summary() string {
	s := fmt.Sprintf("sold %s/%s, orders %s, oversold %d, over-limit users %d, lost %d, duplicated %d",
		num(float64(a.LiveUnits)), num(float64(a.Total)), num(float64(a.Orders)), a.Oversold, a.OverLimitUsers, a.Lost, a.Duplicated)
	if a.LedgerHolds {
		s += ", ledger holds"
	} else {
		s += fmt.Sprintf(", ledger off by %d", a.LedgerDiff)
	}
	if a.DrainS > 0 || a.Drained {
		if a.Drained {
			s += fmt.Sprintf(", drained in %.1f s", a.DrainS)
		} else {
			s += fmt.Sprintf(", NOT drained after %.1f s", a.DrainS)
		}
	}
	return s
}

func (r *benchResult) status(code int) int64 { return r.Load.ByStatus[strconv.Itoa(code)] }

// acceptedPerS is the distinct order ids of 202s per second of the run.
func (r *benchResult) acceptedPerS() float64 {
	if r.Load.ElapsedS <= 0 {
		return 0
	}
	return float64(r.Load.Accepted) / r.Load.ElapsedS
}

// perS is the answers with this status per second of the run.
func (r *benchResult) perS(code int) float64 {
	if r.Load.ElapsedS <= 0 {
		return 0
	}
	return float64(r.status(code)) / r.Load.ElapsedS
}

// statuses renders the counts by status: "202: 1,000 · 409: 19,000".
func (r *benchResult) statuses() string {
	keys := make([]string, 0, len(r.Load.ByStatus))
	for k := range r.Load.ByStatus {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys)+1)
	for _, k := range keys {
		parts = append(parts, k+": "+num(float64(r.Load.ByStatus[k])))
	}
	if r.Load.TransportErrors > 0 {
		parts = append(parts, "transport errors: "+num(float64(r.Load.TransportErrors)))
	}
	if len(parts) == 0 {
		return "no answers"
	}
	return strings.Join(parts, " · ")
}

// redisResult is scripts/bench-redis.sh's last line.
type redisResult struct {
	RPSP1            float64 `json:"rps_p1"`
	RPSP16           float64 `json:"rps_p16"`
	Pipeline         int     `json:"pipeline"`
	Clients          int     `json:"clients"`
	Requests         int64   `json:"requests"`
	Threads          int     `json:"threads"`
	AdmittedFraction float64 `json:"admitted_fraction"`
}

// seedsResult is scripts/bench-seedsync.sh's last line.
type seedsResult struct {
	OrdersPerS      float64 `json:"orders_per_s"`
	ReqPerS         float64 `json:"req_per_s"`
	Requests        int64   `json:"requests"`
	Accepted        int64   `json:"accepted"`
	P50MS           float64 `json:"p50_ms"`
	P99MS           float64 `json:"p99_ms"`
	OrdersInDB      int64   `json:"orders_in_db"`
	ElapsedS        float64 `json:"elapsed_s"`
	TransportErrors int64   `json:"transport_errors"`
}

// ingestResult is `flashgate bench-ingest --json`.
type ingestResult struct {
	Orders        int       `json:"orders"`
	ElapsedS      float64   `json:"elapsed_s"`
	OrdersPerS    float64   `json:"orders_per_s"`
	AuditOK       bool      `json:"audit_ok"`
	FillS         float64   `json:"fill_s"`
	StartupS      float64   `json:"startup_s"`
	BatchSize     int       `json:"batch_size"`
	BatchWaitMS   float64   `json:"batch_wait_ms"`
	MaxAckPending int       `json:"max_ack_pending"`
	MySQLConns    int       `json:"mysql_max_open_conns"`
	Batches       int64     `json:"batches"`
	BatchBusyS    float64   `json:"batch_busy_s"`
	Audit         auditInfo `json:"audit"`
}

// connsResult is `flashgate bench-conns --json`.
type connsResult struct {
	Conns     int      `json:"conns"`
	Opened    int      `json:"opened"`
	StillOpen int      `json:"still_open"`
	Failed    int      `json:"failed"`
	FirstErr  string   `json:"first_error"`
	PerConnKB float64  `json:"rss_per_conn_kb"`
	Before    procMem  `json:"before"`
	After     procMem  `json:"after"`
	Closed    *procMem `json:"after_close"`
}

type procMem struct {
	RSSKB int64 `json:"rss_kb"`
	HWMKB int64 `json:"hwm_kb"`
	FDs   int   `json:"fds"`
}

// runInfo is var/bench/run.json, written by the script.
type runInfo struct {
	Started      string          `json:"started"`
	Finished     string          `json:"finished"`
	ElapsedS     float64         `json:"elapsed_s"`
	LoadavgStart string          `json:"loadavg_start"`
	LoadavgEnd   string          `json:"loadavg_end"`
	Stack        string          `json:"stack"`
	Gateway      string          `json:"gateway"`
	Settings     json.RawMessage `json:"settings"`
}

// ---------------------------------------------------------------------------------------------
// the report

// Part is one measurement as the script left it.
type Part struct {
	Name     string          `json:"name"`
	Status   string          `json:"status"` // ok, failed, skipped, missing
	ExitCode *int            `json:"exit_code,omitempty"`
	Why      string          `json:"why,omitempty"`
	Commands []string        `json:"commands,omitempty"`
	Result   json.RawMessage `json:"result,omitempty"`
}

// Audit is the verdict of one audited part.
type Audit struct {
	Part    string `json:"part"`
	OK      bool   `json:"ok"`
	Summary string `json:"summary"`
}

// Target is one goal of issue 6 and how this run measured against it.
type Target struct {
	Name  string   `json:"name"`
	What  string   `json:"what"`
	Goal  string   `json:"goal"` // e.g. ">= 0.6"
	Unit  string   `json:"unit,omitempty"`
	Value *float64 `json:"value"` // nil: not measured
	// Detail says where the value comes from ("12,345 / 30,112 per s").
	Detail string `json:"detail,omitempty"`
	// Problem is why the value cannot count (a part failed, an audit failed).
	Problem string `json:"problem,omitempty"`
	Met     bool   `json:"met"`

	op        string // ">=", "<", "<="
	threshold float64
	decimals  int
}

// Figures are the headline numbers of the run.
type Figures struct {
	RedisP1        *float64 `json:"redis_evalsha_p1_per_s"`
	RedisP16       *float64 `json:"redis_evalsha_pipelined_per_s"`
	NginxPerS      *float64 `json:"nginx_fixed_per_s"`
	SeedsPerS      *float64 `json:"seeds_sync_orders_per_s"`
	PurchasesPerS  *float64 `json:"purchases_accepted_per_s"`
	RefusalsPerS   *float64 `json:"refusals_per_s"`
	P99MS          *float64 `json:"p99_half_peak_accepted_ms"`
	SendLagP99MS   *float64 `json:"p99_half_peak_send_lag_ms"`
	HalfPeakRate   *float64 `json:"p99_half_peak_rate"`
	IngestPerS     *float64 `json:"backend_ingest_orders_per_s"`
	RSSMB          *float64 `json:"rss_10k_mb"`
	RSSMiB         *float64 `json:"rss_10k_mib"`
	PurchasesP99MS *float64 `json:"purchases_accepted_p99_ms"`
}

// Report is bench/results.json.
type Report struct {
	Date     string          `json:"date"`
	Started  string          `json:"started,omitempty"`
	Finished string          `json:"finished,omitempty"`
	ElapsedS float64         `json:"elapsed_s,omitempty"`
	Machine  Machine         `json:"machine"`
	Run      *runInfo        `json:"run,omitempty"`
	Figures  Figures         `json:"figures"`
	Targets  []Target        `json:"targets"`
	Audits   []Audit         `json:"audits"`
	Parts    []Part          `json:"parts"`
	Profiles []Profile       `json:"profiles,omitempty"`
	OK       bool            `json:"ok"`      // every part ran and every audit held
	AllMet   bool            `json:"all_met"` // every target met
	Problems []string        `json:"problems,omitempty"`
	parsed   map[string]bool // parts whose JSON decoded
	redis    *redisResult
	nginx    *benchResult
	seeds    *seedsResult
	bench    map[string]*benchResult
	ingest   *ingestResult
	conns    *connsResult
}

// Profile is one pprof -top text of the run.
type Profile struct {
	Name string   `json:"name"`
	Path string   `json:"path"`
	Top  []string `json:"top"` // the first rows of the table
}

// Machine is where the run ran.
type Machine struct {
	Cores     int    `json:"cores"`
	CPUModel  string `json:"cpu_model"`
	MemTotal  string `json:"mem_total"`
	Kernel    string `json:"kernel"`
	GoVersion string `json:"go"`
	OS        string `json:"os"`
}

func machine() Machine {
	m := Machine{Cores: runtime.NumCPU(), GoVersion: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				f := strings.Fields(v)
				if kb, err := strconv.ParseFloat(f[0], 64); err == nil && len(f) == 2 && f[1] == "kB" {
					m.MemTotal = fmt.Sprintf("%.1f GiB", kb/1024/1024)
				}
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}

// load reads every part the script left in dir.
func load(dir string) (*Report, error) {
	rep := &Report{parsed: map[string]bool{}, bench: map[string]*benchResult{}}
	if b, err := os.ReadFile(filepath.Join(dir, "run.json")); err == nil {
		var ri runInfo
		if err := json.Unmarshal(b, &ri); err != nil {
			return nil, fmt.Errorf("run.json: %w", err)
		}
		rep.Run = &ri
		rep.Started, rep.Finished, rep.ElapsedS = ri.Started, ri.Finished, ri.ElapsedS
	}
	rep.Date = time.Now().UTC().Format(time.RFC3339)
	if rep.Finished != "" {
		rep.Date = rep.Finished
	}
	for _, name := range partNames {
		p := Part{Name: name}
		if b, err := os.ReadFile(filepath.Join(dir, name+".cmd")); err == nil {
			for line := range strings.Lines(string(b)) {
				if line = strings.TrimSpace(line); line != "" {
					p.Commands = append(p.Commands, line)
				}
			}
		}
		if b, err := os.ReadFile(filepath.Join(dir, name+".rc")); err == nil {
			if rc, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				p.ExitCode = &rc
			}
		}
		if b, err := os.ReadFile(filepath.Join(dir, name+".skip")); err == nil {
			p.Why = strings.TrimSpace(string(b))
		}
		if b, err := os.ReadFile(filepath.Join(dir, name+".json")); err == nil && json.Valid(bytes.TrimSpace(b)) {
			p.Result = json.RawMessage(bytes.TrimSpace(b))
		}
		switch {
		case p.Why != "":
			p.Status = "skipped"
		case p.ExitCode != nil && *p.ExitCode != 0:
			p.Status = "failed"
			p.Why = fmt.Sprintf("exit %d (var/bench/%s.err)", *p.ExitCode, name)
		case p.Result == nil:
			p.Status = "missing"
			p.Why = "no result (var/bench/" + name + ".json)"
		default:
			p.Status = "ok"
		}
		if p.Result != nil {
			if err := rep.decode(name, p.Result); err != nil {
				p.Status = "failed"
				p.Why = err.Error()
			} else {
				rep.parsed[name] = true
			}
		}
		rep.Parts = append(rep.Parts, p)
	}
	return rep, nil
}

func (r *Report) decode(name string, raw json.RawMessage) error {
	var err error
	switch name {
	case "redis_evalsha":
		r.redis = &redisResult{}
		err = json.Unmarshal(raw, r.redis)
	case "seeds_sync":
		r.seeds = &seedsResult{}
		err = json.Unmarshal(raw, r.seeds)
	case "backend_ingest":
		r.ingest = &ingestResult{}
		err = json.Unmarshal(raw, r.ingest)
	case "rss_10k":
		r.conns = &connsResult{}
		err = json.Unmarshal(raw, r.conns)
	default: // flashgate bench
		b := &benchResult{}
		err = json.Unmarshal(raw, b)
		r.bench[name] = b
		if name == "nginx_fixed" {
			r.nginx = b
		}
	}
	if err != nil {
		return fmt.Errorf("%s.json: %w", name, err)
	}
	return nil
}

func (r *Report) part(name string) *Part {
	for i := range r.Parts {
		if r.Parts[i].Name == name {
			return &r.Parts[i]
		}
	}
	return nil
}

// problem says why a part's figure cannot count ("" when it can): it failed,
// was skipped or left no result.
func (r *Report) problem(name string) string {
	p := r.part(name)
	switch {
	case p == nil:
		return name + " unknown"
	case p.Status == "ok":
		return ""
	default:
		return name + " " + p.Status
	}
}

func ptr(v float64) *float64 { return &v }

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
	case "refusals":
		// The refusals run has no audit of its own (refusals_audit follows it); what it
		// must show is that nothing was sold.
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
	if t.Unit == "ms" || t.Unit == "MB" {
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

func (r *Report) printLines(w io.Writer, resultsPath, mdPath string) {
	fmt.Fprintf(w, "bench: raw results in %s", resultsPath)
	if mdPath != "" {
		fmt.Fprintf(w, ", %s rewritten between its make bench markers", mdPath)
	}
	fmt.Fprintln(w, "; tool outputs in var/bench/")
	for _, p := range r.Parts {
		if p.Status != "ok" {
			fmt.Fprintf(w, "part %s: %s (%s)\n", p.Name, strings.ToUpper(p.Status), p.Why)
		}
	}
	for _, a := range r.Audits {
		v := "ok"
		if !a.OK {
			v = "FAILED"
		}
		fmt.Fprintf(w, "audit %s: %s (%s)\n", a.Part, v, a.Summary)
	}
	for _, t := range r.Targets {
		if t.Detail != "" || t.Problem != "" {
			fmt.Fprintf(w, "figure %s: %s\n", t.Name, strings.Trim(t.Detail+"; "+t.Problem, "; "))
		}
	}
	for _, t := range r.Targets {
		fmt.Fprintln(w, t.Line())
	}
}

// readProfiles reads the pprof -top texts in dir.
func readProfiles(dir string) []Profile {
	names, _ := filepath.Glob(filepath.Join(dir, "*.txt"))
	sort.Strings(names)
	var out []Profile
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			continue
		}
		out = append(out, Profile{Name: strings.TrimSuffix(filepath.Base(n), ".txt"), Path: filepath.ToSlash(n), Top: topRows(string(b), 10)})
	}
	return out
}

// topRows is the header and first n rows of a pprof -top table.
func topRows(s string, n int) []string {
	var out []string
	in := false
	for line := range strings.Lines(s) {
		line = strings.TrimRight(line, "\r\n")
		if !in {
			if strings.Contains(line, "flat%") && strings.Contains(line, "cum%") {
				in = true
				out = append(out, line)
			}
			continue
		}
		if len(out) > n || strings.TrimSpace(line) == "" {
			break
		}
		out = append(out, line)
	}
	return out
}

// ---------------------------------------------------------------------------------------------
// numbers

// num renders a count with thousands separators: 1234567 → "1,234,567".
func num(v float64) string {
	neg := v < 0
	s := strconv.FormatFloat(math.Abs(math.Round(v)), 'f', 0, 64)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// numf is num for rates: whole above 100, one decimal below.
func numf(v float64) string {
	if math.Abs(v) >= 100 {
		return num(v)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

func trimFloat(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

func ms(us int64) string { return strconv.FormatFloat(float64(us)/1000, 'f', 2, 64) + " ms" }

// ---------------------------------------------------------------------------------------------
// BENCHMARKS.md

// replaceSection puts section between the markers of doc, replacing what was
// there; everything outside them stays byte for byte. Without markers it
// inserts them (with the section) before the first "## " heading, below the
// title and its introduction, or at the end when there is none. One marker
// alone, markers out of order or twice are errors: the file was edited by
// hand and a person should look.
func replaceSection(doc, section string) (string, error) {
	block := beginMarker + "\n" + strings.TrimRight(section, "\n") + "\n" + endMarker
	nb, ne := strings.Count(doc, beginMarker), strings.Count(doc, endMarker)
	switch {
	case nb == 1 && ne == 1:
		b := strings.Index(doc, beginMarker)
		e := strings.Index(doc, endMarker)
		if e < b {
			return "", errors.New("the make bench end marker comes before its begin marker")
		}
		return doc[:b] + block + doc[e+len(endMarker):], nil
	case nb == 0 && ne == 0:
	default:
		return "", fmt.Errorf("want one %q and one %q, found %d and %d", beginMarker, endMarker, nb, ne)
	}
	// Insert before the first second-level heading (outside a code fence).
	off, fenced := 0, false
	for line := range strings.Lines(doc) {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "```") {
			fenced = !fenced
		}
		if !fenced && strings.HasPrefix(line, "## ") {
			return doc[:off] + block + "\n\n" + doc[off:], nil
		}
		off += len(line)
	}
	if doc != "" && !strings.HasSuffix(doc, "\n") {
		doc += "\n"
	}
	if doc != "" {
		doc += "\n"
	}
	return doc + block + "\n", nil
}

// markdown is the generated section.
func (r *Report) markdown(resultsPath string) string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	date := r.Date
	if t, err := time.Parse(time.RFC3339, r.Date); err == nil {
		date = t.UTC().Format("2006-01-02 15:04 UTC")
	}
	w("## `make bench`: flashgate against its yardsticks, one run\n\n")
	w("<!-- Generated by `make bench` (scripts/bench.sh, bench/report): everything between the make bench markers is rewritten by the next run. -->\n\n")
	m := r.Machine
	w("%s · `make bench` · %d cores (%s), %s, Linux %s, %s", date, m.Cores, orDash(m.CPUModel), orDash(m.MemTotal), orDash(m.Kernel), m.GoVersion)
	if r.Run != nil {
		if r.Run.LoadavgStart != "" {
			w("; load average %s before, %s after", r.Run.LoadavgStart, r.Run.LoadavgEnd)
		}
		if r.ElapsedS > 0 {
			w("; the whole run took %s", (time.Duration(r.ElapsedS) * time.Second).String())
		}
	}
	w(". Everything runs on this one machine at once: the load tool, nginx, the gateway, the backend, Redis, NATS and MariaDB. ")
	w("Raw results: `%s` (and `var/bench/`, not committed).\n\n", filepath.ToSlash(resultsPath))
	if r.Run != nil {
		var s map[string]any
		_ = json.Unmarshal(r.Run.Settings, &s)
		w("Every HTTP load is `bin/flashgate bench` with the same settings: %v for each run, %v requests in flight, %v users (one JWT each; each user its own X-Forwarded-For address). ",
			s["duration"], s["concurrency"], numAny(s["users"]))
		w("The flashgate runs go to a gateway of the bench's own with its rate limits off (`%s`), with the stack's backend behind it (%s).\n\n", r.Run.Gateway, r.Run.Stack)
	}

	w("| target | measured | goal | |\n|---|---:|---|---|\n")
	for _, t := range r.Targets {
		v := "missed"
		if t.Met {
			v = "**met**"
		}
		fig := t.figure()
		if t.Detail != "" {
			fig += " (" + t.Detail + ")"
		}
		if t.Problem != "" {
			fig += " — " + t.Problem
		}
		w("| `%s`: %s | %s | %s | %s |\n", t.Name, t.What, fig, strings.NewReplacer(">=", "≥", "<=", "≤").Replace(t.Goal), v)
	}
	w("\n")

	w("| part | figure | details |\n|---|---:|---|\n")
	for _, p := range r.Parts {
		fig, det := r.describe(p.Name)
		if p.Status != "ok" {
			det = "**" + strings.ToUpper(p.Status) + "**: " + p.Why + ". " + det
		}
		w("| `%s` | %s | %s |\n", p.Name, fig, det)
	}
	w("\n")

	if len(r.Audits) > 0 {
		w("Audits (DESIGN.md §2's invariants, read back from MySQL and Redis after each flashgate run):\n\n")
		for _, a := range r.Audits {
			v := "ok"
			if !a.OK {
				v = "**FAILED**"
			}
			w("- `%s`: %s — %s\n", a.Part, v, a.Summary)
		}
		w("\n")
	}

	if len(r.Profiles) > 0 {
		w("Profiles (`go tool pprof -top -nodecount=25`; the `.pprof` files stay in `var/bench/profiles/`): ")
		for i, p := range r.Profiles {
			if i > 0 {
				w(", ")
			}
			w("[%s](%s)", p.Name, p.Path)
		}
		w(".")
		for _, p := range r.Profiles {
			if p.Name == "gateway-cpu" && len(p.Top) > 1 {
				w(" The bench gateway's CPU during `purchases`, top entries:\n\n```\n%s\n```\n", strings.Join(p.Top, "\n"))
			}
		}
		w("\n")
	}

	w("The commands, in the order they ran (`scripts/bench.sh`):\n\n```\n")
	if r.Run != nil && r.Run.Gateway != "" {
		w("# the bench gateway (started before purchases, stopped after rss_10k)\n%s &\n", r.Run.Gateway)
	}
	for _, p := range r.Parts {
		if len(p.Commands) == 0 {
			continue
		}
		w("# %s\n", p.Name)
		for _, c := range p.Commands {
			w("%s\n", c)
		}
	}
	w("```\n")
	return b.String()
}

func orDash(s string) string {
	if s == "" {
		return "?"
	}
	return s
}

func numAny(v any) string {
	if f, ok := v.(float64); ok {
		return num(f)
	}
	return fmt.Sprint(v)
}

// describe is a part's figure and details for the parts table.
func (r *Report) describe(name string) (fig, det string) {
	lat := func(b *benchResult) string {
		s := fmt.Sprintf("latency p50 %s, p99 %s", ms(b.Load.Latency.P50), ms(b.Load.Latency.P99))
		if b.Load.AcceptedLatency.Count > 0 {
			s += fmt.Sprintf("; 202s p50 %s, p99 %s, p999 %s", ms(b.Load.AcceptedLatency.P50), ms(b.Load.AcceptedLatency.P99), ms(b.Load.AcceptedLatency.P999))
		}
		return s
	}
	load := func(b *benchResult) string {
		return fmt.Sprintf("%s requests in %.2f s (%s req/s): %s; %s", num(float64(b.Load.Requests)), b.Load.ElapsedS,
			num(b.Load.Throughput), b.statuses(), lat(b))
	}
	switch name {
	case "redis_evalsha":
		if x := r.redis; x != nil {
			return num(x.RPSP1) + " calls/s",
				fmt.Sprintf("redis-benchmark EVALSHA lua/admit.lua, %d clients, %s calls per run, %d threads: unpipelined %s/s, -P %d %s/s; %.2f%% of the calls admitted",
					x.Clients, num(float64(x.Requests)), x.Threads, num(x.RPSP1), x.Pipeline, num(x.RPSP16), 100*x.AdmittedFraction)
		}
	case "seeds_sync":
		if x := r.seeds; x != nil {
			return num(x.OrdersPerS) + " orders/s",
				fmt.Sprintf("%s orders in MySQL in %.2f s, %s req/s (%s requests, %s 202s, transport errors %d); 202s p50 %.2f ms, p99 %.2f ms",
					num(float64(x.OrdersInDB)), x.ElapsedS, num(x.ReqPerS), num(float64(x.Requests)), num(float64(x.Accepted)), x.TransportErrors, x.P50MS, x.P99MS)
		}
	case "nginx_fixed":
		if b := r.nginx; b != nil {
			return num(b.perS(409)) + " 409s/s", load(b)
		}
	case "purchases":
		if b := r.bench[name]; b != nil {
			d := load(b)
			if n := b.status(409); n > 0 {
				d += fmt.Sprintf(". **The sale sold out (%s 409s)**: the rate is diluted", num(float64(n)))
			}
			if rq := b.Load.Requests; int64(b.Users) < rq {
				d += fmt.Sprintf(". %s requests for %s users: the repeats met the per-user limit", num(float64(rq)), num(float64(b.Users)))
			}
			return num(b.acceptedPerS()) + " accepted/s", d
		}
	case "sellout":
		if b := r.bench[name]; b != nil {
			return num(float64(b.Load.Accepted)) + " sold", load(b)
		}
	case "refusals":
		if b := r.bench[name]; b != nil {
			return num(b.perS(409)) + " 409s/s", load(b)
		}
	case "refusals_audit":
		if b := r.bench[name]; b != nil {
			return "audit", "the sold-out sale audited after the refusals (" + b.statuses() + ")"
		}
	case "p99_half_peak":
		if b := r.bench[name]; b != nil {
			d := fmt.Sprintf("paced at %s req/s (open loop, latency from each request's due time): ", num(b.Load.Rate)) + load(b)
			if b.Load.SendLag != nil {
				d += fmt.Sprintf("; send lag p50 %s, p99 %s", ms(b.Load.SendLag.P50), ms(b.Load.SendLag.P99))
			}
			return "p99 " + ms(b.Load.AcceptedLatency.P99), d
		}
	case "backend_ingest":
		if x := r.ingest; x != nil {
			return num(x.OrdersPerS) + " orders/s",
				fmt.Sprintf("%s orders from a pre-filled stream into MySQL in %.2f s (filled in %.2f s); %d batches, %.2f s in them; batch_size %d, batch_wait %g ms, max_ack_pending %d, %d MySQL conns",
					num(float64(x.Orders)), x.ElapsedS, x.FillS, x.Batches, x.BatchBusyS, x.BatchSize, x.BatchWaitMS, x.MaxAckPending, x.MySQLConns)
		}
	case "rss_10k":
		if x := r.conns; x != nil {
			return fmt.Sprintf("%.1f MB", float64(x.After.RSSKB)*1024/1e6),
				fmt.Sprintf("RSS %.1f MiB holding %s idle connections (%.1f MiB before, +%.1f KiB each; peak %.1f MiB; fds %d → %d); MB = 10^6 bytes",
					float64(x.After.RSSKB)/1024, num(float64(x.StillOpen)), float64(x.Before.RSSKB)/1024, x.PerConnKB, float64(x.After.HWMKB)/1024, x.Before.FDs, x.After.FDs)
		}
	}
	return "—", ""
}
