// Package chaos is flashgate's fault suite (`make chaos`): each scenario runs
// the whole funnel — two gateways, a backend, Redis, NATS, MariaDB, every one a
// real process of the scenario's own; on the fleet (fleet_test.go) Redis and
// NATS clusters, more gateways and backends — floods it with purchases, injects one
// fault, drains, reconciles, and checks docs/design.md §2's invariants by reading
// MySQL and Redis directly.
package chaos

import (
	"bufio"
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
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/audit"
	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/history"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/loadgen"
	"github.com/flashgate/flashgate/mysql"
	"github.com/redis/rueidis"
)

var binary string

// No step of the suite waits without a deadline: the build, every HTTP call
// (httpClient; the buyers' own buyClient), every query of the state at rest.
const (
	buildTimeout = 10 * time.Minute
	// callTimeout bounds one HTTP call to a process of the scenario (its
	// admin API, readiness, metrics, a sale's page).
	callTimeout = 10 * time.Second
	// queryTimeout bounds one read of MySQL, Redis or the stream.
	queryTimeout = 30 * time.Second
)

var httpClient = &http.Client{Timeout: callTimeout}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "flashgate-chaos")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "flashgate")
	build := testenv.Command(buildTimeout, "go", "build", "-tags", "failpoints", "-o", binary, "../cmd/flashgate")
	if out, err := build.CombinedOutput(); build.Done(err) != nil {
		fmt.Fprintf(os.Stderr, "build flashgate: %v\n%s", build.Done(err), out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a flashgate process of the scenario.
type proc struct {
	t     *testing.T
	name  string
	args  []string
	env   []string
	addr  string // public address (gateways)
	admin string
	cmd   *exec.Cmd
	log   string
}

func (p *proc) start() {
	p.t.Helper()
	p.cmd = exec.Command(binary, p.args...)
	p.cmd.Env = p.env
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if res, err := httpClient.Get("http://" + p.admin + "/readyz"); err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	b, _ := os.ReadFile(p.log)
	p.t.Fatalf("%s not ready:\n%s", p.name, tail(b, 20))
}

// kill is kill -9: no drain, no goodbye.
func (p *proc) kill() {
	if p.cmd != nil && p.cmd.Process != nil && p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
}

// exited waits for a process that ends by itself (a failpoint).
func (p *proc) exited(within time.Duration) bool {
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(within):
		return false
	}
}

func tail(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// stack is one scenario's world.
type stack struct {
	t        *testing.T
	cfg      config.Config
	redis    *testenv.Server // nil on a Redis Cluster (rcluster)
	nats     *testenv.Server // nil on a NATS cluster (ncluster)
	rcluster *testenv.RedisCluster
	ncluster *testenv.NATSCluster
	maria    *testenv.Server
	// backend is the leader backend as last found (leader, leaderNow);
	// backends are all of them.
	backend  *proc
	backends []*proc
	gateways []*proc
	dir      string
	env      []string // given to every process
	floods   int
	// phoneOf is each user's phone claim, for the floods that gave one
	// (floodPhones).
	phoneOf map[string]string
	// faultEnd is when the fault ended (the killed part back, the outage
	// over); recovery is measured from it.
	faultEnd time.Time
	// hist is what the scenario's clients saw, and the specs of its sales
	// over time, for the history checker (history_test.go); allow are the
	// costs the scenario measures instead of failing on.
	hist  recorder
	allow history.Allow
}

func newStack(t *testing.T, gatewayEnv ...[]string) *stack {
	t.Helper()
	return newStackWith(t, stackOpts{gatewayEnv: gatewayEnv})
}

// stackOpts shape a scenario's world: the servers' kinds, and extra
// environment for its processes.
type stackOpts struct {
	// redisCluster: 3 masters with a replica each (a 1 s cluster-node-timeout)
	// instead of one standalone Redis.
	redisCluster bool
	// natsCluster: 3 JetStream nodes, the streams at R3, instead of one.
	natsCluster bool
	// env is given to every process, gatewayEnv[i] to gateway i.
	env        []string
	gatewayEnv [][]string
}

// Failover timings of the scenarios' Redis Cluster: a master silent this long
// is replaced by its replica.
const clusterNodeTimeout = time.Second

func newStackWith(t *testing.T, o stackOpts) *stack {
	t.Helper()
	st := &stack{t: t, dir: t.TempDir()}
	cfg := config.Default()
	// On the fleet every scenario's servers are clusters.
	o.redisCluster = o.redisCluster || fleet.redisCluster
	o.natsCluster = o.natsCluster || fleet.natsCluster
	if o.redisCluster {
		st.rcluster = testenv.StartRedisCluster(t, 3, 1, clusterNodeTimeout)
		cfg.Redis.Addrs = st.rcluster.Addrs()
	} else {
		st.redis = testenv.StartRedis(t)
		cfg.Redis.Addrs = []string{st.redis.Addr}
	}
	if o.natsCluster {
		st.ncluster = testenv.StartNATSCluster(t, 3)
		cfg.NATS.URL = st.ncluster.URL()
		cfg.NATS.Replicas = 3
	} else {
		st.nats = testenv.StartNATS(t)
		cfg.NATS.URL = st.nats.URL()
	}
	st.maria = testenv.StartMariaDB(t)
	st.env = o.env
	gatewayEnv := o.gatewayEnv
	cfg.MySQL.DSN = st.maria.DSN()
	cfg.Auth.JWTSecret = testenv.Secret("chaos-secret-")
	cfg.Admin.Token = testenv.Secret("chaos-admin-")
	st.cfg = cfg
	for i := range fleet.backends {
		name := "backend"
		if fleet.backends > 1 {
			name += "-" + strconv.Itoa(i)
		}
		b := st.newProc(name, []string{"backend", "--config", ""}, nil)
		b.start()
		st.backends = append(st.backends, b)
	}
	st.backend = st.leader()
	for i := range fleet.gateways {
		var extra []string
		if i < len(gatewayEnv) {
			extra = gatewayEnv[i]
		}
		g := st.newProc("gateway-"+strconv.Itoa(i), []string{"gateway", "--config", ""}, extra)
		g.start()
		st.gateways = append(st.gateways, g)
	}
	t.Cleanup(func() {
		for _, g := range st.gateways {
			g.kill()
		}
		for _, b := range st.backends {
			b.kill()
		}
	})
	return st
}

func (st *stack) newProc(name string, args, extra []string) *proc {
	p := &proc{t: st.t, name: name, args: args, log: filepath.Join(st.dir, name+".log"),
		admin: "127.0.0.1:" + strconv.Itoa(testenv.FreePort(st.t))}
	env := append(os.Environ(),
		"FLASHGATE_REDIS_ADDRS="+strings.Join(st.cfg.Redis.Addrs, ","),
		"FLASHGATE_NATS_URL="+st.cfg.NATS.URL,
		"FLASHGATE_NATS_REPLICAS="+strconv.Itoa(st.cfg.NATS.Replicas),
		"FLASHGATE_MYSQL_DSN="+st.maria.DSN(),
		"FLASHGATE_MYSQL_AUTO_MIGRATE=true",
		"FLASHGATE_JWT_SECRET="+st.cfg.Auth.JWTSecret,
		"FLASHGATE_ADMIN_TOKEN="+st.cfg.Admin.Token,
		"FLASHGATE_BACKEND_ACK_WAIT=2s",
		"FLASHGATE_GATEWAY_BREAKER_OPEN=500ms",
		// The suite counts invariants, not refusals: no rate limits.
		"FLASHGATE_RATELIMIT_PER_IP_RATE=0", "FLASHGATE_RATELIMIT_PER_USER_RATE=0", "FLASHGATE_RATELIMIT_PER_SALE_RATE=0",
	)
	if strings.HasPrefix(name, "gateway") {
		p.addr = "127.0.0.1:" + strconv.Itoa(testenv.FreePort(st.t))
		env = append(env, "FLASHGATE_GATEWAY_LISTEN="+p.addr, "FLASHGATE_GATEWAY_ADMIN_LISTEN="+p.admin)
	} else {
		env = append(env, "FLASHGATE_BACKEND_ADMIN_LISTEN="+p.admin)
	}
	env = append(env, st.env...)
	p.env = append(env, extra...)
	return p
}

// admin calls the backend's admin API.
func (st *stack) admin(method, path string, body any) (int, []byte) {
	st.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	to := st.leaderNow()
	if to == nil || !to.running() {
		to = st.backend
		for _, b := range st.backends {
			if b.running() {
				to = b
				break
			}
		}
	}
	req, _ := http.NewRequest(method, "http://"+to.admin+path, rd)
	req.Header.Set("Authorization", "Bearer "+st.cfg.Admin.Token)
	res, err := httpClient.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

func (st *stack) createSale(total, perUser int64) *flashgate.Sale {
	st.t.Helper()
	return st.createBucketed(total, perUser, 0)
}

// createBucketed creates a sale of total units split over k buckets (0 or 1:
// not split) and waits until every gateway serves it.
func (st *stack) createBucketed(total, perUser int64, k int) *flashgate.Sale {
	st.t.Helper()
	return st.createLimited(total, perUser, k, nil)
}

// createLimited is createBucketed with purchase limits beyond per_user_limit
// (flashgate.Sale.Limits).
func (st *stack) createLimited(total, perUser int64, k int, limits []flashgate.Limit) *flashgate.Sale {
	st.t.Helper()
	now := time.Now()
	s := &flashgate.Sale{ID: testenv.ID("chaos"), Title: "chaos", PriceCents: 100, Total: total,
		StartsAt: now.Add(-time.Second), EndsAt: now.Add(time.Hour), PerUserLimit: perUser, PerOrderMax: 1, Buckets: k,
		Limits: limits}
	if code, b := st.admin("POST", "/admin/v1/sales", s); code != 201 {
		st.t.Fatalf("create sale: %d %s", code, b)
	}
	st.hist.sale(s)
	for _, g := range st.gateways {
		deadline := time.Now().Add(10 * time.Second)
		for {
			res, err := httpClient.Get("http://" + g.addr + "/v1/sales/" + s.ID)
			if err == nil {
				res.Body.Close()
				if res.StatusCode == 200 {
					break
				}
			}
			if time.Now().After(deadline) {
				st.t.Fatalf("%s never learnt of sale %s", g.name, s.ID)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return s
}

// flood sends requests purchases through every gateway at once (distinct users
// per gateway), calling fault once the flood is under way. It returns the
// requests sent and every order id answered 202.
func (st *stack) flood(sale string, users, requests int, fault func()) (int64, []uint64) {
	st.t.Helper()
	return st.floodPhones(sale, users, requests, 0, fault)
}

// floodPhones is flood with a phone claim in every token (phones > 0): the
// flood's users share phones new phones of its own, user u of the flood (over
// all gateways) having phone u mod phones, so that each phone's users come
// through every gateway and have different home buckets. st.phoneOf records
// each user's phone.
func (st *stack) floodPhones(sale string, users, requests, phones int, fault func()) (int64, []uint64) {
	st.t.Helper()
	st.floods++ // each flood's buyers are new people
	var mu sync.Mutex
	var accepted []uint64
	var sent int64
	var wg sync.WaitGroup
	perGateway := users / len(st.gateways)
	for i, g := range st.gateways {
		toks := make([][]byte, perGateway)
		names := make([]string, perGateway)
		for j := range toks {
			user := "f" + strconv.Itoa(st.floods) + "g" + strconv.Itoa(i) + "u" + strconv.Itoa(j)
			names[j] = user
			var o auth.MintOptions
			if phones > 0 {
				o.Phone = fmt.Sprintf("+1555%02d%06d", st.floods, (i*perGateway+j)%phones)
				if st.phoneOf == nil {
					st.phoneOf = map[string]string{}
				}
				st.phoneOf[user] = o.Phone
			}
			tok, err := auth.MintHS256(st.cfg.Auth.JWTSecret, user, o)
			if err != nil {
				st.t.Fatal(err)
			}
			toks[j] = []byte("Bearer " + tok)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := loadgen.Run(context.Background(), loadgen.Config{
				Target: "http://" + g.addr, Sale: sale, Tokens: toks, Concurrency: 32,
				Requests: int64(requests / len(st.gateways)), Record: true,
			})
			if err != nil {
				st.t.Errorf("%s flood: %v", g.name, err)
				return
			}
			st.hist.calls(sale, names, 1, "", res.Calls)
			mu.Lock()
			accepted = append(accepted, res.Accepted...)
			sent += res.Requests
			mu.Unlock()
		}()
	}
	if fault != nil {
		time.Sleep(300 * time.Millisecond)
		fault()
		if st.faultEnd.IsZero() {
			st.faultEnd = time.Now()
		}
	}
	wg.Wait()
	return sent, accepted
}

// settle drains and reconciles until the sale's invariants hold (or a bounded
// wait ends), and returns the audit and the time from the fault's end to
// that full recovery (from now, if no fault was marked).
func (st *stack) settle(sale string, accepted []uint64) (audit.Report, time.Duration) {
	st.t.Helper()
	db, err := mysql.OpenDB(st.cfg.MySQL.DSN)
	if err != nil {
		st.t.Fatal(err)
	}
	defer db.Close()
	rc := testenv.Redis(st.t, st.cfg.Redis.Addrs)
	start := time.Now()
	if !st.faultEnd.IsZero() {
		start = st.faultEnd
	}
	deadline := time.Now().Add(90 * time.Second)
	var rep audit.Report
	for {
		// What the leader does periodically, now.
		st.admin("POST", "/admin/v1/sales/"+sale+"/reconcile?older_than=2s", nil)
		rep, err = auditCheck(db, rc, sale, accepted)
		if err == nil && rep.Lost == 0 && rep.RedisReserved == 0 && rep.LedgerHolds {
			// At rest: audit once more, on one moment.
			if rep, err = auditCheck(db, rc, sale, accepted); err == nil {
				noteFailed(st.t, db, sale, accepted)
				elapsed := time.Since(start)
				st.noteConservation(sale)
				st.checkHistory(db, rc, sale)
				return rep, elapsed
			}
		}
		if time.Now().After(deadline) {
			noteFailed(st.t, db, sale, accepted)
			elapsed := time.Since(start)
			st.noteConservation(sale)
			st.checkHistory(db, rc, sale)
			return rep, elapsed
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// auditCheck is audit.Check bounded by queryTimeout.
func auditCheck(db *sql.DB, rc rueidis.Client, sale string, accepted []uint64) (audit.Report, error) {
	ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
	defer cancel()
	return audit.Check(ctx, db, rc, sale, accepted)
}

type row struct {
	name                                              string
	requests, accepted, orders                        int64
	oversold, overLimit, lost, duplicated, ledgerDiff int64
	failed                                            int64
	recovery                                          time.Duration
	// conservation is the leader's flashgate_sale_conservation_error_units
	// for the sale once it settled ("-": the gauge was never exported).
	conservation string
	// excused: the row's failed orders are a cost the scenario measures
	// (a Redis failover without wait_replicas, docs/recovery.md), shown in its
	// row and left out of the summary's failed.
	excused bool
}

var (
	rowsMu sync.Mutex
	rows   []row
	// failedBy is, per sale settled, how many of its accepted orders ended
	// failed without a cancel (noteFailed): a 202 is a promise of an order.
	failedBy = map[string]int64{}
	// conservationBy is, per sale settled, the last conservation error the
	// leader backend exported for it (noteConservation).
	conservationBy = map[string]string{}
)

// conservationWait bounds the wait for the leader's gauge to read 0 once the
// audit holds: the leader sets it every second, and a backend killed in the
// scenario is leader again within the lock's validity (5 s).
const conservationWait = 60 * time.Second

// noteConservation requires the leader backend's
// flashgate_sale_conservation_error_units for sale to return to 0 after the
// fault (issue 15 point 4), polling its /metrics (bounded by
// conservationWait), and keeps the last value for the report row.
func (st *stack) noteConservation(sale string) {
	st.t.Helper()
	series := `flashgate_sale_conservation_error_units{sale="` + sale + `"}`
	deadline := time.Now().Add(conservationWait)
	last, why := "-", ""
	for {
		from := st.backend
		if l := st.leaderNow(); l != nil {
			from = l
		}
		v, ok, err := scrapeSample(from.admin, series)
		switch {
		case err != nil:
			why = err.Error()
		case !ok:
			why = "the backend exports no such gauge (not the leader yet?)"
		default:
			last = strconv.FormatFloat(v, 'f', -1, 64)
			why = "it reads " + last
		}
		if err == nil && ok && v == 0 {
			break
		}
		if time.Now().After(deadline) {
			st.t.Errorf("sale %s: %s did not return to 0 within %v after the fault: %s", sale, series, conservationWait, why)
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	rowsMu.Lock()
	conservationBy[sale] = last
	rowsMu.Unlock()
}

// scrapeSample reads one sample (name with its labels, as exposed) from a
// process's /metrics; ok is false when it is absent.
func scrapeSample(admin, sample string) (v float64, ok bool, err error) {
	res, err := httpClient.Get("http://" + admin + "/metrics")
	if err != nil {
		return 0, false, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return 0, false, fmt.Errorf("GET /metrics: %s", res.Status)
	}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, val, found := strings.Cut(sc.Text(), " ")
		if found && name == sample {
			f, err := strconv.ParseFloat(val, 64)
			return f, err == nil, err
		}
	}
	return 0, false, sc.Err()
}

// noteFailed counts the accepted orders of sale that MySQL holds as failed.
func noteFailed(t *testing.T, db *sql.DB, sale string, accepted []uint64) {
	t.Helper()
	var n int64
	for part := range slices.Chunk(accepted, 1000) {
		args := []any{sale}
		for _, id := range part {
			args = append(args, id)
		}
		var c int64
		q := "SELECT COUNT(*) FROM orders WHERE sale_id = ? AND status = 'failed' AND id IN (?" + strings.Repeat(",?", len(part)-1) + ")"
		ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
		err := db.QueryRowContext(ctx, q, args...).Scan(&c)
		cancel()
		if err != nil {
			t.Errorf("counting failed orders: %v", err)
			return
		}
		n += c
	}
	rowsMu.Lock()
	failedBy[sale] = n
	rowsMu.Unlock()
}

func record(t *testing.T, name string, requests int64, accepted []uint64, rep audit.Report, recovery time.Duration) {
	t.Helper()
	recordRow(t, row{name: name, requests: requests, accepted: int64(len(accepted)), orders: rep.Orders,
		oversold: rep.Oversold, overLimit: rep.OverLimitUsers, lost: rep.Lost, duplicated: rep.Duplicated,
		ledgerDiff: rep.LedgerDiff, recovery: recovery}, rep)
}

func recordRow(t *testing.T, r row, rep audit.Report) {
	t.Helper()
	name := r.name
	rowsMu.Lock()
	r.failed = failedBy[rep.SaleID]
	r.conservation = conservationBy[rep.SaleID]
	if r.conservation == "" {
		r.conservation = "-"
	}
	rows = append(rows, r)
	rowsMu.Unlock()
	t.Logf("%s: %s failed=%d conservation_error_units=%s", name, rep, r.failed, r.conservation)
	if !rep.OK() {
		t.Errorf("%s: invariants broken: %s", name, rep)
	}
	if r.failed > 0 && !r.excused {
		t.Errorf("%s: %d accepted orders ended failed", name, r.failed)
	}
}

// TestChaos runs every scenario, then prints the table (and writes it to
// $CHAOS_REPORT if set) with its last line the summary.
func TestChaos(t *testing.T) {
	for _, sc := range scenarios {
		t.Run(sc.name, sc.run)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-32s %9s %9s %7s %9s %10s %5s %11s %7s %12s %12s\n", "scenario", "requests", "accepted", "orders", "oversold", "over-limit", "lost", "duplicated", "failed", "recovered", "conservation")
	var over, limit, lost, dup, failed, unconserved int64
	excused := false
	for _, r := range rows {
		if r.conservation != "0" {
			unconserved++
		}
		f := strconv.FormatInt(r.failed, 10)
		if r.excused {
			f, excused = f+"*", true
		} else {
			failed += r.failed
		}
		fmt.Fprintf(&b, "%-32s %9d %9d %7d %9d %10d %5d %11d %7s %12s %12s\n", r.name, r.requests, r.accepted, r.orders,
			r.oversold, r.overLimit, r.lost, r.duplicated, f, r.recovery.Round(10*time.Millisecond), r.conservation)
		over, limit, lost, dup = over+r.oversold, limit+r.overLimit, lost+r.lost, dup+r.duplicated
	}
	if fleet != (shape{gateways: 2, backends: 1}) {
		fmt.Fprintf(&b, "on the fleet: every scenario's stack is %s\n", fleet)
	}
	if excused {
		fmt.Fprintf(&b, "* accepted orders a Redis failover without wait_replicas turned into failed ones (units returned; docs/recovery.md): not in the failed below\n")
	}
	fmt.Fprintln(&b, historyLine())
	fmt.Fprintf(&b, "chaos: %d scenarios, oversold %d, over-limit %d, lost %d, duplicated %d, failed %d, conservation error not 0 in %d\n",
		len(rows), over, limit, lost, dup, failed, unconserved)
	fmt.Print(b.String())
	if p := os.Getenv("CHAOS_REPORT"); p != "" {
		_ = os.WriteFile(p, []byte(b.String()), 0o644)
	}
}

type scenario struct {
	name string
	run  func(t *testing.T)
}

var scenarios = []scenario{
	{"backend kill -9 ×2", func(t *testing.T) {
		st := newStack(t)
		s := st.createSale(2000, 1)
		// Kill the (leader) backend twice during the flood, restarting it
		// each time; on the fleet another backend takes the lead.
		requests, accepted := st.flood(s.ID, 3000, 3000, func() {
			for range 2 {
				b := st.leader()
				t.Logf("killing the leader backend %s", b.name)
				b.kill()
				time.Sleep(200 * time.Millisecond)
				b.start()
				time.Sleep(300 * time.Millisecond)
			}
		})
		rep, rec := st.settle(s.ID, accepted)
		record(t, "backend kill -9 ×2", requests, accepted, rep, rec)
	}},
	{"mariadb down 10s", func(t *testing.T) {
		st := newStack(t)
		s := st.createSale(2000, 1)
		var down time.Time
		requests, accepted := st.flood(s.ID, 3000, 3000, func() {
			st.maria.Kill()
			down = time.Now()
			st.faultEnd = down.Add(10 * time.Second) // set again once it is back
		})
		time.Sleep(time.Until(down.Add(10 * time.Second)))
		st.maria.Start()
		st.faultEnd = time.Now() // the outage ends when MariaDB is back
		rep, rec := st.settle(s.ID, accepted)
		record(t, "mariadb down 10s", requests, accepted, rep, rec)
	}},
	{"nats restart", func(t *testing.T) {
		st := newStack(t)
		s := st.createSale(2000, 1)
		// On a cluster: the node leading the orders stream.
		requests, accepted := st.flood(s.ID, 3000, 3000, func() {
			n := st.natsOf()
			n.Kill()
			time.Sleep(time.Second)
			n.Start()
		})
		rep, rec := st.settle(s.ID, accepted)
		record(t, "nats restart", requests, accepted, rep, rec)
	}},
}
