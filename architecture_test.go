package flashgate_test

import (
	"encoding/json"
	"io"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// rooms are the module's packages by layer (docs/architecture.md). A package
// may import only packages of a lower layer, plus the few same-layer edges in
// sideways; the tools at the top may import anything, and nothing of the
// product imports them. A new package must be given a room here and in the
// doc, or this test fails.
var rooms = map[string]int{
	"":              0, // the domain: sales, orders, limits, codes
	"config":        1,
	"api":           1, // the HTTP contract (api/openapi.yaml), served by both admin ports
	"internal/tick": 1, // the processes' periodic passes
	"internal/clip": 1, // outside bytes quoted, bounded, for logs and headers

	// one package per dependency, each adapting it to the domain
	"auth": 2, "orderid": 2, "lua": 2, "bus": 2, "mysql": 2, "metrics": 2, "ratelimit": 2,
	"metrics/metricstest": 2,

	"audit":         3, // reads MySQL and Redis through the store and the scripts
	"history":       3, // checks a client history against the state at rest (no I/O)
	"internal/dial": 3, // dials MySQL, Redis, NATS and the leader lock as the processes want them
	"roles":         3, // each role's Redis ACL, NATS permissions and MySQL grants, rendered

	"gateway": 4, "backend": 4, // the two processes; neither imports the other
	// the clients the CLI wraps: the admin API's, and the load tool behind
	// `flashgate bench` and `flashgate demo`
	"adminapi": 4, "loadgen": 4,

	"cmd/flashgate": 5, "internal/wire": 5, // wiring and the CLI

	// tools and tests: load, benchmarks, harnesses
	"internal/testenv": 6, "internal/authstack": 6, "internal/eventcheck": 6, "chaos": 6, "e2e": 6, "nginx": 6,
	"bench/conns": 6, "bench/hostile": 6, "bench/ingest": 6, "bench/internal/cli": 6,
	"bench/report": 6, "bench/seedsync": 6,
}

// sideways are the allowed imports within one layer.
var sideways = map[[2]string]bool{
	{"orderid", "lua"}:                 true, // the node lease key comes from the key layout
	{"metrics/metricstest", "metrics"}: true,
	{"cmd/flashgate", "internal/wire"}: true, // the CLI starts processes through the wiring tests share
}

// io is what the domain must never depend on, even indirectly.
var ioPrefixes = []string{
	"net/http", "database/sql", "os/exec", "github.com/redis/", "github.com/nats-io/",
	"github.com/valyala/", "github.com/go-sql-driver/", "github.com/pressly/",
}

const module = "github.com/flashgate/flashgate"

type listed struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

func goList(t *testing.T, args ...string) []listed {
	t.Helper()
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), append([]string{"list", "-json"}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pkgs []listed
	dec := json.NewDecoder(out)
	for {
		var p listed
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("go list: %v", err)
	}
	return pkgs
}

func room(path string) (string, bool) {
	if path == module {
		return "", true
	}
	rel, ok := strings.CutPrefix(path, module+"/")
	return rel, ok
}

// TestDomainHasNoIO: the domain package's whole dependency closure holds no
// network, database or broker package and no other package of this module.
func TestDomainHasNoIO(t *testing.T) {
	for _, p := range goList(t, "-deps", module) {
		if p.ImportPath == module {
			continue
		}
		if _, ours := room(p.ImportPath); ours {
			t.Errorf("the domain depends on %s", p.ImportPath)
		}
		for _, io := range ioPrefixes {
			if p.ImportPath == strings.TrimSuffix(io, "/") || strings.HasPrefix(p.ImportPath, io) {
				t.Errorf("the domain depends on %s (I/O)", p.ImportPath)
			}
		}
	}
}

// TestImportDirection: every import between the module's packages goes down
// the layers (or along an allowed sideways edge), so no room reaches up into
// the one that uses it.
func TestImportDirection(t *testing.T) {
	for _, p := range goList(t, module+"/...") {
		from, _ := room(p.ImportPath)
		layer, known := rooms[from]
		if !known {
			t.Errorf("package %q has no room: add it to rooms and to docs/architecture.md", from)
			continue
		}
		for _, imp := range p.Imports {
			to, ours := room(imp)
			if !ours {
				continue
			}
			other, known := rooms[to]
			switch {
			case !known:
				// reported as a package of its own
			case layer == 6:
				// tools may use anything
			case other < layer, sideways[[2]string{from, to}]:
			default:
				t.Errorf("%s (layer %d) imports %s (layer %d): imports go down the layers", nameOf(from), layer, nameOf(to), other)
			}
		}
	}
}

func nameOf(rel string) string {
	if rel == "" {
		return "the domain"
	}
	return rel
}
