package main

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/auth"
)

// TestPaymentSign: `flashgate payment sign` prints a body and a header the
// gateway's verifier accepts: one v1 per secret given (rotation), the
// environment's secret by default; a time given with --at is the t signed.
func TestPaymentSign(t *testing.T) {
	t.Setenv("FLASHGATE_DEV", "1")
	sign := func(args ...string) (body, header string, err error) {
		t.Helper()
		var out, errOut bytes.Buffer
		err = run(append([]string{"payment", "sign", "--config", ""}, args...), &out, &errOut)
		lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
		if err != nil || len(lines) != 2 {
			return "", "", err
		}
		h, v, _ := strings.Cut(lines[1], ": ")
		if h != auth.PaymentHeader {
			t.Fatalf("second line %q is not a %s header", lines[1], auth.PaymentHeader)
		}
		return lines[0], v, nil
	}
	order := []string{"--order", "384390849045233664", "--sale", "phone", "--payment", "pi_3Nx.1:a", "--amount", "2500"}
	body, header, err := sign(append(order, "--secret", "new-secret,old-secret")...)
	if err != nil {
		t.Fatal(err)
	}
	var p flashgate.Payment
	if err := json.Unmarshal([]byte(body), &p); err != nil || p != (flashgate.Payment{OrderID: 384390849045233664, SaleID: "phone", PaymentID: "pi_3Nx.1:a", AmountCents: 2500}) {
		t.Fatalf("body %s: %+v %v", body, p, err)
	}
	if !strings.Contains(body, `"order_id":"384390849045233664"`) {
		t.Fatalf("the order id is not a string in %s", body)
	}
	for _, secrets := range [][]string{{"new-secret"}, {"old-secret"}, {"old-secret", "new-secret"}} {
		if err := auth.NewPaymentVerifier(secrets).Verify([]byte(header), []byte(body), time.Now()); err != nil {
			t.Errorf("verified with %v: %v", secrets, err)
		}
	}
	if err := auth.NewPaymentVerifier([]string{"other"}).Verify([]byte(header), []byte(body), time.Now()); err == nil {
		t.Error("verified with a secret it was not signed with")
	}
	// The environment's secret; a signature an hour old is out of the window.
	t.Setenv("FLASHGATE_PAYMENTS_SECRET", "env-secret")
	hourAgo := time.Now().Add(-time.Hour)
	body, header, err = sign(append(order, "--at", strconv.FormatInt(hourAgo.Unix(), 10))...)
	if err != nil {
		t.Fatal(err)
	}
	v := auth.NewPaymentVerifier([]string{"env-secret"})
	if err := v.Verify([]byte(header), []byte(body), hourAgo); err != nil {
		t.Errorf("env secret, at its own time: %v", err)
	}
	if err := v.Verify([]byte(header), []byte(body), time.Now()); err == nil {
		t.Error("a signature an hour old verified now")
	}
	// Refusals: a field missing, no secret anywhere.
	if _, _, err := sign("--order", "7", "--sale", "phone", "--amount", "1"); err == nil {
		t.Error("signed without --payment")
	}
	t.Setenv("FLASHGATE_PAYMENTS_SECRET", "")
	if _, _, err := sign(order...); err == nil || !strings.Contains(err.Error(), "FLASHGATE_PAYMENTS_SECRET") {
		t.Errorf("no secret: %v", err)
	}
}
