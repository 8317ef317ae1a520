package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// What the bench tools and scripts leave in var/bench, and how the report
// reads it: the raw results are kept whole; only the fields read are typed.

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

// ingestResult is `flashgate-bench-ingest --json` (bench/ingest).
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

// connsResult is `flashgate-bench-conns --json` (bench/conns).
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
		if c, err := readCPU(filepath.Join(dir, name+".cpu")); err == nil {
			p.cpu = c
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil, err
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
