package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/flashgate/flashgate/adminapi"
)

const orderUsage = `usage: flashgate order <show|list|cancel> ...

  order show ID                          one order as MySQL has it (GET /admin/v1/orders/ID)
  order list --sale S [--user U] [--limit N] [--after ID] [--all]
                                         a sale's orders in id order, a page at a time; --all follows
                                         every page (GET /admin/v1/orders)
  order cancel ID --reason TEXT          cancel a confirmed order as its buyer would, the units back on
                                         sale; the reason and your key are in the audit log (operator)
`

func orderCmd(args []string, stdout, stderr io.Writer) error {
	return dispatch("order", orderUsage, map[string]subcommand{
		"show": orderShowCmd, "list": orderListCmd, "cancel": orderCancelCmd,
	}, args, stdout, stderr)
}

func orderShowCmd(args []string, stdout, stderr io.Writer) error {
	_, body, err := callOne("order show", "order id", http.MethodGet, func(id string) string { return "/admin/v1/orders/" + id }, args, stderr)
	if err != nil {
		return err
	}
	writePretty(stdout, body)
	return nil
}

func orderCancelCmd(args []string, stdout, stderr io.Writer) error {
	c := newCommand("order cancel", "ID --reason TEXT", stderr)
	reason := c.String("reason", "", "why (required; recorded in the audit log)")
	pos, err := c.parse(args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return c.usageError("order cancel takes one order id")
	}
	if *reason == "" {
		return c.usageError("--reason is required")
	}
	cfg, err := c.config()
	if err != nil {
		return err
	}
	body, err := adminapi.New(cfg).Do(context.Background(), http.MethodPost, "/admin/v1/orders/"+url.PathEscape(pos[0])+"/cancel",
		map[string]string{"reason": *reason})
	if err != nil {
		return err
	}
	writePretty(stdout, body)
	return nil
}

// orderRow is an order of GET /admin/v1/orders.
type orderRow struct {
	OrderID   string    `json:"order_id"`
	UserID    string    `json:"user_id"`
	Quantity  int64     `json:"quantity"`
	Region    string    `json:"region"`
	Status    string    `json:"status"`
	Reason    string    `json:"reason"`
	CreatedAt time.Time `json:"created_at"`
}

func orderListCmd(args []string, stdout, stderr io.Writer) error {
	c := newCommand("order list", "--sale S [--user U] [--limit N] [--after ID] [--all]", stderr)
	sale := c.String("sale", "", "the sale (required)")
	user := c.String("user", "", "only this buyer's orders")
	limit := c.Int("limit", 100, "orders per page (1-1000)")
	after := c.String("after", "", "start after this order `id` (the next page)")
	all := c.Bool("all", false, "follow every page to the end")
	pos, err := c.parse(args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return c.usageError("unexpected arguments %q", pos)
	}
	if *sale == "" {
		return c.usageError("--sale is required")
	}
	cfg, err := c.config()
	if err != nil {
		return err
	}
	cl := adminapi.New(cfg)
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ORDER\tUSER\tQTY\tREGION\tSTATUS\tREASON\tCREATED")
	next := *after
	for {
		q := url.Values{"sale": {*sale}, "limit": {strconv.Itoa(*limit)}}
		if *user != "" {
			q.Set("user", *user)
		}
		if next != "" {
			q.Set("after", next)
		}
		body, err := cl.Do(context.Background(), http.MethodGet, "/admin/v1/orders?"+q.Encode(), nil)
		if err != nil {
			return err
		}
		var page struct {
			Orders []orderRow `json:"orders"`
			Next   string     `json:"next"`
		}
		if err := json.Unmarshal(body, &page); err != nil {
			return fmt.Errorf("admin API: %w", err)
		}
		dash := func(s string) string {
			if s == "" {
				return "-"
			}
			return s
		}
		for _, o := range page.Orders {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", o.OrderID, o.UserID, o.Quantity, dash(o.Region), o.Status, dash(o.Reason),
				o.CreatedAt.UTC().Format(time.RFC3339Nano))
		}
		next = page.Next
		if next == "" || !*all {
			break
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if next != "" {
		fmt.Fprintf(stderr, "more: --after %s\n", next)
	}
	return nil
}

// saleExportCmd is `flashgate sale export ID --format csv|json [--out FILE]`:
// every order of the sale, streamed from the backend to the file or stdout.
func saleExportCmd(args []string, stdout, stderr io.Writer) error {
	c := newCommand("sale export", "ID [--format csv|json] [--out FILE]", stderr)
	format := c.String("format", "csv", "csv or json")
	out := c.String("out", "", "write to this `file` instead of stdout (removed if the export fails)")
	pos, err := c.parse(args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return c.usageError("sale export takes one sale id")
	}
	if *format != "csv" && *format != "json" {
		return c.usageError("--format csv or json")
	}
	cfg, err := c.config()
	if err != nil {
		return err
	}
	w := stdout
	var f *os.File
	if *out != "" {
		if f, err = os.Create(*out); err != nil {
			return err
		}
		w = f
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	path := "/admin/v1/sales/" + url.PathEscape(pos[0]) + "/export?format=" + url.QueryEscape(*format)
	err = adminapi.New(cfg).Stream(context.Background(), path, bw)
	if err == nil {
		err = bw.Flush()
	}
	if f != nil {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(*out)
		}
	}
	return err
}
