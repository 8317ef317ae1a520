package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/adminapi"
	"github.com/flashgate/flashgate/audit"
	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/loadgen"
)

const defaultTarget = "http://127.0.0.1:8080"

// benchOptions is one bench run; `bench` reads them from flags, `demo` fixes them.
type benchOptions struct {
	label        string
	target       string
	sale         string
	create       *flashgate.Sale // created through the admin API first, if not nil
	users        int
	concurrency  int
	requests     int64
	duration     time.Duration
	rate         float64 // requests/s, open loop; 0: as fast as possible
	quantity     int64
	region       string
	idempotency  bool
	oneIP        bool
	drainTimeout time.Duration
	noCheck      bool
	announce     bool   // say what is about to happen before the load starts
	jsonPath     string // write the result as JSON here too, if not ""
}

func benchCmd(args []string, stdout, stderr io.Writer) error {
	c := newCommand("bench", "--sale ID | --create [flags]", stderr)
	o := benchOptions{}
	c.StringVar(&o.sale, "sale", "", "sale `id` to buy from (required unless --create)")
	create := c.Bool("create", false, "create the sale first (id: --sale, or <label>-<unix seconds>), starting now, for 1h")
	total := c.Int64("total", 1000, "with --create: units on sale")
	perUser := c.Int64("per-user-limit", 1, "with --create: units one user may hold")
	perOrder := c.Int64("per-order-max", 0, "with --create: units one order may buy (default --quantity)")
	c.StringVar(&o.target, "target", defaultTarget, "gateway `URL` (http://127.0.0.1:8000 goes through nginx)")
	c.IntVar(&o.users, "users", 10000, "distinct users (one token each)")
	c.IntVar(&o.concurrency, "concurrency", 256, "requests in flight")
	c.Int64Var(&o.requests, "requests", 100000, "requests to send (unless --duration)")
	c.DurationVar(&o.duration, "duration", 0, "send for this long instead of a number of requests")
	c.Float64Var(&o.rate, "rate", 0, "send at this many requests/s on a fixed schedule, latency measured from each request's due time (open loop, as wrk2); with --duration it sends rate × duration requests. 0: as fast as --concurrency allows")
	c.Int64Var(&o.quantity, "quantity", 1, "units per order")
	c.StringVar(&o.region, "region", "", "region to buy in")
	c.BoolVar(&o.idempotency, "idempotency", false, "send a fresh Idempotency-Key with every request")
	c.BoolVar(&o.oneIP, "one-ip", false, "send no X-Forwarded-For: every user comes from this machine's address (by default each user has its own, from 198.18.0.0/15, as if behind nginx)")
	c.StringVar(&o.label, "label", "bench", "name on the summary line")
	c.DurationVar(&o.drainTimeout, "drain-timeout", 60*time.Second, "how long to wait for the backend to write every accepted order")
	c.BoolVar(&o.noCheck, "no-check", false, "skip the audit of the invariants")
	c.StringVar(&o.jsonPath, "json", "", "also write the raw result (counts, latency percentiles, audit) as JSON to this `file`")
	pos, err := c.parse(args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 0:
		return c.usageError("unexpected arguments %q", pos)
	case o.sale == "" && !*create:
		return c.usageError("--sale is required (or --create)")
	case o.users < 1 || o.concurrency < 1 || o.quantity < 1:
		return c.usageError("--users, --concurrency and --quantity must be at least 1")
	case o.duration < 0 || o.requests < 0:
		return c.usageError("--requests and --duration must not be negative")
	case o.duration == 0 && o.requests == 0:
		return c.usageError("give --requests or --duration")
	case o.rate < 0 || math.IsNaN(o.rate) || math.IsInf(o.rate, 0):
		return c.usageError("--rate must be a number of requests/s, 0 or more")
	case o.label == "":
		return c.usageError("--label must not be empty")
	}
	if o.duration > 0 {
		o.requests = 0 // duration wins
	}
	if *create {
		if o.sale == "" {
			o.sale = fmt.Sprintf("%s-%d", o.label, time.Now().Unix())
		}
		if *perOrder == 0 {
			*perOrder = o.quantity
		}
		s := loadgen.NewSale(o.sale, "flashgate "+o.label, *total, *perUser, *perOrder, 9900, time.Now())
		if o.region != "" {
			s.Regions = map[string]int64{o.region: *total}
		}
		if err := s.Validate(); err != nil {
			return c.usageError("--create: %v", err)
		}
		o.create = s
	}
	cfg, err := c.config()
	if err != nil {
		return err
	}
	return runBench(cfg, o, stdout, stderr)
}

func demoCmd(args []string, stdout, stderr io.Writer) error {
	c := newCommand("demo", "[--target URL]", stderr)
	o := benchOptions{
		label: "demo", users: 20000, requests: 200000, concurrency: 256, quantity: 1,
		sale: fmt.Sprintf("demo-%d", time.Now().Unix()), announce: true,
	}
	c.StringVar(&o.target, "target", defaultTarget, "gateway `URL` (http://127.0.0.1:8000 goes through nginx)")
	c.DurationVar(&o.drainTimeout, "drain-timeout", 60*time.Second, "how long to wait for the backend to write every accepted order")
	pos, err := c.parse(args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return c.usageError("demo takes no arguments")
	}
	o.create = loadgen.NewSale(o.sale, "flashgate demo", 1000, 1, 1, 9900, time.Now())
	cfg, err := c.config()
	if err != nil {
		return err
	}
	return runBench(cfg, o, stdout, stderr)
}

func runBench(cfg config.Config, o benchOptions, stdout, stderr io.Writer) error {
	secret, kid, err := auth.SigningSecret(cfg.Auth)
	if err != nil {
		return err
	}
	ctx := context.Background()
	if o.create != nil {
		if _, err := adminapi.New(cfg).CreateSale(ctx, o.create); err != nil {
			return fmt.Errorf("create sale %s: %w", o.create.ID, err)
		}
		fmt.Fprintf(stderr, "%s: created sale %s\n", o.label, o.create.ID)
		loadgen.AwaitActive(ctx, o.target, o.sale, 15*time.Second, stderr)
	}
	// Tokens are minted before the clock starts; they outlive the run.
	tokens, err := loadgen.MintTokens(secret, kid, auth.IssuerOf(cfg.Auth, kid), o.users, max(time.Hour, o.duration+10*time.Minute))
	if err != nil {
		return err
	}
	if o.announce {
		fmt.Fprintf(stdout, "%s: sale %s, %d units, %d per user: firing %s from %d users, %d at a time, at %s\n",
			o.label, o.sale, o.create.Total, o.create.PerUserLimit, stopRule(o), o.users, o.concurrency, o.target)
	}

	// The first SIGINT stops the load and goes on to the audit; stop() then
	// hands signals back, so a second one ends the program.
	loadCtx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	res, err := loadgen.Run(loadCtx, loadgen.Config{
		Target: o.target, Sale: o.sale, Tokens: tokens, Concurrency: o.concurrency,
		Requests: o.requests, Duration: o.duration, Rate: o.rate, Quantity: o.quantity, Region: o.region,
		Idempotency: o.idempotency, ClientIPs: !o.oneIP, Progress: stderr,
	})
	stop()
	if err != nil {
		return err
	}
	res.Write(stdout)
	out := benchJSON{Label: o.label, Target: o.target, Sale: o.sale, Users: o.users, Concurrency: o.concurrency,
		Load: res.Summary()}
	if o.noCheck {
		return loadgen.WriteJSON(o.jsonPath, out)
	}

	fmt.Fprintf(stderr, "%s: waiting up to %s for the backend to write %d accepted orders\n",
		o.label, o.drainTimeout, len(res.Accepted))
	rep, waited, drained, err := loadgen.AwaitDrain(ctx, cfg, o.sale, res.Accepted, o.drainTimeout)
	if err != nil {
		return err
	}
	loadgen.WriteAudit(stdout, rep, len(res.Accepted), waited, drained)
	fmt.Fprintln(stdout, loadgen.SummaryLine(o.label, rep, res.BadOrderIDs))
	ok := rep.OK() && res.BadOrderIDs == 0
	out.Audit = &benchAudit{Report: rep, OK: ok, Drained: drained, DrainS: waited.Seconds()}
	if err := loadgen.WriteJSON(o.jsonPath, out); err != nil {
		return err
	}
	if !ok {
		return exitCode(1)
	}
	return nil
}

// benchJSON is what `bench --json` writes: the run's settings, its figures,
// and the audit when one ran.
type benchJSON struct {
	Label       string          `json:"label"`
	Target      string          `json:"target"`
	Sale        string          `json:"sale"`
	Users       int             `json:"users"`
	Concurrency int             `json:"concurrency"`
	Load        loadgen.Summary `json:"load"`
	Audit       *benchAudit     `json:"audit"` // null with --no-check
}

// benchAudit is the audit of a bench: the report, and OK when it found every
// invariant kept (and every 202 carried an order id).
type benchAudit struct {
	audit.Report
	OK      bool    `json:"ok"`
	Drained bool    `json:"drained"`
	DrainS  float64 `json:"drain_s"`
}

func stopRule(o benchOptions) string {
	if o.duration > 0 {
		return "requests for " + o.duration.String()
	}
	return strconv.FormatInt(o.requests, 10) + " requests"
}
