package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
)

// Part is one measurement as the script left it.
type Part struct {
	Name     string          `json:"name"`
	Status   string          `json:"status"` // ok, failed, skipped, missing
	ExitCode *int            `json:"exit_code,omitempty"`
	Why      string          `json:"why,omitempty"`
	Commands []string        `json:"commands,omitempty"`
	Result   json.RawMessage `json:"result,omitempty"`
	// CPU is the chain's CPU per answer during the part (issue 13), when measured.
	CPU *CPUUse `json:"cpu,omitempty"`
	cpu *cpuRaw
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
	// issue 13
	CPUPerPurchaseUS        *float64 `json:"cpu_us_per_purchase"`
	GatewayCPUPerPurchaseUS *float64 `json:"gateway_cpu_us_per_purchase"`
	RefusalsNginxPerS       *float64 `json:"refusals_via_nginx_per_s"`
	NginxHalfPeakP99MS      *float64 `json:"nginx_half_peak_p99_ms"`
	cpuDetail               string
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

// redactAll removes secrets from the strings the report copies from the run
// (commands, the gateway's command line); run redacts the written files again.
func (r *Report) redactAll() {
	if r.Run != nil {
		r.Run.Gateway = redact(r.Run.Gateway)
		r.Run.Stack = redact(r.Run.Stack)
	}
	for i := range r.Parts {
		for j, c := range r.Parts[i].Commands {
			r.Parts[i].Commands[j] = redact(c)
		}
		r.Parts[i].Why = redact(r.Parts[i].Why)
	}
	for i, p := range r.Problems {
		r.Problems[i] = redact(p)
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
