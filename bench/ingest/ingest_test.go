package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashgate/flashgate/bench/internal/cli"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

// buildFlashgate builds the flashgate command into a temporary directory:
// bench-ingest runs the backend as a process of its own.
func buildFlashgate(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "flashgate")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/flashgate/flashgate/cmd/flashgate").CombinedOutput(); err != nil {
		t.Fatalf("build flashgate: %v\n%s", err, out)
	}
	return bin
}

// A real backend process writes a pre-filled stream into MySQL; the audit
// passes, the figures are there, and the run leaves nothing behind.
func TestBenchIngest(t *testing.T) {
	bin := buildFlashgate(t)
	base := config.Default()
	base.Redis.Addrs = testenv.RedisAddrs()
	base.Redis.Username, base.Redis.Password = testenv.RedisUsername(), testenv.RedisPassword()
	base.NATS.URL = testenv.NATSURL()
	base.NATS.User, base.NATS.Password = testenv.NATSUser(), testenv.NATSPassword()
	base.MySQL.DSN = testenv.MySQLDSN()
	dir := t.TempDir()
	o := ingestOptions{
		orders: 1500, fillConc: 16, backendBin: bin, logPath: filepath.Join(dir, "backend.log"),
		timeout: 2 * time.Minute, drainTimeout: time.Minute, jsonPath: filepath.Join(dir, "ingest.json"),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	if err := runIngest(ctx, base, o, &out, &errOut); err != nil {
		log, _ := os.ReadFile(o.logPath)
		t.Fatalf("bench-ingest: %v\nstdout:\n%s\nstderr:\n%s\nbackend log:\n%s", err, out.String(), errOut.String(), log)
	}
	t.Logf("%s", out.String())
	for _, want := range []string{"orders/s", "ingest: sold 1500/1500, orders 1500, oversold 0, over-limit users 0, lost 0"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	b, err := os.ReadFile(o.jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var res ingestResult
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if res.Orders != 1500 || !res.AuditOK || res.OrdersPerS <= 0 || res.ElapsedS <= 0 ||
		res.WallS < res.StartupS || res.FillS <= 0 || res.Audit.ByStatus["confirmed"] != 1500 || res.BatchSize != base.Backend.BatchSize {
		t.Fatalf("result %s", b)
	}
	if d := res.OrdersPerS*res.ElapsedS - 1500; d > 1 || d < -1 {
		t.Fatalf("orders/s %v × elapsed %v is not the orders", res.OrdersPerS, res.ElapsedS)
	}

	// Nothing left: the database, the streams, the sale's Redis keys.
	dsn, _ := mysql.ParseDSN(base.MySQL.DSN)
	dsn.DBName = ""
	db, err := sql.Open("mysql", dsn.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var name string
	if err := db.QueryRow(`SHOW DATABASES LIKE '` + res.Database + `'`).Scan(&name); !errors.Is(err, sql.ErrNoRows) {
		t.Errorf("database %s left behind (%v)", res.Database, err)
	}
	js, err := jetstream.New(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{res.Stream, res.Stream + "_DLQ"} {
		if _, err := js.Stream(ctx, s); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("stream %s left behind (%v)", s, err)
		}
	}
	rc := testenv.Redis(t, testenv.RedisAddrs())
	k := lua.KeysFor(res.Sale, nil)
	if n, err := rc.Do(ctx, rc.B().Exists().Key(k.Meta, k.Users, k.Resv, k.Orders).Build()).AsInt64(); err != nil || n != 0 {
		t.Errorf("%d Redis keys of sale %s left behind (%v)", n, res.Sale, err)
	}
}

func TestBenchIngestFlags(t *testing.T) {
	var out, errOut bytes.Buffer
	var code cli.ExitCode
	for _, args := range [][]string{
		{"--orders", "0"},
		{"--fill-concurrency", "0"},
		{"--timeout", "0s"},
		{"extra"},
	} {
		errOut.Reset()
		err := run(append([]string{"--config", ""}, args...), &out, &errOut)
		if !errors.As(err, &code) || code != 2 || !strings.Contains(errOut.String(), "usage: flashgate-bench-ingest") {
			t.Errorf("%q: %v %q", args, err, errOut.String())
		}
	}
}

func TestMetricValue(t *testing.T) {
	text := []byte("# HELP x\nflashgate_backend_batch_duration_seconds_bucket{le=\"+Inf\"} 51\n" +
		"flashgate_backend_batch_duration_seconds_sum 1.3707\nflashgate_backend_batch_duration_seconds_count 51\n")
	if v, ok := metricValue(text, "flashgate_backend_batch_duration_seconds_sum"); !ok || v != 1.3707 {
		t.Fatalf("sum %v %v", v, ok)
	}
	if v, ok := metricValue(text, "flashgate_backend_batch_duration_seconds_count"); !ok || v != 51 {
		t.Fatalf("count %v %v", v, ok)
	}
	if _, ok := metricValue(text, "flashgate_backend_batch_duration_seconds"); ok {
		t.Fatal("found a sample that is not there")
	}
}
