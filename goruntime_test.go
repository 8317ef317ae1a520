package flashgate_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// sysmonQuiet is the GODEBUG setting that keeps the Go runtime's monitor out of
// its 20 µs wake-ups at moderate rates (scripts/goruntime.sh, docs/runbook.md).
const sysmonQuiet = "schedtrace=2147483647"

// TestGoRuntimeSettingEverywhere: every script that starts a gateway, a
// backend, nats-server or the load tool sources scripts/goruntime.sh, and every
// systemd unit sets the same.
func TestGoRuntimeSettingEverywhere(t *testing.T) {
	sourced := regexp.MustCompile(`(?m)^\. "\$ROOT/scripts/goruntime\.sh"$`)
	starts := regexp.MustCompile(`\b(gateway|backend|bench) --config\b|\bnats-server -c\b`)
	scripts, _ := filepath.Glob("scripts/*.sh")
	n := 0
	for _, f := range scripts {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !starts.Match(b) {
			continue
		}
		n++
		if !sourced.Match(b) {
			t.Errorf("%s starts Go processes and does not source scripts/goruntime.sh", f)
		}
	}
	if n < 4 {
		t.Errorf("%d scripts start Go processes, want at least scripts/stack.sh, bench.sh, bench-cpu.sh, bench-edge.sh", n)
	}
	units, _ := filepath.Glob("deploy/systemd/flashgate-*.service")
	if len(units) < 2 {
		t.Fatalf("deploy/systemd: %d flashgate units, want the gateway's and the backend's", len(units))
	}
	for _, u := range units {
		b, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "\nEnvironment=GODEBUG="+sysmonQuiet+"\n") {
			t.Errorf("%s has no Environment=GODEBUG=%s", u, sysmonQuiet)
		}
	}
}

// TestGoRuntimeSettingKeepsTheCallers: scripts/goruntime.sh adds its setting in
// front of the caller's GODEBUG (the runtime takes the last of a key), and
// leaves a schedtrace the caller chose alone.
func TestGoRuntimeSettingKeepsTheCallers(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", sysmonQuiet},
		{"madvdontneed=1", sysmonQuiet + ",madvdontneed=1"},
		{"schedtrace=1000", "schedtrace=1000"},
		{"gctrace=1,schedtrace=500", "gctrace=1,schedtrace=500"},
	} {
		cmd := exec.Command("bash", "-c", `. scripts/goruntime.sh && printf %s "$GODEBUG"`)
		cmd.Env = append(os.Environ(), "GODEBUG="+c.in)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("GODEBUG=%q: %v: %s", c.in, err, out)
		}
		if string(out) != c.want {
			t.Errorf("GODEBUG=%q: got %q, want %q", c.in, out, c.want)
		}
	}
}
