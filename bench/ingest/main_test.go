package main

import (
	"os"
	"path/filepath"
	"testing"
)

// Without --backend-bin the backend runs from a flashgate found on the PATH
// when none is built beside this program (a test binary has none beside it);
// with none anywhere the run is refused before it touches a server.
func TestFindFlashgate(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("PATH", dir)
	if p, err := findFlashgate(); err == nil {
		t.Fatalf("found %s in an empty PATH", p)
	}
	bin := filepath.Join(dir, "flashgate")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if p, err := findFlashgate(); err != nil || p != bin {
		t.Fatalf("findFlashgate() = %q, %v; want %s", p, err, bin)
	}
}
