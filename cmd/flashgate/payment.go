package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/auth"
)

// paymentCmd is `flashgate payment sign`: what the shop's payment service
// sends to POST /v1/payments (docs/payments.md), for scripts and tests.
func paymentCmd(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "sign" {
		fmt.Fprint(stderr, "usage: flashgate payment sign --order ID --sale ID --payment ID --amount CENTS [--secret S]... [--at UNIX]\n")
		return exitCode(2)
	}
	c := newCommand("payment sign", "--order ID --sale ID --payment ID --amount CENTS [--secret S]... [--at UNIX]", stderr)
	var p flashgate.Payment
	c.Func("order", "order `id` (decimal)", func(s string) error {
		_, err := fmt.Sscan(s, &p.OrderID)
		return err
	})
	c.StringVar(&p.SaleID, "sale", "", "sale `id`")
	c.StringVar(&p.PaymentID, "payment", "", "the payment service's payment `id` (1-64 of [A-Za-z0-9_.:-])")
	c.Int64Var(&p.AmountCents, "amount", -1, "amount paid, in `cents` (the order's price × quantity)")
	var secrets []string
	c.Func("secret", "sign with this `secret` (repeat, or commas, for one v1 per secret while rotating; default payments.secret, FLASHGATE_PAYMENTS_SECRET)", func(s string) error {
		for _, v := range strings.Split(s, ",") {
			if v = strings.TrimSpace(v); v != "" {
				secrets = append(secrets, v)
			}
		}
		return nil
	})
	at := c.Int64("at", 0, "sign as if at this unix `second` (default now)")
	pos, err := c.parse(args[1:])
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return c.usageError("payment sign takes no arguments")
	}
	if err := p.Validate(); err != nil {
		return c.usageError("%s (--order, --sale, --payment and --amount are required)", strings.TrimPrefix(err.Error(), flashgate.ErrInvalid.Error()+": "))
	}
	if len(secrets) == 0 {
		cfg, err := c.config()
		if err != nil {
			return err
		}
		if secrets = cfg.Payments.Secret; len(secrets) == 0 {
			return errors.New("no payments secret: give --secret, or set FLASHGATE_PAYMENTS_SECRET (or payments.secret)")
		}
	}
	when := time.Now()
	if *at != 0 {
		when = time.Unix(*at, 0)
	}
	body, err := json.Marshal(p)
	if err != nil {
		return err
	}
	// Line 1 the body, line 2 the header, as sent:
	// { read -r body; read -r sig; } < <(flashgate payment sign ...)
	// curl -XPOST "$FLASHGATE_PUBLIC_URL/v1/payments" -H "$sig" -d "$body"
	fmt.Fprintf(stdout, "%s\n%s: %s\n", body, auth.PaymentHeader, auth.PaymentSignature(secrets, when, body))
	return nil
}
