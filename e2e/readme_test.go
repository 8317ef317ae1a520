package e2e

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestREADMEByHand runs the README's by-hand block (between its by-hand
// markers) with bash, as written, in a copy of the repository, as a new
// operator would on a fresh machine: no FLASHGATE_* variable in the
// environment, nothing but the block's own commands. It must take the stack
// from nothing to a purchase through nginx with curl and down again. The only
// thing the test chooses is STACK_PORT_OFFSET, so that the stack it starts
// stands beside the one `make test` runs; the block reads every address from
// var/secrets.env, so it is the same on the default ports.
func TestREADMEByHand(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	block := byHandBlock(t, string(readme))

	// A copy of the repository: the block's make up and var/ are its own.
	repo := filepath.Join(t.TempDir(), "flashgate")
	copyRepo(t, "..", repo)
	offset := freeOffset(t)
	env := []string{
		"PATH=" + filepath.Join(runtime.GOROOT(), "bin") + string(os.PathListSeparator) + os.Getenv("PATH"),
		"HOME=" + os.Getenv("HOME"), "LANG=C.UTF-8", "STACK_PORT_OFFSET=" + strconv.Itoa(offset),
	}
	for _, k := range []string{"GOPATH", "GOMODCACHE", "GOCACHE", "GOFLAGS", "GOPROXY", "TMPDIR"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	t.Cleanup(func() {
		// If the block stopped half-way, its stack must not outlive the test.
		down := exec.Command("scripts/stack.sh", "down")
		down.Dir, down.Env = repo, env
		if out, err := down.CombinedOutput(); err != nil {
			t.Logf("stack down: %v\n%s", err, out)
		}
	})
	script := "set -euo pipefail\nset -x\n" + block
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir, cmd.Env = repo, env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err = cmd.Run()
	took := time.Since(start).Round(time.Second)
	log := out.String()
	if err != nil {
		t.Fatalf("the README's by-hand block failed after %v: %v\n%s", took, err, tail(log, 80))
	}
	for _, want := range []string{
		`"code":"accepted"`, // the purchase through nginx
		`"sale_id":"phone"`, // the order, read back
		`"invariant3"`,      // sale show: the ledger
		"go1.",              // flashgate version
	} {
		if !strings.Contains(log, want) {
			t.Errorf("the block's output lacks %s:\n%s", want, tail(log, 80))
		}
	}
	// make down stopped everything: nginx's port is free again.
	if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", 8000+offset), time.Second); err == nil {
		c.Close()
		t.Errorf("nginx still answers on %d after make down", 8000+offset)
	}
	t.Logf("README by hand: make up → sale create → curl purchase 202 → curl order → sale show → make down: ok in %v (STACK_PORT_OFFSET=%d)", took, offset)
}

// byHandBlock is the fenced block between the README's by-hand markers.
func byHandBlock(t *testing.T, readme string) string {
	t.Helper()
	_, rest, ok := strings.Cut(readme, "<!-- by-hand:begin")
	if !ok {
		t.Fatal("README.md has no <!-- by-hand:begin marker")
	}
	rest, _, ok = strings.Cut(rest, "<!-- by-hand:end -->")
	if !ok {
		t.Fatal("README.md has no <!-- by-hand:end --> marker")
	}
	_, code, ok := strings.Cut(rest, "```sh\n")
	if !ok {
		t.Fatal("no ```sh block between the by-hand markers")
	}
	code, _, ok = strings.Cut(code, "```")
	if !ok || !strings.Contains(code, "make up") || !strings.Contains(code, "curl ") {
		t.Fatalf("the by-hand block is not a walkthrough:\n%s", code)
	}
	return code
}

// copyRepo copies the repository's files (tracked, and new ones git does not
// ignore) to dst.
func copyRepo(t *testing.T, src, dst string) {
	t.Helper()
	out, err := exec.Command("git", "-C", src, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	for _, f := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		fi, err := os.Lstat(filepath.Join(src, f))
		if err != nil || !fi.Mode().IsRegular() {
			continue // deleted in the work tree, or not a file
		}
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dst, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, f), b, fi.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
}

// freeOffset is a STACK_PORT_OFFSET whose every port is free: nginx,
// gateway, admin ports, Redis, the Cluster and its bus, NATS, MariaDB.
func freeOffset(t *testing.T) int {
	t.Helper()
	base := []int{8000, 8080, 8081, 8082, 16379, 17001, 17002, 17003, 27001, 27002, 27003, 14222, 18222, 13306}
	for _, off := range []int{2300, 2700, 3100, 3900, 4300, 4700} {
		free := true
		for _, p := range base {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+off))
			if err != nil {
				free = false
				break
			}
			ln.Close()
		}
		if free {
			return off
		}
	}
	t.Fatal("no free STACK_PORT_OFFSET among those tried")
	return 0
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
