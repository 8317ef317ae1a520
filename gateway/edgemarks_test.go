package gateway

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
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

// TestEdgeMarksUntrusted: nginx answers sold_out for any mark it finds, so
// the gateway refuses a marks directory another user could write into, and
// sweeps out marks nginx must not trust: a future second (a planted file
// would stop the sale until then), another user's file, a file others may
// write, a symbolic link. Its own marks of now and the next second stay.
func TestEdgeMarksUntrusted(t *testing.T) {
	now := time.Now()
	sec := now.Unix()
	name := func(sale string, s int64) string { return sale + "." + strconv.FormatInt(s, 10) }

	open := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := newEdgeMarks(open).prepare(now); err == nil {
		t.Error("a world-writable marks directory was accepted")
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(t.TempDir(), link); err != nil {
		t.Fatal(err)
	}
	if err := newEdgeMarks(link).prepare(now); err == nil {
		t.Error("a marks directory that is a symbolic link was accepted")
	}

	dir := filepath.Join(t.TempDir(), "marks")
	m := newEdgeMarks(dir)
	if err := m.prepare(now); err != nil {
		t.Fatal(err)
	}
	write := func(n string, mode os.FileMode) string {
		p := filepath.Join(dir, n)
		if err := os.WriteFile(p, nil, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	m.set("mine", true, now)
	write(name("future", sec+60), 0o644)
	write(name("far", sec+86400*365), 0o644)
	write(name("writable", sec), 0o666)
	if err := os.Symlink("/etc/hostname", filepath.Join(dir, name("symlink", sec))); err != nil {
		t.Fatal(err)
	}
	wantGone := []string{name("far", sec+86400*365), name("future", sec+60), name("symlink", sec), name("writable", sec)}
	if os.Geteuid() == 0 {
		// As root the test can give a file to another user (nobody).
		p := write(name("foreign", sec), 0o644)
		if err := os.Chown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		wantGone = append(wantGone, name("foreign", sec))
		if err := os.Chown(dir, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if err := trustedDir(dir); err == nil {
			t.Error("a marks directory of another user was accepted")
		}
		if err := os.Chown(dir, 0, 0); err != nil {
			t.Fatal(err)
		}
	} else {
		t.Logf("not root: another user's file and directory are not made (the mode cases stand for them)")
	}
	m.sweep(now)
	got := markFiles(t, dir)
	for _, n := range wantGone {
		if slices.Contains(got, n) {
			t.Errorf("untrusted mark %s survived the sweep", n)
		}
	}
	if want := []string{name("mine", sec), name("mine", sec+1)}; !slices.Equal(got, want) {
		t.Errorf("after the sweep: %v, want only %v", got, want)
	}
}
