package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// CPU per answer (issue 13): scripts/bench.sh reads utime + stime of each
// process of the chain from /proc/<pid>/stat right before and right after a
// part and leaves them in var/bench/<part>.cpu:
//
//	clk_tck 100
//	before gateway 1234
//	before redis 567
//	...
//	before at 1732412345.123
//	load gateway 2000 (purchases only: when the load ended, before the drain and the audit)
//	...
//	after gateway 2345
//	...
//	gateway_purchases_before 10 (refusals_nginx only: the gateway's purchase requests)
//
// The report divides each process's CPU by the part's answers (accepted
// purchases, or 409s).

// procOrder is the order the processes are shown in: the request's way.
var procOrder = []string{"nginx", "gateway", "redis", "nats", "backend", "mariadb"}

// CPUUse is one part's CPU per answer.
type CPUUse struct {
	Answers  int64              `json:"answers"`
	Per      string             `json:"per"`     // what an answer is: "accepted purchase", "409"
	Seconds  float64            `json:"seconds"` // wall time between the readings
	Ms       map[string]float64 `json:"cpu_ms"`  // CPU time of each process between the readings
	PerUS    map[string]float64 `json:"cpu_us_per_answer"`
	TotalUS  float64            `json:"total_us_per_answer"` // the chain: every process measured
	GatewayN *int64             `json:"gateway_purchases,omitempty"`
	// The load alone (purchases): from the first reading to the load's end,
	// before the backend's drain and the audit.
	LoadSeconds float64            `json:"load_seconds,omitempty"`
	LoadPerUS   map[string]float64 `json:"load_cpu_us_per_answer,omitempty"`
	LoadTotalUS float64            `json:"load_total_us_per_answer,omitempty"`
}

type cpuRaw struct {
	clkTck              float64
	before, load, after map[string]float64
	gwBefore            *int64
	gwAfter             *int64
}

// readCPU reads var/bench/<part>.cpu (nil when there is none or it is incomplete).
func readCPU(path string) (*cpuRaw, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c := &cpuRaw{clkTck: 100, before: map[string]float64{}, load: map[string]float64{}, after: map[string]float64{}}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 2 && f[0] == "clk_tck":
			if v, err := strconv.ParseFloat(f[1], 64); err == nil && v > 0 {
				c.clkTck = v
			}
		case len(f) == 2 && (f[0] == "gateway_purchases_before" || f[0] == "gateway_purchases_after"):
			if v, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				if f[0] == "gateway_purchases_before" {
					c.gwBefore = &v
				} else {
					c.gwAfter = &v
				}
			}
		case len(f) == 3 && (f[0] == "before" || f[0] == "load" || f[0] == "after"):
			v, err := strconv.ParseFloat(f[2], 64)
			if err != nil {
				return nil, fmt.Errorf("%s: bad line %q", filepath.Base(path), sc.Text())
			}
			map[string]map[string]float64{"before": c.before, "load": c.load, "after": c.after}[f[0]][f[1]] = v
		}
	}
	return c, sc.Err()
}

// use is the CPU per answer, for answers answers.
func (c *cpuRaw) use(answers int64, per string) *CPUUse {
	if c == nil || answers <= 0 {
		return nil
	}
	u := &CPUUse{Answers: answers, Per: per, Ms: map[string]float64{}, PerUS: map[string]float64{}}
	u.Seconds = c.after["at"] - c.before["at"]
	for name, b := range c.before {
		a, ok := c.after[name]
		if name == "at" || !ok {
			continue
		}
		ms := (a - b) / c.clkTck * 1000
		u.Ms[name] = ms
		u.PerUS[name] = ms * 1000 / float64(answers)
		u.TotalUS += u.PerUS[name]
	}
	if len(c.load) > 0 {
		u.LoadPerUS = map[string]float64{}
		u.LoadSeconds = c.load["at"] - c.before["at"]
		for name, b := range c.before {
			if l, ok := c.load[name]; ok && name != "at" {
				u.LoadPerUS[name] = (l - b) / c.clkTck * 1e6 / float64(answers)
				u.LoadTotalUS += u.LoadPerUS[name]
			}
		}
	}
	if c.gwBefore != nil && c.gwAfter != nil {
		n := *c.gwAfter - *c.gwBefore
		u.GatewayN = &n
	}
	if len(u.Ms) == 0 {
		return nil
	}
	return u
}

// procs are the processes of u in procOrder, then any other.
func (u *CPUUse) procs() []string {
	var out []string
	seen := map[string]bool{}
	for _, p := range procOrder {
		if _, ok := u.PerUS[p]; ok {
			out = append(out, p)
			seen[p] = true
		}
	}
	var rest []string
	for p := range u.PerUS {
		if !seen[p] {
			rest = append(rest, p)
		}
	}
	sort.Strings(rest)
	return append(out, rest...)
}

// ---------------------------------------------------------------------------------------------
// secrets

// The bench's commands and settings name the stack's credentials in their
// environment (FLASHGATE_REDIS_PASSWORD=…, a DSN user:password@…): nothing the
// report writes may hold them.
var (
	secretAssign = regexp.MustCompile(`\b([A-Za-z0-9_]*(?i:password|passwd|secret|token|api_key|apikey)[A-Za-z0-9_]*)=("[^"]*"|'[^']*'|[^\s"']+)`)
	dsnPassword  = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://|\b)([A-Za-z0-9_.-]*):([^\s:@/]+)@(tcp\(|unix\(|[A-Za-z0-9.\[\]-]+[:/])`)
	bearerToken  = regexp.MustCompile(`(?i)\b(bearer )[A-Za-z0-9._~+/=-]{8,}`)
)

const redacted = "<redacted>"

// redact removes secrets from s: the values of NAME=value assignments whose
// name says password, secret, token or key; the password of user:password@host
// (a DSN, a URL); a bearer token.
func redact(s string) string {
	s = secretAssign.ReplaceAllString(s, "$1="+redacted)
	s = dsnPassword.ReplaceAllStringFunc(s, func(m string) string {
		g := dsnPassword.FindStringSubmatch(m)
		if g[3] == redacted {
			return m
		}
		return g[1] + g[2] + ":" + redacted + "@" + g[4]
	})
	return bearerToken.ReplaceAllString(s, "${1}"+redacted)
}
