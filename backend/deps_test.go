package backend

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBackendDoesNotDial: the backend is handed dialed clients and its own
// options; no file of the package dials a server or reads the whole
// configuration (the CLI and internal/wire do).
func TestBackendDoesNotDial(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	forbidden := []string{"rueidis.NewClient", "rueidislock.NewLocker", "nats.Connect(", "bus.Connect(", "jetstream.New(",
		"mysql.OpenDB", "sql.Open(", "config.Config", "config.Load(", "dial."}
	checked := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, s := range forbidden {
			if strings.Contains(string(b), s) {
				t.Errorf("%s contains %q", f, s)
			}
		}
	}
	if checked < 10 {
		t.Fatalf("checked %d files: not the backend's directory?", checked)
	}
}
