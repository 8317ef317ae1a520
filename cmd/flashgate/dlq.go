package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"text/tabwriter"
	"time"
)

const dlqUsage = `usage: flashgate dlq <list|redrive> ...

  dlq list [--sale S] [--limit N] [--after SEQ] [--json]
                    the dead-letter stream's messages: sequence, when, kind, sale, order, buyer, why
  dlq redrive SEQ   republish dead letter SEQ's order to the orders stream once its cause is fixed
                    (operator; docs/runbook.md, FlashgateDeadLetters)
`

func dlqCmd(args []string, stdout, stderr io.Writer) error {
	return dispatch("dlq", dlqUsage, map[string]subcommand{"list": dlqListCmd, "redrive": dlqRedriveCmd}, args, stdout, stderr)
}

func dlqListCmd(args []string, stdout, stderr io.Writer) error {
	c := newCommand("dlq list", "[--sale S] [--limit N] [--after SEQ] [--json]", stderr)
	body, err := pagedList(c, args, "/admin/v1/dlq", "only this sale's dead letters", "after", "after this `sequence` (the next page)", stdout)
	if err != nil || body == nil {
		return err
	}
	var page struct {
		DeadLetters []struct {
			Seq      uint64    `json:"seq"`
			At       time.Time `json:"at"`
			Kind     string    `json:"kind"`
			SaleID   string    `json:"sale_id"`
			OrderID  string    `json:"order_id"`
			UserID   string    `json:"user_id"`
			Quantity int64     `json:"quantity"`
			Error    string    `json:"error"`
		} `json:"dead_letters"`
		Next string `json:"next"`
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
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tAT\tKIND\tSALE\tORDER\tUSER\tQTY\tERROR")
	for _, d := range page.DeadLetters {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", d.Seq, d.At.UTC().Format(time.RFC3339), d.Kind, dash(d.SaleID),
			dash(d.OrderID), dash(d.UserID), d.Quantity, dash(d.Error))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if page.Next != "" {
		fmt.Fprintf(stderr, "more: --after %s\n", page.Next)
	}
	return nil
}

func dlqRedriveCmd(args []string, stdout, stderr io.Writer) error {
	_, body, err := callOne("dlq redrive", "dead letter's sequence (flashgate dlq list)", http.MethodPost,
		func(seq string) string { return "/admin/v1/dlq/" + seq + "/redrive" }, args, stderr)
	if err != nil {
		return err
	}
	writePretty(stdout, body)
	return nil
}
