package roles

import (
	"path"
	"strconv"
	"testing"
)

// TestNumberGlobs: the globs of a range match exactly its numbers (Go's
// path.Match reads [a-b] and * as Redis's glob does), with no leading zeros.
func TestNumberGlobs(t *testing.T) {
	for _, r := range [][2]int{{0, 1007}, {0, 0}, {5, 5}, {0, 9}, {3, 17}, {10, 99}, {17, 503}, {504, 1007}, {100, 199}, {99, 1000}, {250, 251}, {1000, 1007}} {
		globs := NumberGlobs(r[0], r[1])
		for n := 0; n <= 1100; n++ {
			s := strconv.Itoa(n)
			hit := false
			for _, g := range globs {
				if ok, err := path.Match(g, s); err != nil {
					t.Fatalf("%v: glob %q: %v", r, g, err)
				} else if ok {
					hit = true
				}
			}
			if want := n >= r[0] && n <= r[1]; hit != want {
				t.Errorf("%d-%d (globs %q): %d matched %v, want %v", r[0], r[1], globs, n, hit, want)
			}
		}
		for _, s := range []string{"00", "01", "007", ""} {
			for _, g := range globs {
				if ok, _ := path.Match(g, s); ok {
					t.Errorf("%v: glob %q matches %q", r, g, s)
				}
			}
		}
	}
	if g := NumberGlobs(0, 1007); len(g) != 4 {
		t.Errorf("0-1007: %q, want 4 globs", g)
	}
}
