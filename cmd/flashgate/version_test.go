package main

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
)

// TestVersion: `flashgate version` prints the version, the commit (from the
// build's VCS information, else from -ldflags -X main.commit) and Go's version.
func TestVersion(t *testing.T) {
	old := commit
	t.Cleanup(func() { commit = old })
	commit = "0123456789abcdef0123456789abcdef01234567"
	var out bytes.Buffer
	if err := run([]string{"version"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "flashgate ") || !strings.HasPrefix(lines[1], "commit ") ||
		!strings.HasPrefix(lines[2], runtime.Version()+" ") {
		t.Fatalf("version:\n%s", out.String())
	}
	// A test binary has no VCS stamp: the commit is the -X one.
	if b := readBuildInfo(); b.Commit == "" || !strings.Contains(lines[1], b.Commit) {
		t.Fatalf("commit line %q, build info %+v", lines[1], b)
	}
	if err := run([]string{"version", "extra"}, &out, &out); err == nil {
		t.Fatal("version with an argument: no error")
	}
}
