// Package e2e runs the whole funnel — gateway, JetStream, backend, MariaDB — on
// the real servers of the local stack and checks docs/design.md §2's invariants.
package e2e

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/audit"
	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/internal/wire"
	"github.com/flashgate/flashgate/loadgen"
	"github.com/flashgate/flashgate/mysql"
)

var binary string // bin/flashgate built for the tests that run it as a process

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "flashgate-e2e")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "flashgate")
	out, err := exec.Command("go", "build", "-o", binary, "../cmd/flashgate").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build flashgate: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// e2eConfig is the test's own stack configuration. Its timeouts are generous:
// these tests count outcomes under a flood on a small shared machine (with
// -race), and a 503 from a deadline would be right but not what they count.
func e2eConfig(t *testing.T) config.Config {
	cfg := testenv.Config(t)
	cfg.Gateway.AdmitTimeout = 5 * time.Second
	cfg.Gateway.PublishTimeout = 5 * time.Second
	return cfg
}

func startGateway(t *testing.T, cfg config.Config) *wire.Gateway {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g, err := wire.StartGateway(ctx, cfg)
	if err != nil {
		t.Fatalf("gateway: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = g.Shutdown(ctx)
	})
	return g
}

func startBackend(t *testing.T, cfg config.Config) *wire.Backend {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := wire.StartBackend(ctx, cfg)
	if err != nil {
		t.Fatalf("backend: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_ = b.Shutdown(ctx)
	})
	return b
}

// createSale creates a sale through the backend's admin API, as an operator would.
func createSale(t *testing.T, cfg config.Config, adminAddr string, s *flashgate.Sale) {
	t.Helper()
	body, _ := json.Marshal(s)
	req, _ := http.NewRequest("POST", "http://"+adminAddr+"/admin/v1/sales", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+cfg.Admin.Token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("create sale: %v", err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("create sale: %d %s", res.StatusCode, raw)
	}
}

// awaitSale waits until the gateway serves the sale (it learns of it by event).
func awaitSale(t *testing.T, gw *wire.Gateway, id string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		res, err := http.Get("http://" + gw.Addr() + "/v1/sales/" + id)
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("gateway never learnt of sale %s", id)
}

func tokens(t *testing.T, cfg config.Config, prefix string, n int) [][]byte {
	t.Helper()
	out := make([][]byte, n)
	for i := range out {
		tok, err := auth.MintHS256(cfg.Auth.JWTSecret, prefix+strconv.Itoa(i), auth.MintOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out[i] = []byte("Bearer " + tok)
	}
	return out
}

func newSale(total, perUser int64) *flashgate.Sale {
	now := time.Now()
	return &flashgate.Sale{ID: testenv.ID("e2e"), Title: "e2e", PriceCents: 100, Total: total,
		StartsAt: now.Add(-time.Second), EndsAt: now.Add(time.Hour), PerUserLimit: perUser, PerOrderMax: 1}
}

// drain waits until every accepted order is a row and no reservation is open,
// then returns the audit. The wait is for liveness only; nothing is timed.
func drain(t *testing.T, cfg config.Config, sale string, accepted []uint64) audit.Report {
	t.Helper()
	db, err := mysql.OpenDB(cfg.MySQL.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rc := testenv.Redis(t, cfg.Redis.Addrs)
	var rep audit.Report
	deadline := time.Now().Add(60 * time.Second)
	for {
		rep, err = audit.Check(context.Background(), db, rc, sale, accepted)
		if err == nil && rep.Lost == 0 && rep.RedisReserved == 0 {
			// Drained: nothing moves any more. This report read MySQL and Redis
			// at different moments, maybe across the last batch; a second one
			// reads a system at rest.
			if rep, err = audit.Check(context.Background(), db, rc, sale, accepted); err != nil {
				t.Fatal(err)
			}
			return rep
		}
		if time.Now().After(deadline) {
			t.Fatalf("not drained after 60s: %+v (err %v)", rep, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func assertInvariants(t *testing.T, rep audit.Report) {
	t.Helper()
	if !rep.OK() {
		t.Fatalf("invariants broken: %+v", rep)
	}
}

// TestSeedsExperiment is the seeds' experiment: 5,000 concurrent buyers, 20
// units, one per user. Exactly 20 orders for 20 distinct users; Redis stock 0,
// MySQL sold 20 — on standalone Redis and on the Cluster.
func TestSeedsExperiment(t *testing.T) {
	for _, target := range []struct {
		name  string
		addrs []string
	}{{"standalone", testenv.RedisAddrs()}, {"cluster", testenv.ClusterAddrs()}} {
		t.Run(target.name, func(t *testing.T) {
			cfg := e2eConfig(t)
			cfg.Redis.Addrs = target.addrs
			be := startBackend(t, cfg)
			gw := startGateway(t, cfg)
			s := newSale(20, 1)
			createSale(t, cfg, be.AdminAddr(), s)
			awaitSale(t, gw, s.ID)

			const buyers = 5000
			toks := tokens(t, cfg, "buyer", buyers)
			start := time.Now()
			res, err := loadgen.Run(context.Background(), loadgen.Config{
				Target: "http://" + gw.Addr(), Sale: s.ID, Tokens: toks,
				Concurrency: buyers, Requests: buyers,
			})
			if err != nil {
				t.Fatal(err)
			}
			rep := drain(t, cfg, s.ID, res.Accepted)
			t.Logf("%s: %d buyers, %d accepted, %v from first request to drained (load %v)",
				target.name, buyers, len(res.Accepted), time.Since(start).Round(time.Millisecond), res.Elapsed.Round(time.Millisecond))
			if res.Errors != 0 {
				t.Errorf("%d transport errors", res.Errors)
			}
			if len(res.Accepted) != 20 || res.ByStatus[202] != 20 || res.ByStatus[409] != buyers-20 {
				t.Fatalf("accepted %d, statuses %v: want exactly 20 and %d sold out", len(res.Accepted), res.ByStatus, buyers-20)
			}
			assertInvariants(t, rep)
			if rep.Orders != 20 || rep.DistinctBuyers != 20 || rep.Sold != 20 || rep.LiveUnits != 20 || rep.RedisRemaining != 0 {
				t.Fatalf("want 20 orders for 20 buyers, sold 20, Redis stock 0: %+v", rep)
			}
		})
	}
}

// backendEnv is the environment that points a backend process at cfg.
func backendEnv(cfg config.Config, adminListen string) []string {
	env := append(os.Environ(), config.Environ(cfg)...)
	set := map[string]string{
		"FLASHGATE_BACKEND_ADMIN_LISTEN": adminListen,
		"FLASHGATE_BACKEND_BATCH_SIZE":   "20",
		"FLASHGATE_BACKEND_ACK_WAIT":     "2s",
	}
	for k, v := range set {
		env = append(env, k+"="+v)
	}
	return env
}

// backendProc is a backend running as its own process, to be killed with -9.
type backendProc struct {
	cmd   *exec.Cmd
	admin string
}

func spawnBackend(t *testing.T, cfg config.Config, admin string) *backendProc {
	t.Helper()
	cmd := exec.Command(binary, "backend", "--config", "")
	cmd.Env = backendEnv(cfg, admin)
	logf, _ := os.CreateTemp(t.TempDir(), "backend-*.log")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &backendProc{cmd: cmd, admin: admin}
	t.Cleanup(func() { p.kill() })
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if res, err := http.Get("http://" + admin + "/readyz"); err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return p
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	log, _ := os.ReadFile(logf.Name())
	t.Fatalf("backend process not ready:\n%s", log)
	return nil
}

func (p *backendProc) kill() {
	if p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Kill() // SIGKILL: no drain, no goodbye
		_ = p.cmd.Wait()
	}
}

// freeAddr is a loopback address to listen on, with a port below the kernel's
// ephemeral range (testenv.FreePort): a :0 port may be taken by another
// test's outgoing connection before the process that is to bind it does.
func freeAddr(t *testing.T) string {
	t.Helper()
	return "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
}

func rows(t *testing.T, db *sql.DB, sale string) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow("SELECT COUNT(*) FROM orders WHERE sale_id = ?", sale).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func waitRows(t *testing.T, db *sql.DB, sale string, n int64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for rows(t, db, sale) < n {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d order rows after 60s", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestBackendKilledMidStream kills the backend process with SIGKILL twice while
// orders stream in, starts it again, and checks that every order that got a 202
// is in MySQL exactly once, and nothing oversold.
func TestBackendKilledMidStream(t *testing.T) {
	cfg := e2eConfig(t)
	admin := freeAddr(t)
	be := spawnBackend(t, cfg, admin)
	gw := startGateway(t, cfg)
	s := newSale(1500, 1)
	createSale(t, cfg, admin, s)
	awaitSale(t, gw, s.ID)
	db, err := mysql.OpenDB(cfg.MySQL.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan *loadgen.Result, 1)
	go func() {
		res, err := loadgen.Run(ctx, loadgen.Config{
			Target: "http://" + gw.Addr(), Sale: s.ID, Tokens: tokens(t, cfg, "k", 2000),
			Concurrency: 64, Requests: 2000,
		})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	// Kill twice, each time once some (but not all) orders are rows.
	for kill := 1; kill <= 2; kill++ {
		waitRows(t, db, s.ID, int64(200*kill))
		be.kill()
		t.Logf("kill %d: backend SIGKILLed with %d rows written", kill, rows(t, db, s.ID))
		be = spawnBackend(t, cfg, admin)
	}
	res := <-done
	t.Logf("202s %d, distinct order ids %d, statuses %v, errors %d", res.ByStatus[202], len(res.Accepted), res.ByStatus, res.Errors)
	rep := drain(t, cfg, s.ID, res.Accepted)
	assertInvariants(t, rep)
	if rep.Orders != int64(len(res.Accepted)) || rep.LiveUnits != int64(len(res.Accepted)) {
		t.Fatalf("%d accepted but %d orders, %d live units: %+v", len(res.Accepted), rep.Orders, rep.LiveUnits, rep)
	}
	if len(res.Accepted) != 1500 {
		t.Fatalf("accepted %d of 1500 units with 2000 buyers (statuses %v)", len(res.Accepted), res.ByStatus)
	}
}
