package loadgen

import (
	"os"
	"path/filepath"
	"testing"
)

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
