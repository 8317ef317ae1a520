package cli

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCommand(t *testing.T) {
	var errOut bytes.Buffer
	c := NewCommand("flashgate-bench-x", "[--n N]", &errOut)
	n := c.Int("n", 1, "a number")
	pos, err := c.ParseAll([]string{"a", "--n", "3", "b", "--config", "x.yaml"})
	if err != nil || *n != 3 || c.ConfigPath != "x.yaml" || strings.Join(pos, ",") != "a,b" {
		t.Fatalf("pos %q n %d config %q: %v", pos, *n, c.ConfigPath, err)
	}
	var code ExitCode
	if _, err := c.ParseAll([]string{"--nope"}); !errors.As(err, &code) || code != 2 {
		t.Fatalf("unknown flag: %v", err)
	}
	errOut.Reset()
	if err := c.UsageError("bad %d", 7); !errors.As(err, &code) || code != 2 ||
		!strings.HasPrefix(errOut.String(), "flashgate-bench-x: bad 7\n\nusage: flashgate-bench-x [--n N]") {
		t.Fatalf("usage error: %v %q", err, errOut.String())
	}
}

func TestWriteJSON(t *testing.T) {
	if err := WriteJSON("", map[string]int{"a": 1}); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "r.json")
	if err := WriteJSON(p, map[string]int{"a": 1}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil || string(b) != "{\n  \"a\": 1\n}\n" {
		t.Fatalf("%q %v", b, err)
	}
	if _, err := os.Stat(p + ".tmp"); !os.IsNotExist(err) {
		t.Fatalf("temporary file left: %v", err)
	}
	if err := WriteJSON(filepath.Join(t.TempDir(), "no", "such", "dir.json"), 1); err == nil {
		t.Fatal("wrote into a directory that does not exist")
	}
}
