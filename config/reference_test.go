package config

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// TestReferenceIsCurrent: docs/config.md is what config.go says now (run
// `go generate ./config` after changing a key, a default or its comment), and
// it documents every key of the configuration, each with its variable.
func TestReferenceIsCurrent(t *testing.T) {
	src, err := os.ReadFile("config.go")
	if err != nil {
		t.Fatal(err)
	}
	want, err := Reference(src)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("docs/config.md is not current: run `go generate ./config` and commit it")
	}
	// Every variable Environ knows is a row of the reference.
	n := 0
	for _, kv := range Environ(Default()) {
		name, _, _ := strings.Cut(kv, "=")
		if !bytes.Contains(got, []byte("`"+name+"`")) {
			t.Errorf("docs/config.md does not name %s", name)
		}
		n++
	}
	if n < 50 {
		t.Fatalf("only %d keys: Environ changed?", n)
	}
	// A key with no comment of its own would be a row that says nothing.
	for _, line := range strings.Split(string(got), "\n") {
		if strings.HasPrefix(line, "| `") && strings.HasSuffix(line, "|  |") {
			t.Errorf("a key without a comment in config.go: %s", line)
		}
	}
	t.Logf("%d keys documented", n)
}
