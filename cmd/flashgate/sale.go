package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/adminapi"
)

const saleUsage = `usage: flashgate sale <create|list|show|update|pause|resume|close|reconcile|audit|export> ...

  sale create --id ID --title T --price-cents N --total N --starts-at T (--ends-at T | --duration D)
              --per-user-limit N --per-order-max N [--region bj=400 ...]
              [--degrade closed|mysql [--degrade-rate N]]
  sale list [--limit N] the newest sales, one line each (GET /admin/v1/sales)
  sale show ID          the ledger (GET /admin/v1/sales/ID)
  sale update ID [--starts-at T] [--ends-at T] [--total N] [--region NAME=UNITS ...] [--per-user-limit N] [--per-order-max N]
                 [--limit DIM:MAX[:units|orders][:sale|day|month] ...]
                        change a live sale; a change that would invalidate counts already
                        taken is refused with the reason (PATCH /admin/v1/sales/ID)
  sale pause ID         purchases answer 503 paused (Retry-After) and reserve nothing, until resumed
  sale resume ID        sell again
  sale close ID         stop selling now
  sale reconcile ID     repair and report
  sale audit ID         check every invariant of docs/design.md §2 from MySQL, Redis and the stream,
                        without load; exit 0 if they hold, 3 if one is broken (docs/runbook.md)
  sale export ID [--format csv|json] [--out FILE]
                        every order of the sale, streamed (GET /admin/v1/sales/ID/export)

Times are RFC 3339, "now", or offsets from now such as "+30s" or "-5m".
`

func saleCmd(args []string, stdout, stderr io.Writer) error {
	action := func(a string) subcommand {
		return func(args []string, stdout, stderr io.Writer) error { return saleActionCmd(a, args, stdout, stderr) }
	}
	return dispatch("sale", saleUsage, map[string]subcommand{
		"create": saleCreateCmd, "list": saleListCmd, "update": saleUpdateCmd,
		"show": action("show"), "close": action("close"), "reconcile": action("reconcile"),
		"pause": action("pause"), "resume": action("resume"),
		"audit": saleAuditCmd, "export": saleExportCmd,
	}, args, stdout, stderr)
}

// subcommand is one command of a noun (sale create, order show, dlq list).
type subcommand func(args []string, stdout, stderr io.Writer) error

// dispatch runs the subcommand args[0] of noun, or prints usage: to stdout
// when asked for, to stderr with exit status 2 when none or an unknown one
// is named.
func dispatch(noun, usage string, cmds map[string]subcommand, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitCode(2)
	}
	if cmd, ok := cmds[args[0]]; ok {
		return cmd(args[1:], stdout, stderr)
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprintf(stderr, "flashgate: unknown %s command %q\n\n%s", noun, args[0], usage)
	return exitCode(2)
}

func saleCreateCmd(args []string, stdout, stderr io.Writer) error {
	c := newCommand("sale create", "--id ID --total N [flags]", stderr)
	id := c.String("id", "", "sale `id`: 1-64 characters of [A-Za-z0-9_-]")
	title := c.String("title", "", "title (default: the id)")
	price := c.Int64("price-cents", 0, "price in cents")
	total := c.Int64("total", 0, "units on sale")
	startsAt := c.String("starts-at", "now", "start `time`: RFC 3339, now, or +30s-style offset")
	endsAt := c.String("ends-at", "", "end `time` (RFC 3339, now, +1h); or give --duration")
	duration := c.Duration("duration", 0, "length of the sale from starts-at (default 1h unless --ends-at)")
	perUser := c.Int64("per-user-limit", 1, "units one user may hold")
	perOrder := c.Int64("per-order-max", 1, "units one order may buy")
	regions := mapFlag{}
	c.Var(regions, "region", "`NAME=UNITS` of a region; repeat for each (units add up to --total)")
	var limits limitsFlag
	c.Var(&limits, "limit", "a purchase limit `DIM:MAX[:units|orders][:sale|day|month]`, DIM one of user, phone, device, ip, address (e.g. phone:1:orders:day); repeat for each")
	tz := c.String("time-zone", "UTC", "IANA time `zone` in which day and month limit windows begin (e.g. Asia/Shanghai)")
	degrade := c.String("degrade", "closed", "what purchases meet while the sale's Redis is unreachable: closed (503) or mysql (docs/degrade.md)")
	degradeRate := c.Int64("degrade-rate", 0, "with --degrade mysql: purchases in flight per gateway on the MySQL lane (0: the default)")
	buckets := c.Int("buckets", 1, "stock `buckets`: split the stock over K Redis hash tags, 1-64 (docs/buckets.md)")
	pos, err := c.parse(args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return c.usageError("unexpected arguments %q", pos)
	}
	if *title == "" {
		*title = *id
	}
	now := time.Now()
	start, end, err := saleWindow(*startsAt, *endsAt, *duration, now)
	if err != nil {
		return c.usageError("%v", err)
	}
	sale := flashgate.Sale{
		ID: *id, Title: *title, PriceCents: *price, Total: *total, StartsAt: start, EndsAt: end,
		PerUserLimit: *perUser, PerOrderMax: *perOrder, Limits: limits, TimeZone: *tz,
		Degrade: *degrade, DegradeRate: *degradeRate,
	}
	if *buckets != 1 {
		sale.Buckets = *buckets
	}
	if len(regions) > 0 {
		sale.Regions = regions
	}
	if err := sale.Validate(); err != nil {
		return fmt.Errorf("sale %s: %w", sale.ID, err)
	}
	cfg, err := c.config()
	if err != nil {
		return err
	}
	body, err := adminapi.New(cfg).CreateSale(context.Background(), &sale)
	if err != nil {
		return err
	}
	writePretty(stdout, body)
	return nil
}

func saleActionCmd(action string, args []string, stdout, stderr io.Writer) error {
	method, suffix := http.MethodPost, "/"+action
	if action == "show" {
		method, suffix = http.MethodGet, ""
	}
	_, body, err := callOne("sale "+action, "sale id", method, func(id string) string { return "/admin/v1/sales/" + id + suffix }, args, stderr)
	if err != nil {
		return err
	}
	writePretty(stdout, body)
	return nil
}

// callOne is the admin API call of a command that takes one id and no
// flags: it answers the id and the body.
func callOne(name, what, method string, path func(escapedID string) string, args []string, stderr io.Writer) (id string, body []byte, err error) {
	c := newCommand(name, "ID", stderr)
	pos, err := c.parse(args)
	if err != nil {
		return "", nil, err
	}
	if len(pos) != 1 {
		return "", nil, c.usageError("%s takes one %s", name, what)
	}
	cfg, err := c.config()
	if err != nil {
		return "", nil, err
	}
	body, err = adminapi.New(cfg).Do(context.Background(), method, path(url.PathEscape(pos[0])), nil)
	return pos[0], body, err
}

// saleWindow turns the time flags into a window.
func saleWindow(startsAt, endsAt string, d time.Duration, now time.Time) (start, end time.Time, err error) {
	if start, err = parseTime(startsAt, now); err != nil {
		return start, end, fmt.Errorf("--starts-at: %w", err)
	}
	switch {
	case endsAt != "" && d != 0:
		return start, end, errors.New("give --ends-at or --duration, not both")
	case endsAt != "":
		if end, err = parseTime(endsAt, now); err != nil {
			return start, end, fmt.Errorf("--ends-at: %w", err)
		}
	case d < 0:
		return start, end, errors.New("--duration must be positive")
	case d == 0:
		end = start.Add(time.Hour)
	default:
		end = start.Add(d)
	}
	return start, end, nil
}

// parseTime reads "now", an offset from now ("+30s", "-5m", in
// time.ParseDuration's syntax) or an RFC 3339 time. Times taken from now are
// truncated to the second: a sale that "starts now" is already on.
func parseTime(s string, now time.Time) (time.Time, error) {
	switch {
	case s == "now":
		return now.Truncate(time.Second), nil
	case strings.HasPrefix(s, "+") || strings.HasPrefix(s, "-"):
		d, err := time.ParseDuration(s)
		if err != nil {
			return time.Time{}, fmt.Errorf("offset %q: %w", s, err)
		}
		return now.Add(d).Truncate(time.Second), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is not RFC 3339, now, or an offset like +30s", s)
	}
	return t, nil
}

// writePretty prints JSON indented, anything else as it came.
func writePretty(w io.Writer, b []byte) {
	var buf bytes.Buffer
	if json.Indent(&buf, b, "", "  ") == nil {
		buf.WriteByte('\n')
		_, _ = w.Write(buf.Bytes())
		return
	}
	_, _ = w.Write(b)
	if len(b) > 0 && b[len(b)-1] != '\n' {
		fmt.Fprintln(w)
	}
}

// limitsFlag is a repeatable --limit DIM:MAX[:units|orders][:sale|day|month].
type limitsFlag []flashgate.Limit

func (l *limitsFlag) String() string {
	parts := make([]string, len(*l))
	for i, x := range *l {
		parts[i] = fmt.Sprintf("%s:%d:%s:%s", x.Dimension, x.Max, x.Of, x.Per)
	}
	return strings.Join(parts, ",")
}

func (l *limitsFlag) Set(s string) error {
	f := strings.Split(s, ":")
	if len(f) < 2 || len(f) > 4 {
		return errors.New("want DIM:MAX[:units|orders][:sale|day|month]")
	}
	max, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return fmt.Errorf("max of %s: %w", f[0], err)
	}
	x := flashgate.Limit{Dimension: flashgate.Dimension(f[0]), Max: max}
	for _, w := range f[2:] {
		switch w {
		case flashgate.OfUnits, flashgate.OfOrders:
			x.Of = w
		case flashgate.PerSale, flashgate.PerDay, flashgate.PerMonth:
			x.Per = w
		default:
			return fmt.Errorf("%q: want units, orders, sale, day or month", w)
		}
	}
	*l = append(*l, x)
	return nil
}

func saleListCmd(args []string, stdout, stderr io.Writer) error {
	c := newCommand("sale list", "[--limit N] [--json]", stderr)
	limit := c.Int("limit", 100, "at most this many sales, newest start first (1-1000)")
	asJSON := c.Bool("json", false, "print the admin API's JSON instead of a table")
	pos, err := c.parse(args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return c.usageError("unexpected arguments %q", pos)
	}
	cfg, err := c.config()
	if err != nil {
		return err
	}
	body, err := adminapi.New(cfg).Do(context.Background(), http.MethodGet, "/admin/v1/sales?limit="+strconv.Itoa(*limit), nil)
	if err != nil {
		return err
	}
	if *asJSON {
		writePretty(stdout, body)
		return nil
	}
	var list struct {
		Sales []struct {
			flashgate.Sale
			Sold int64 `json:"sold"`
		} `json:"sales"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return fmt.Errorf("admin API: %w", err)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tSOLD/TOTAL\tPER USER\tPER ORDER\tSTARTS\tENDS")
	now := time.Now()
	for _, s := range list.Sales {
		state := "open"
		switch {
		case s.Closed:
			state = "closed"
		case s.Paused:
			state = "paused"
		case !s.EndsAt.After(now):
			state = "ended"
		case s.StartsAt.After(now):
			state = "upcoming"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%d\t%d\t%s\t%s\n", s.ID, state, s.Sold, s.Total, s.PerUserLimit, s.PerOrderMax,
			s.StartsAt.UTC().Format(time.RFC3339), s.EndsAt.UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}

func saleUpdateCmd(args []string, stdout, stderr io.Writer) error {
	c := newCommand("sale update", "ID [--starts-at T] [--ends-at T] [--total N] [--region NAME=UNITS ...] [--per-user-limit N] [--per-order-max N]", stderr)
	startsAt := c.String("starts-at", "", "new start `time`: RFC 3339, now, or +30s-style offset (only before the sale starts)")
	endsAt := c.String("ends-at", "", "new end `time`: RFC 3339 or +1h-style offset (in the future)")
	total := c.Int64("total", 0, "new units on sale (not below what is sold and reserved)")
	perUser := c.Int64("per-user-limit", 0, "new units one user may hold (not below what a buyer already holds)")
	perOrder := c.Int64("per-order-max", 0, "new units one order may buy")
	var limits limitsFlag
	c.Var(&limits, "limit", "the sale's purchase limits with new maxima, all of them in order, as at create: `DIM:MAX[:units|orders][:sale|day|month]`; repeat for each")
	regions := mapFlag{}
	c.Var(regions, "region", "`NAME=UNITS`: a region's new units, every region of the sale (the total becomes their sum); repeat for each")
	pos, err := c.parse(args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return c.usageError("sale update takes one sale id")
	}
	patch := map[string]any{}
	now := time.Now()
	for flag, v := range map[string]string{"starts_at": *startsAt, "ends_at": *endsAt} {
		if v == "" {
			continue
		}
		t, err := parseTime(v, now)
		if err != nil {
			return c.usageError("--%s: %v", strings.ReplaceAll(flag, "_", "-"), err)
		}
		patch[flag] = t
	}
	c.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "total":
			patch["total"] = *total
		case "per-user-limit":
			patch["per_user_limit"] = *perUser
		case "per-order-max":
			patch["per_order_max"] = *perOrder
		case "limit":
			patch["limits"] = []flashgate.Limit(limits)
		case "region":
			patch["regions"] = map[string]int64(regions)
		}
	})
	if len(patch) == 0 {
		return c.usageError("nothing to change: give --starts-at, --ends-at, --total, --region, --per-user-limit, --per-order-max or --limit")
	}
	cfg, err := c.config()
	if err != nil {
		return err
	}
	body, err := adminapi.New(cfg).Do(context.Background(), http.MethodPatch, "/admin/v1/sales/"+url.PathEscape(pos[0]), patch)
	if err != nil {
		return err
	}
	writePretty(stdout, body)
	return nil
}
