package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/flashgate/flashgate/adminapi"
)

// exitBroken is sale audit's status when an invariant is broken (2 is a
// wrong invocation, 1 an audit that could not run).
const exitBroken = 3

// saleAuditCmd is `flashgate sale audit ID`: GET /admin/v1/sales/ID/audit,
// printed, and an exit status for scripts.
func saleAuditCmd(args []string, stdout, stderr io.Writer) error {
	sale, body, err := callOne("sale audit", "sale id", http.MethodGet, func(id string) string { return "/admin/v1/sales/" + id + "/audit" }, args, stderr)
	if err != nil {
		return err
	}
	writePretty(stdout, body)
	var rep struct {
		Holds   bool `json:"holds"`
		Drained bool `json:"drained"`
	}
	if err := json.Unmarshal(body, &rep); err != nil {
		return fmt.Errorf("admin API: %w", err)
	}
	switch {
	case !rep.Holds:
		fmt.Fprintf(stderr, "flashgate: sale %s: an invariant is broken (see above)", sale)
		if !rep.Drained {
			fmt.Fprint(stderr, "; orders are still in flight: audit again once drained")
		}
		fmt.Fprintln(stderr)
		return exitCode(exitBroken)
	case !rep.Drained:
		fmt.Fprintf(stderr, "flashgate: sale %s: invariants hold so far; orders are still in flight\n", sale)
	}
	return nil
}

// auditLogCmd is `flashgate audit-log [--sale S]`: who changed what, newest first.
func auditLogCmd(args []string, stdout, stderr io.Writer) error {
	c := newCommand("audit-log", "[--sale S] [--limit N] [--before ID] [--json]", stderr)
	body, err := pagedList(c, args, "/admin/v1/audit-log", "only the changes of this sale", "before", "entries older than this `id` (the next page)", stdout)
	if err != nil || body == nil {
		return err
	}
	var log struct {
		Entries []struct {
			ID     uint64          `json:"id"`
			At     time.Time       `json:"at"`
			KeyID  string          `json:"key_id"`
			Role   string          `json:"role"`
			Source string          `json:"source"`
			Action string          `json:"action"`
			SaleID string          `json:"sale_id"`
			Target string          `json:"target"`
			Before json.RawMessage `json:"before"`
			After  json.RawMessage `json:"after"`
		} `json:"entries"`
	}
	if err := json.Unmarshal(body, &log); err != nil {
		return fmt.Errorf("admin API: %w", err)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tAT\tKEY\tSOURCE\tACTION\tSALE\tTARGET\tBEFORE\tAFTER")
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	for _, e := range log.Entries {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.ID, e.At.UTC().Format(time.RFC3339Nano), e.KeyID+"("+e.Role+")",
			e.Source, e.Action, dash(e.SaleID), dash(e.Target), e.Before, e.After)
	}
	return tw.Flush()
}

// pagedList is what the paged listings of the admin API share (dlq list,
// audit-log): --sale, --limit, a cursor flag, --json. It answers the page's
// body, or nil when it printed the JSON itself (--json).
func pagedList(c *command, args []string, path, saleHelp, cursor, cursorHelp string, stdout io.Writer) ([]byte, error) {
	sale := c.String("sale", "", saleHelp)
	limit := c.Int("limit", 100, "at most this many (1-1000)")
	from := c.Uint64(cursor, 0, cursorHelp)
	asJSON := c.Bool("json", false, "print the admin API's JSON instead of a table")
	pos, err := c.parse(args)
	if err != nil {
		return nil, err
	}
	if len(pos) > 0 {
		return nil, c.usageError("unexpected arguments %q", pos)
	}
	cfg, err := c.config()
	if err != nil {
		return nil, err
	}
	q := url.Values{"limit": {strconv.Itoa(*limit)}}
	if *sale != "" {
		q.Set("sale", *sale)
	}
	if *from > 0 {
		q.Set(cursor, strconv.FormatUint(*from, 10))
	}
	body, err := adminapi.New(cfg).Do(context.Background(), http.MethodGet, path+"?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	if *asJSON {
		writePretty(stdout, body)
		return nil, nil
	}
	return body, nil
}
