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
	"strconv"
	"strings"
)

// The parts, in the order the script runs them.
var partNames = []string{
	"seeds_sync", "redis_evalsha", "purchases", "sellout", "nginx_fixed", "refusals",
	"refusals_audit", "refusals_nginx", "p99_half_peak", "nginx_half_peak", "backend_ingest", "rss_10k",
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
	rep.redactAll()

	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // ">= 0.6", not "\u003e= 0.6"
	enc.SetIndent("", "  ")
	if err := enc.Encode(rep); err != nil {
		return 1, err
	}
	if err := writeFile(resultsPath, []byte(redact(buf.String()))); err != nil {
		return 1, err
	}
	if mdPath != "" {
		doc, err := os.ReadFile(mdPath)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return 1, err
		}
		out, err := replaceSection(string(doc), redact(rep.markdown(resultsPath)))
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
