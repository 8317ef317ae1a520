package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/adminapi"
)

const saleUsage = `usage: flashgate sale <create|show|close|reconcile> ...

  sale create --id ID --title T --price-cents N --total N --starts-at T (--ends-at T | --duration D)
              --per-user-limit N --per-order-max N [--region bj=400 ...]
  sale show ID          the ledger (GET /admin/v1/sales/ID)
  sale close ID         stop selling now
  sale reconcile ID     repair and report

Times are RFC 3339, "now", or offsets from now such as "+30s" or "-5m".
`

func saleCmd(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, saleUsage)
		return exitCode(2)
	}
	switch args[0] {
	case "create":
		return saleCreateCmd(args[1:], stdout, stderr)
	case "show", "close", "reconcile":
		return saleActionCmd(args[0], args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, saleUsage)
		return nil
	}
	fmt.Fprintf(stderr, "flashgate: unknown sale command %q\n\n%s", args[0], saleUsage)
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
	c := newCommand("sale "+action, "ID", stderr)
	pos, err := c.parse(args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return c.usageError("sale %s takes one sale id", action)
	}
	cfg, err := c.config()
	if err != nil {
		return err
	}
	path := "/admin/v1/sales/" + url.PathEscape(pos[0])
	method := http.MethodGet
	if action != "show" {
		method, path = http.MethodPost, path+"/"+action
	}
	body, err := adminapi.New(cfg).Do(context.Background(), method, path, nil)
	if err != nil {
		return err
	}
	writePretty(stdout, body)
	return nil
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
