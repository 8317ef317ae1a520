package backend

import (
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestVendoredUPlot: the uPlot embedded in the binary is the one
// scripts/vendor-uplot.sh pins: every file SHA256SUMS lists is embedded with
// that digest, the script and the sums name the same version, the script is
// that version's, and its license travels with it.
func TestVendoredUPlot(t *testing.T) {
	sums, err := fs.ReadFile(uiFiles, "ui/vendor/uplot/SHA256SUMS")
	if err != nil {
		t.Fatalf("SHA256SUMS not embedded: %v", err)
	}
	script, err := os.ReadFile(filepath.Join("..", "scripts", "vendor-uplot.sh"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^VERSION=(\S+)$`).FindSubmatch(script)
	if m == nil {
		t.Fatal("scripts/vendor-uplot.sh pins no VERSION")
	}
	version := string(m[1])
	lines := strings.Split(strings.TrimSpace(string(sums)), "\n")
	if !strings.HasPrefix(lines[0], "# uPlot "+version+" ") {
		t.Fatalf("SHA256SUMS is of %q, the script pins %s", lines[0], version)
	}
	want := map[string]bool{"LICENSE": true, "uPlot.iife.min.js": true, "uPlot.min.css": true}
	for _, line := range lines[1:] {
		digest, name, ok := strings.Cut(line, "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q", line)
		}
		b, err := fs.ReadFile(uiFiles, "ui/vendor/uplot/"+name)
		if err != nil {
			t.Fatalf("%s not embedded: %v", name, err)
		}
		if d := sha256.Sum256(b); hex.EncodeToString(d[:]) != digest {
			t.Errorf("%s: sha256 %x, SHA256SUMS says %s (edited by hand? run scripts/vendor-uplot.sh)", name, d, digest)
		}
		if name == "uPlot.iife.min.js" && !strings.Contains(string(b[:min(len(b), 200)]), "(v"+version+")") {
			t.Errorf("uPlot.iife.min.js is not v%s: %q", version, b[:min(len(b), 80)])
		}
		if name == "LICENSE" && !strings.Contains(string(b), "MIT License") {
			t.Errorf("LICENSE is not uPlot's MIT license")
		}
		delete(want, name)
	}
	if len(want) > 0 {
		t.Fatalf("SHA256SUMS lacks %v", want)
	}
}
