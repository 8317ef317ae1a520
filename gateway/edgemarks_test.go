package gateway

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func markFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// TestEdgeMarksFollowTheSecond: a sold-out sale has the marks of this second and the next; a tick
// in a later second drops the past ones; a sale no longer sold out has none; marks a stopped
// gateway left are removed by the next one's start, and only the past ones.
func TestEdgeMarksFollowTheSecond(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "marks")
	m := newEdgeMarks(dir)
	t0 := time.Unix(1_800_000_000, 200e6)
	if err := m.prepare(t0); err != nil {
		t.Fatal(err)
	}
	m.set("s1", true, t0)
	if got, want := markFiles(t, dir), []string{"s1.1800000000", "s1.1800000001"}; !slices.Equal(got, want) {
		t.Fatalf("marks at %v: %v, want %v", t0, got, want)
	}
	m.set("s1", true, t0.Add(time.Second))
	if got, want := markFiles(t, dir), []string{"s1.1800000001", "s1.1800000002"}; !slices.Equal(got, want) {
		t.Fatalf("marks a second later: %v, want %v", got, want)
	}
	m.set("s1", false, t0.Add(time.Second))
	if got := markFiles(t, dir); len(got) != 0 {
		t.Fatalf("marks of a sale no longer sold out: %v", got)
	}
	// Another gateway's marks, one lapsed and one current; and a restock heard here removes the
	// current one even though this gateway did not write it.
	for _, n := range []string{"s2.1799999990", "s2.1800000005", "s3.1800000005"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.prepare(time.Unix(1_800_000_005, 0)); err != nil {
		t.Fatal(err)
	}
	if got, want := markFiles(t, dir), []string{"s2.1800000005", "s3.1800000005"}; !slices.Equal(got, want) {
		t.Fatalf("after a start: %v, want %v", got, want)
	}
	m.clear("s2", time.Unix(1_800_000_005, 0))
	if got, want := markFiles(t, dir), []string{"s3.1800000005"}; !slices.Equal(got, want) {
		t.Fatalf("after a restock of s2: %v, want %v", got, want)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("marks directory: %v %v, want 0755 (an nginx worker of another user reads it)", fi, err)
	}
}
