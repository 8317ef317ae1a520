package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	driver "github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/adminapi"
	"github.com/flashgate/flashgate/audit"
	"github.com/flashgate/flashgate/bench/internal/cli"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/loadgen"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/mysql"
	"github.com/flashgate/flashgate/orderid"
)

// ingestOptions is one bench-ingest run.
type ingestOptions struct {
	orders       int
	fillConc     int
	backendBin   string
	configPath   string
	logPath      string
	timeout      time.Duration
	drainTimeout time.Duration
	keep         bool
	jsonPath     string
	profileDir   string        // save the backend's CPU and allocation profiles here, if not ""
	profileFor   time.Duration // CPU profile length, from the backend's start
}

func run(args []string, stdout, stderr io.Writer) error {
	c := cli.NewCommand(programName, "[--orders N] [--json FILE]", stderr)
	o := ingestOptions{}
	c.IntVar(&o.orders, "orders", 100000, "orders to pre-fill the stream with, one unit each for a distinct user, then ingest")
	c.IntVar(&o.fillConc, "fill-concurrency", 64, "admissions and publishes in flight while filling the stream")
	c.StringVar(&o.backendBin, "backend-bin", "", "flashgate `binary` to run the backend from (default: flashgate beside this program, else on the PATH)")
	c.StringVar(&o.logPath, "backend-log", "", "append the backend's log to this `file` (default var/log/bench-ingest-backend.log, or one in the temp directory)")
	c.DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up when the backend has not written every order by then")
	c.DurationVar(&o.drainTimeout, "drain-timeout", 60*time.Second, "how long to wait for Redis to settle after the last row, before the audit")
	c.BoolVar(&o.keep, "keep", false, "keep the run's database, streams and Redis keys (they are removed by default)")
	c.StringVar(&o.jsonPath, "json", "", "also write the result as JSON to this `file`")
	c.StringVar(&o.profileDir, "profile", "", "save the ingesting backend's pprof profiles in this `directory`: backend-cpu.pprof (the first --profile-seconds) and backend-allocs.pprof (at the end)")
	profileSecs := c.Int("profile-seconds", 5, "length of the CPU profile, in seconds")
	pos, err := c.ParseAll(args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 0:
		return c.UsageError("unexpected arguments %q", pos)
	case o.orders < 1 || int64(o.orders) > flashgate.MaxSaleUnits:
		return c.UsageError("--orders must be 1..%d", flashgate.MaxSaleUnits)
	case o.fillConc < 1:
		return c.UsageError("--fill-concurrency must be at least 1")
	case o.timeout <= 0 || o.drainTimeout <= 0:
		return c.UsageError("--timeout and --drain-timeout must be positive")
	case o.profileDir != "" && *profileSecs < 1:
		return c.UsageError("--profile-seconds must be at least 1")
	}
	o.profileFor = time.Duration(*profileSecs) * time.Second
	if o.backendBin == "" {
		if o.backendBin, err = findFlashgate(); err != nil {
			return fmt.Errorf("bench-ingest: %w (give --backend-bin)", err)
		}
	}
	o.configPath = c.ConfigPath
	cfg, err := c.Config()
	if err != nil {
		return err
	}
	// The first SIGINT stops the run and cleans up; a second one ends the program.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runIngest(ctx, cfg, o, stdout, stderr)
}

// ingestResult is what `bench-ingest --json` writes.
type ingestResult struct {
	// Sale, Stream and Database are the run's own (removed afterwards unless --keep).
	Sale     string `json:"sale"`
	Stream   string `json:"stream"`
	Database string `json:"database"`
	Orders   int    `json:"orders"`
	// ElapsedS runs from the last moment MySQL had none of the orders to the
	// first moment it had all of them (each end rounded outwards by one poll);
	// OrdersPerS is Orders / ElapsedS.
	ElapsedS   float64 `json:"elapsed_s"`
	OrdersPerS float64 `json:"orders_per_s"`
	AuditOK    bool    `json:"audit_ok"`
	// StartupS is from starting the backend process to its first row; WallS
	// from starting it to the last row.
	StartupS float64 `json:"startup_s"`
	WallS    float64 `json:"wall_s"`
	// FillS is how long admitting and publishing the orders took.
	FillS float64 `json:"fill_s"`
	// The backend settings the rate was measured with.
	BatchSize     int     `json:"batch_size"`
	BatchWaitMS   float64 `json:"batch_wait_ms"`
	MaxAckPending int     `json:"max_ack_pending"`
	MySQLConns    int     `json:"mysql_max_open_conns"`
	// From the backend's metrics at the end: the batches it wrote and the
	// time it spent in them (claim, transaction, write-back, acks); the rest
	// of its time went to fetching and waiting.
	Batches    int64        `json:"batches"`
	BatchBusyS float64      `json:"batch_busy_s"`
	Audit      audit.Report `json:"audit"`
}

// ingestRun is the private world of one bench-ingest: its own database, stream,
// subjects, consumer and admin port, so that the backend it starts and stops
// shares nothing but the servers with any other flashgate on them.
type ingestRun struct {
	o      ingestOptions
	cfg    config.Config // the run's private configuration
	env    []string      // what makes the backend process use it
	sale   *flashgate.Sale
	stderr io.Writer
	log    *os.File
}

func runIngest(ctx context.Context, base config.Config, o ingestOptions, stdout, stderr io.Writer) error {
	r, err := newIngestRun(base, o, stderr)
	if err != nil {
		return err
	}
	defer r.log.Close()
	if err := r.createDatabase(ctx); err != nil {
		return err
	}
	defer func() {
		if !o.keep {
			r.cleanup(stderr)
		}
	}()

	// 1. A backend creates the sale (MySQL row, Redis warm) and the stream, and stops.
	p, err := r.startBackend()
	if err != nil {
		return err
	}
	err = p.awaitReady(ctx, "http://"+r.cfg.Backend.AdminListen+"/readyz", 60*time.Second)
	if err == nil {
		_, err = adminapi.New(r.cfg).CreateSale(ctx, r.sale)
	}
	if serr := p.stop(30 * time.Second); err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("bench-ingest: create sale %s: %w (backend log: %s)", r.sale.ID, err, r.log.Name())
	}

	// 2. With no backend running, every order is admitted in Redis and published,
	// exactly as the gateway does.
	fmt.Fprintf(stderr, "ingest: filling stream %s with %d orders of sale %s\n", r.cfg.NATS.Stream, o.orders, r.sale.ID)
	fillStart := time.Now()
	accepted, err := r.fill(ctx)
	if err != nil {
		return err
	}
	fill := time.Since(fillStart)
	fmt.Fprintf(stderr, "ingest: %d orders admitted and in the stream in %.2fs (%.0f/s); starting the backend\n",
		o.orders, fill.Seconds(), float64(o.orders)/fill.Seconds())

	// 3. The backend starts and writes them: time it from the outside.
	db, err := mysql.OpenDB(r.cfg.MySQL.DSN)
	if err != nil {
		return fmt.Errorf("mysql: %w", err)
	}
	defer db.Close()
	spawned := time.Now()
	p, err = r.startBackend()
	if err != nil {
		return err
	}
	defer p.stop(30 * time.Second)
	var cpuProfile <-chan error
	if o.profileDir != "" {
		cpuProfile = r.profile(ctx, "profile?seconds="+strconv.Itoa(int(o.profileFor/time.Second)), "backend-cpu.pprof", true)
	}
	m, err := r.watch(ctx, db, p, spawned)
	if err != nil {
		return err
	}
	if o.profileDir != "" {
		if err := <-r.profile(ctx, "allocs", "backend-allocs.pprof", false); err != nil {
			return err
		}
		if err := <-cpuProfile; err != nil {
			return err
		}
		fmt.Fprintf(stderr, "ingest: backend profiles in %s\n", o.profileDir)
	}
	res := ingestResult{
		Sale: r.sale.ID, Stream: r.cfg.NATS.Stream, Database: r.dbName(), Orders: o.orders, ElapsedS: m.elapsed.Seconds(), OrdersPerS: float64(o.orders) / m.elapsed.Seconds(),
		StartupS: m.startup.Seconds(), WallS: m.wall.Seconds(), FillS: fill.Seconds(),
		BatchSize: r.cfg.Backend.BatchSize, BatchWaitMS: float64(r.cfg.Backend.BatchWait) / float64(time.Millisecond),
		MaxAckPending: r.cfg.Backend.MaxAckPending, MySQLConns: r.cfg.MySQL.MaxOpenConns,
	}
	fmt.Fprintf(stdout, "%-10s %d orders into MySQL in %.2fs: %.0f orders/s (backend up to its first row %.2fs, to its last %.2fs; batch_size %d, batch_wait %s, max_ack_pending %d, mysql conns %d)\n",
		"ingest", o.orders, res.ElapsedS, res.OrdersPerS, res.StartupS, res.WallS,
		res.BatchSize, r.cfg.Backend.BatchWait, res.MaxAckPending, res.MySQLConns)
	if n, busy, err := r.batchMetrics(ctx); err != nil {
		fmt.Fprintf(stderr, "ingest: warning: backend metrics: %v\n", err)
	} else {
		res.Batches, res.BatchBusyS = n, busy
		fmt.Fprintf(stdout, "%-10s %d batches of %.0f orders on average; %.2fs of the %.2fs spent in them (%.0f%%), the rest fetching and waiting\n",
			"backend", n, float64(o.orders)/float64(max(n, 1)), busy, m.wall.Seconds(), 100*busy/m.wall.Seconds())
	}

	// 4. The audit, as bench runs it.
	rep, waited, drained, err := loadgen.AwaitDrain(ctx, r.cfg, r.sale.ID, accepted, o.drainTimeout)
	if err != nil {
		return err
	}
	loadgen.WriteAudit(stdout, rep, len(accepted), waited, drained)
	confirmed := rep.ByStatus[string(flashgate.OrderConfirmed)]
	res.Audit = rep
	res.AuditOK = rep.OK() && drained && confirmed == int64(o.orders)
	line := loadgen.SummaryLine("ingest", rep, 0)
	if confirmed != int64(o.orders) {
		line += fmt.Sprintf(", confirmed %d of %d", confirmed, o.orders)
	}
	fmt.Fprintln(stdout, line)
	if err := loadgen.WriteJSON(o.jsonPath, res); err != nil {
		return err
	}
	if !res.AuditOK {
		return cli.ExitCode(1)
	}
	return nil
}

func newIngestRun(base config.Config, o ingestOptions, stderr io.Writer) (*ingestRun, error) {
	// 2 bytes name the run, 24 make its private admin token (the backend
	// refuses a shorter one outside dev mode).
	var b [26]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	id := strconv.FormatInt(time.Now().Unix(), 10) + hex.EncodeToString(b[:2])
	cfg := base
	cfg.NATS.Stream = "FLASHGATE_INGEST_" + id
	cfg.NATS.OrderSubject = "flashgate.ingest." + id + ".orders"
	cfg.NATS.EventSubject = "flashgate.ingest." + id + ".events"
	cfg.NATS.CommandSubject = "flashgate.ingest." + id + ".cmd"
	cfg.NATS.Consumer = "flashgate-ingest-" + id
	dsn, err := driver.ParseDSN(base.MySQL.DSN)
	if err != nil {
		return nil, fmt.Errorf("mysql dsn: %w", err)
	}
	dsn.DBName = "flashgate_ingest_" + id
	cfg.MySQL.DSN = dsn.FormatDSN()
	// The run's database is new: its backend builds the schema.
	cfg.MySQL.AutoMigrate = true
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	cfg.Backend.AdminListen = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cfg.Admin.URL = "http://" + cfg.Backend.AdminListen
	cfg.Admin.Token = hex.EncodeToString(b[2:])

	r := &ingestRun{o: o, cfg: cfg, stderr: stderr}
	r.env = append(os.Environ(), config.Environ(cfg)...)
	// A day, so that neither the fill nor a slow ingestion outlives the sale.
	r.sale = loadgen.NewSale("ingest-"+id, "flashgate ingest", int64(o.orders), 1, 1, 9900, time.Now())
	r.sale.EndsAt = r.sale.StartsAt.Add(24 * time.Hour)

	path := o.logPath
	if path == "" {
		path = filepath.Join(os.TempDir(), "flashgate-bench-ingest-backend.log")
		if st, err := os.Stat("var/log"); err == nil && st.IsDir() {
			path = "var/log/bench-ingest-backend.log"
		}
	}
	if r.log, err = os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
		return nil, fmt.Errorf("backend log: %w", err)
	}
	return r, nil
}

// freePort is a loopback port nobody listens on right now.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// mysqlServer opens the run's MySQL server without selecting a database.
func (r *ingestRun) mysqlServer() (*sql.DB, error) {
	dsn, err := driver.ParseDSN(r.cfg.MySQL.DSN)
	if err != nil {
		return nil, fmt.Errorf("mysql dsn: %w", err)
	}
	dsn.DBName = ""
	return sql.Open("mysql", dsn.FormatDSN())
}

func (r *ingestRun) dbName() string {
	dsn, _ := driver.ParseDSN(r.cfg.MySQL.DSN)
	return dsn.DBName
}

func (r *ingestRun) createDatabase(ctx context.Context) error {
	db, err := r.mysqlServer()
	if err != nil {
		return err
	}
	defer db.Close()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := mysql.CreateDatabase(cctx, db, r.dbName()); err != nil {
		return fmt.Errorf("mysql: create database %s: %w", r.dbName(), err)
	}
	return nil
}

// fill admits every order in Redis and publishes it to the run's stream with
// Nats-Msg-Id = order id, as the gateway's purchase does, and returns the ids.
func (r *ingestRun) fill(ctx context.Context) ([]uint64, error) {
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: r.cfg.Redis.Addrs, Username: r.cfg.Redis.Username, Password: r.cfg.Redis.Password, DisableCache: true})
	if err != nil {
		return nil, fmt.Errorf("redis %v: %w", r.cfg.Redis.Addrs, err)
	}
	defer rc.Close()
	nc, err := bus.Connect(r.cfg.NATS, "flashgate-bench-ingest")
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	stream, err := bus.EnsureStream(ctx, js, r.cfg.NATS)
	if err != nil {
		return nil, err
	}
	lease, err := orderid.Acquire(ctx, rc, 15*time.Second)
	if err != nil {
		return nil, err
	}
	defer lease.Close(context.Background())

	scripts := lua.Load()
	keys := lua.KeysFor(r.sale.ID, nil)
	subject := bus.OrderSubject(r.cfg.NATS, r.sale.ID)
	payFor := r.cfg.Orders.PaymentTimeout
	var next atomic.Int64
	ids := make([][]uint64, r.o.fillConc)
	errs := make([]error, r.o.fillConc)
	var wg sync.WaitGroup
	for w := range r.o.fillConc {
		wg.Go(func() {
			buf := make([]byte, 0, 256)
			for {
				i := next.Add(1) - 1
				if i >= int64(r.o.orders) || ctx.Err() != nil {
					errs[w] = ctx.Err()
					return
				}
				if !lease.Valid() {
					errs[w] = errors.New("order-id lease lost")
					return
				}
				id := lease.Next()
				now := time.Now()
				m := flashgate.Order{ID: id, SaleID: r.sale.ID, UserID: loadgen.User(int(i)), Quantity: 1,
					CreatedAt: now, ExpiresAt: now.Add(payFor)}
				actx, cancel := context.WithTimeout(ctx, 10*time.Second)
				adm, err := scripts.Admit(actx, rc, keys, lua.AdmitArgs{User: m.UserID, Quantity: 1, OrderID: id, Now: now, PayBy: now.Add(payFor)})
				cancel()
				if err == nil && adm.Outcome != lua.Admitted {
					err = fmt.Errorf("admission of order %d: %s, want ok", i, adm.Outcome)
				}
				if err != nil {
					errs[w] = err
					return
				}
				pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, err = bus.PublishOrder(pctx, js, subject, &m, buf)
				cancel()
				if err != nil {
					errs[w] = fmt.Errorf("publish order %d: %w", id, err)
					return
				}
				ids[w] = append(ids[w], id)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("bench-ingest: fill: %w", err)
	}
	var all []uint64
	for _, part := range ids {
		all = append(all, part...)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", r.cfg.NATS.Stream, err)
	}
	if info.State.Msgs != uint64(r.o.orders) || len(all) != r.o.orders {
		return nil, fmt.Errorf("bench-ingest: stream %s holds %d messages after publishing %d of %d orders",
			r.cfg.NATS.Stream, info.State.Msgs, len(all), r.o.orders)
	}
	return all, nil
}

// profile saves one of the backend's pprof profiles (GET /debug/pprof/<what>,
// with the run's admin token) as profileDir/name. A profile asked for at the
// backend's start (early) waits for its admin port to open.
func (r *ingestRun) profile(ctx context.Context, what, name string, early bool) <-chan error {
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			if err := os.MkdirAll(r.o.profileDir, 0o755); err != nil {
				return fmt.Errorf("bench-ingest: profile: %w", err)
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.cfg.Admin.URL+"/debug/pprof/"+what, nil)
			if err != nil {
				return err
			}
			req.Header.Set("Authorization", "Bearer "+r.cfg.Admin.Token)
			hc := &http.Client{Timeout: r.o.profileFor + time.Minute}
			deadline := time.Now().Add(time.Minute)
			for {
				resp, err := hc.Do(req)
				if err != nil {
					if early && time.Now().Before(deadline) && ctx.Err() == nil {
						time.Sleep(10 * time.Millisecond) // not listening yet
						continue
					}
					return fmt.Errorf("bench-ingest: profile %s: %w", what, err)
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				if err != nil || resp.StatusCode != http.StatusOK {
					return fmt.Errorf("bench-ingest: profile %s: %s %v", what, resp.Status, err)
				}
				return os.WriteFile(filepath.Join(r.o.profileDir, name), b, 0o644)
			}
		}()
	}()
	return done
}

// batchMetrics reads the backend's batch count and the seconds spent in batches
// from its /metrics.
func (r *ingestRun) batchMetrics(ctx context.Context) (batches int64, busy float64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.cfg.Admin.URL+"/metrics", nil)
	if err != nil {
		return 0, 0, err
	}
	hc := &http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return 0, 0, err
	}
	n, ok1 := metricValue(b, "flashgate_backend_batch_duration_seconds_count")
	busy, ok2 := metricValue(b, "flashgate_backend_batch_duration_seconds_sum")
	if !ok1 || !ok2 {
		return 0, 0, errors.New("no flashgate_backend_batch_duration_seconds")
	}
	return int64(n), busy, nil
}

// metricValue is the value of an unlabelled sample in Prometheus' text format.
func metricValue(text []byte, name string) (float64, bool) {
	for line := range strings.Lines(string(text)) {
		v, ok := strings.CutPrefix(line, name+" ")
		if !ok {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		return f, err == nil
	}
	return 0, false
}

// ingestTimes are the figures of one ingestion, as seen from MySQL.
type ingestTimes struct {
	elapsed, startup, wall time.Duration
}

// How the rows are watched. COUNT(*) of a sale's orders is an index scan: at
// 100,000 rows it costs MySQL ~50 ms, and polled often it would take a core
// from the backend being measured. So: COUNT(*) while there are none (an empty
// range, cheap), then the sale row's sold counter (a primary-key read; every
// order of the run is one unit, so sold counts the confirmed rows) and, when
// sold reaches the total or at most every countEvery, COUNT(*) again, which
// alone decides that all rows are in.
const (
	pollEmpty  = 5 * time.Millisecond
	pollSold   = 10 * time.Millisecond
	countEvery = time.Second
)

// watch waits until all of the sale's order rows are in MySQL, the backend
// exits, or the timeout passes. The interval is measured conservatively: it
// starts when the last poll that found no row was sent and ends when the
// first that found them all came back.
func (r *ingestRun) watch(ctx context.Context, db *sql.DB, p *process, spawned time.Time) (ingestTimes, error) {
	var t ingestTimes
	total := int64(r.o.orders)
	deadline := spawned.Add(r.o.timeout)
	var lastEmpty, first, lastCount time.Time
	lastReport := time.Now()
	query := func(read func(context.Context, mysql.Querier, string) (int64, error), v *int64) (sent, back time.Time, err error) {
		sent = time.Now()
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		*v, err = read(qctx, db, r.sale.ID)
		if ctx.Err() != nil {
			err = ctx.Err()
		} else if err != nil {
			err = fmt.Errorf("bench-ingest: watch orders: %w", err)
		}
		return sent, time.Now(), err
	}
	countRows, readSold := mysql.SaleOrderCount, mysql.SaleSold
	var rows, sold int64
	for {
		var back time.Time
		if first.IsZero() {
			sent, b, err := query(countRows, &rows)
			if err != nil {
				return t, err
			}
			back, lastCount = b, b
			if rows == 0 {
				lastEmpty = sent
			} else {
				first = back
			}
		} else {
			_, b, err := query(readSold, &sold)
			if err != nil {
				return t, err
			}
			back = b
			if sold >= total || back.Sub(lastCount) >= countEvery {
				if _, back, err = query(countRows, &rows); err != nil {
					return t, err
				}
				lastCount = back
			}
		}
		if rows >= total {
			t.elapsed, t.startup, t.wall = back.Sub(lastEmpty), first.Sub(spawned), back.Sub(spawned)
			return t, nil
		}
		written := max(rows, sold)
		if p.exited() {
			return t, fmt.Errorf("bench-ingest: the backend exited with %d of %d orders written (log: %s)", written, total, r.log.Name())
		}
		if back.After(deadline) {
			return t, fmt.Errorf("bench-ingest: %d of %d orders written after %s (log: %s)", written, total, r.o.timeout, r.log.Name())
		}
		if back.Sub(lastReport) >= time.Second {
			fmt.Fprintf(r.stderr, "ingest: %.0fs %d orders in MySQL\n", back.Sub(spawned).Seconds(), written)
			lastReport = back
		}
		wait := pollSold
		if first.IsZero() {
			wait = pollEmpty
		}
		time.Sleep(wait)
	}
}

// cleanup removes what the run made: the streams, the database, the sale's
// Redis keys. What it cannot remove it says, and goes on.
func (r *ingestRun) cleanup(stderr io.Writer) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	warn := func(what string, err error) {
		if err != nil {
			fmt.Fprintf(stderr, "ingest: warning: cleanup: %s: %v\n", what, err)
		}
	}
	if nc, err := bus.Connect(r.cfg.NATS, "flashgate-bench-ingest"); err != nil {
		warn("nats", err)
	} else {
		if js, err := jetstream.New(nc); err == nil {
			for _, s := range []string{r.cfg.NATS.Stream, bus.DeadLetterStream(r.cfg.NATS)} {
				if err := js.DeleteStream(ctx, s); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
					warn("stream "+s, err)
				}
			}
		}
		nc.Close()
	}
	if db, err := r.mysqlServer(); err != nil {
		warn("mysql", err)
	} else {
		err := mysql.DropDatabase(ctx, db, r.dbName())
		warn("drop database "+r.dbName(), err)
		db.Close()
	}
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: r.cfg.Redis.Addrs, Username: r.cfg.Redis.Username, Password: r.cfg.Redis.Password, DisableCache: true})
	if err != nil {
		warn("redis", err)
		return
	}
	defer rc.Close()
	k := lua.KeysFor(r.sale.ID, nil)
	stock, _ := k.Stock("")
	// One hash tag: one DEL on one shard.
	warn("redis keys", rc.Do(ctx, rc.B().Del().Key(k.Meta, stock, k.Users, k.Resv, k.Orders, k.Idem, k.Restocked()).Build()).Error())
	warn("redis sales index", lua.Unindex(ctx, rc, r.sale.ID))
}

// process is a flashgate process this command started.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// startBackend starts `flashgate backend` on the run's private configuration.
func (r *ingestRun) startBackend() (*process, error) {
	fmt.Fprintf(r.log, "\n==== bench-ingest: backend start %s ====\n", time.Now().Format(time.RFC3339))
	cmd := exec.Command(r.o.backendBin, "backend", "--config", r.o.configPath)
	cmd.Env = r.env
	cmd.Stdout, cmd.Stderr = r.log, r.log
	// Its own process group: a Ctrl-C at the terminal reaches this command,
	// which stops the backend in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench-ingest: start %s backend: %w", r.o.backendBin, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// awaitReady polls url until it answers 200.
func (p *process) awaitReady(ctx context.Context, url string, timeout time.Duration) error {
	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(timeout)
	for {
		if resp, err := hc.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if p.exited() {
			return fmt.Errorf("backend exited before %s answered 200: %v", url, p.err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer 200 within %s", url, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stop ends the process with SIGTERM (it finishes the batch in hand) and, past
// grace, SIGKILL. A process that ended on its own with an error says so.
func (p *process) stop(grace time.Duration) error {
	if p.exited() {
		return exitError(p.err)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return exitError(p.err)
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("backend did not stop within %s of SIGTERM: killed", grace)
	}
}

// exitError is nil for a clean exit, including one by our SIGTERM.
func exitError(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if st, ok := ee.Sys().(syscall.WaitStatus); ok && st.Signaled() && st.Signal() == syscall.SIGTERM {
			return nil
		}
		return fmt.Errorf("backend: %w", err)
	}
	return err
}
