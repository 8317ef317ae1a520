package lua

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/flashgate/flashgate"
)

// keySpellings match a Redis key spelled out: the "fg:" prefix (not the tail
// of a word such as "cfg:"), a sale's hash tag (not a struct literal such as
// "{s: s"), the leader lock's prefix.
var keySpellings = []*regexp.Regexp{
	regexp.MustCompile(`\bfg:`),
	regexp.MustCompile(`\{s:\S`),
	regexp.MustCompile(`flashgate:leader`),
}

// spellsKey reports the first key spelling in text, if any.
func spellsKey(text string) (string, bool) {
	for _, re := range keySpellings {
		if m := re.FindString(text); m != "" {
			return m, true
		}
	}
	return "", false
}

// TestKeysSpelledOnlyHere: no non-test Go or Lua file of the module but
// keys.go spells a key, its prefix or a sale's hash tag (comments included:
// a key written out in a comment goes stale when the layout moves). The
// scripts get every key through KEYS.
func TestKeysSpelledOnlyHere(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root: %v", err)
	}
	self := filepath.Join(root, "lua", "keys.go")
	scanned := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, "_test.go") || (!strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, ".lua")) {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if path == self {
			// The patterns must match the layout's own spelling, or this
			// test could never fail.
			if _, ok := spellsKey(string(b)); !ok {
				t.Errorf("keys.go spells no key the search would find: the patterns are stale")
			}
			return nil
		}
		scanned++
		for i, line := range strings.Split(string(b), "\n") {
			if m, ok := spellsKey(line); ok {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("%s:%d spells a Redis key (%q) outside lua/keys.go: %s", rel, i+1, m, strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if scanned < 50 {
		t.Fatalf("scanned %d files: the walk missed the tree", scanned)
	}
}

// The search finds what it is for and lets alone what it is not.
func TestKeySpellings(t *testing.T) {
	for _, s := range []string{`p := "fg:{s:" + sale`, `"fg:sales:live"`, `-- (fg:node:3)`, `"flashgate:leader"`, `"{s:" + id + "}"`} {
		if _, ok := spellsKey(s); !ok {
			t.Errorf("%s: not found", s)
		}
	}
	for _, s := range []string{`r := &run{cfg: cfg}`, `releaseJob{s: s, id: id}`, `// keys.go spells them`} {
		if m, ok := spellsKey(s); ok {
			t.Errorf("%s: found %q", s, m)
		}
	}
}

// Every key of a sale's layout carries its hash tag (one slot on a Cluster),
// and every one of them is retired.
func TestLayoutTaggedAndRetired(t *testing.T) {
	sale := &flashgate.Sale{ID: "tag1", Regions: map[string]int64{"bj": 1, "sh": 1}}
	k := KeysFor(sale.ID, sale.RegionNames())
	all := AllKeys(sale)
	_, stock := k.StockKeys()
	layout := append([]string{k.Meta, k.Users, k.Resv, k.Orders, k.Idem, k.Warming, k.Restocked(), k.Epoch, k.stock}, stock...)
	for _, key := range append(slices.Clone(layout), k.Limit(flashgate.PerSale)) {
		if !strings.Contains(key, SaleTag(sale.ID)) {
			t.Errorf("%s lacks the sale's hash tag %s", key, SaleTag(sale.ID))
		}
	}
	for _, key := range layout {
		if !slices.Contains(all, key) {
			t.Errorf("AllKeys lacks %s", key)
		}
	}
	// Every fixed key of the layout is listed (a key added through add is
	// retired), once.
	for _, key := range k.fixed {
		if n := len(slices.DeleteFunc(slices.Clone(all), func(s string) bool { return s != key })); n != 1 {
			t.Errorf("AllKeys lists %s %d times", key, n)
		}
	}
	if len(k.fixed) != 9 {
		t.Errorf("layout has %d fixed keys, this test knows 9: add the new one to layout above", len(k.fixed))
	}
	if got := NodeLease(7); got != NodeLeasePrefix+"7" {
		t.Errorf("NodeLease(7) = %s", got)
	}
	if got := LeaderLock("c1"); got != LeaderLockPrefix+":0:c1" {
		t.Errorf("LeaderLock = %s", got)
	}
}

// TestStockKeysOrder: StockKeys answers the regions in name order, each with
// its own key, on every call (a retry pairs values with regions by position).
func TestStockKeysOrder(t *testing.T) {
	k := BucketedKeysFor("order", []string{"sh", "gz", "bj"}, []string{"0", "1"})
	for _, keys := range append([]*Keys{k}, k.Buckets()...) {
		for range 20 {
			regions, stock := keys.StockKeys()
			if !slices.Equal(regions, []string{"bj", "gz", "sh"}) {
				t.Fatalf("regions %v, want bj gz sh", regions)
			}
			for i, r := range regions {
				if want, _ := keys.Stock(r); stock[i] != want {
					t.Fatalf("key %d is %s, want %s (region %s)", i, stock[i], want, r)
				}
			}
		}
	}
}
