package auth

import (
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestVerifyPayment: what a payment signature must be to pass, case by case
// (pure logic: HMAC and parsing; the HTTP path is e2e.TestPayments).
func TestVerifyPayment(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	oldS, newS, other := strings.Repeat("o", 32), strings.Repeat("n", 32), strings.Repeat("x", 32)
	body := []byte(`{"order_id":"7","sale_id":"s","payment_id":"pi_1","amount_cents":100}`)
	at := func(d time.Duration) int64 { return now.Add(d).Unix() }
	sig := func(secret string, t int64) string { return SignPayment(secret, t, body) }
	ts := func(t int64) string { return "t=" + strconv.FormatInt(t, 10) }
	cases := []struct {
		name    string
		secrets []string
		header  string
		body    []byte
		err     error // nil: accepted
	}{
		{"signed", []string{oldS}, ts(at(0)) + ",v1=" + sig(oldS, at(0)), body, nil},
		{"as PaymentSignature writes it", []string{oldS}, PaymentSignature([]string{oldS}, now, body), body, nil},
		{"spaces around entries", []string{oldS}, ts(at(0)) + ", v1=" + sig(oldS, at(0)), body, nil},
		{"an unknown scheme beside", []string{oldS}, ts(at(0)) + ",v0=abc,v1=" + sig(oldS, at(0)), body, nil},
		{"4m59s old", []string{oldS}, ts(at(-299*time.Second)) + ",v1=" + sig(oldS, at(-299*time.Second)), body, nil},
		{"5m old, the edge", []string{oldS}, ts(at(-5*time.Minute)) + ",v1=" + sig(oldS, at(-5*time.Minute)), body, nil},
		{"5m1s old: a replay", []string{oldS}, ts(at(-301*time.Second)) + ",v1=" + sig(oldS, at(-301*time.Second)), body, errSigWindow},
		{"an hour old", []string{oldS}, ts(at(-time.Hour)) + ",v1=" + sig(oldS, at(-time.Hour)), body, errSigWindow},
		{"5m1s ahead", []string{oldS}, ts(at(301*time.Second)) + ",v1=" + sig(oldS, at(301*time.Second)), body, errSigWindow},
		{"rotating: both v1, verifier knows the old", []string{oldS}, PaymentSignature([]string{newS, oldS}, now, body), body, nil},
		{"rotating: both v1, verifier knows the new", []string{newS}, PaymentSignature([]string{newS, oldS}, now, body), body, nil},
		{"rotating: verifier knows both, one v1", []string{newS, oldS}, PaymentSignature([]string{oldS}, now, body), body, nil},
		{"another secret", []string{oldS}, PaymentSignature([]string{other}, now, body), body, errSigMismatch},
		{"another body", []string{oldS}, PaymentSignature([]string{oldS}, now, body), append([]byte(" "), body...), errSigMismatch},
		{"t changed after signing", []string{oldS}, ts(at(time.Second)) + ",v1=" + sig(oldS, at(0)), body, errSigMismatch},
		{"one hex digit off", []string{oldS}, ts(at(0)) + ",v1=" + flip(sig(oldS, at(0))), body, errSigMismatch},
		{"no header", []string{oldS}, "", body, errSigMissing},
		{"no t", []string{oldS}, "v1=" + sig(oldS, at(0)), body, errSigMalformed},
		{"no v1", []string{oldS}, ts(at(0)), body, errSigMalformed},
		{"two t", []string{oldS}, ts(at(0)) + "," + ts(at(0)) + ",v1=" + sig(oldS, at(0)), body, errSigMalformed},
		{"a signed t", []string{oldS}, "t=+" + strconv.FormatInt(at(0), 10) + ",v1=" + sig(oldS, at(0)), body, errSigMalformed},
		{"a short v1", []string{oldS}, ts(at(0)) + ",v1=" + sig(oldS, at(0))[:62], body, errSigMalformed},
		{"v1 not hex", []string{oldS}, ts(at(0)) + ",v1=" + strings.Repeat("z", 64), body, errSigMalformed},
		{"an entry without =", []string{oldS}, ts(at(0)) + ",v1", body, errSigMalformed},
		{"too many v1", []string{oldS}, ts(at(0)) + strings.Repeat(",v1="+sig(other, at(0)), maxPaymentSigs) + ",v1=" + sig(oldS, at(0)), body, errSigMalformed},
		{"no secret configured", nil, PaymentSignature([]string{oldS}, now, body), body, errSigNoSecret},
	}
	for _, c := range cases {
		err := NewPaymentVerifier(c.secrets).Verify([]byte(c.header), c.body, now)
		if !errors.Is(err, c.err) || (err != nil && !errors.Is(err, ErrBadSignature)) {
			t.Errorf("%s: %v, want %v", c.name, err, c.err)
		}
	}
}

// flip changes the last hex digit of s.
func flip(s string) string {
	last := byte('0')
	if s[len(s)-1] == '0' {
		last = '1'
	}
	return s[:len(s)-1] + string(last)
}

// TestSignPaymentKnownAnswer pins the scheme: HMAC-SHA256 over "<t>.<body>",
// hex (a shop that signs in another language compares against this).
func TestSignPaymentKnownAnswer(t *testing.T) {
	// printf '%s' '1700000000.{}' | openssl dgst -sha256 -hmac secret
	if got, want := SignPayment("secret", 1700000000, []byte("{}")), "b8569b78799ff9e3cbff0fc2d63a33a2b57f3282abd07c37ae5e8e7d79a5f163"; got != want {
		t.Fatalf("SignPayment = %s, want %s", got, want)
	}
}

// FuzzVerifyPayment: no header makes Verify panic, and only a header with a
// v1 signed by the secret passes.
func FuzzVerifyPayment(f *testing.F) {
	now := time.Unix(1_800_000_000, 0)
	secret := strings.Repeat("s", 32)
	f.Add([]byte(PaymentSignature([]string{secret}, now, []byte("{}"))), []byte("{}"))
	f.Add([]byte("t=1,v1=00"), []byte("x"))
	f.Add([]byte(",,=,t=,v1="), []byte(""))
	v := NewPaymentVerifier([]string{secret})
	f.Fuzz(func(t *testing.T, header, body []byte) {
		if err := v.Verify(header, body, now); err == nil {
			want := hex.EncodeToString(paymentMAC([]byte(secret), []byte(tOf(header)), body))
			if !strings.Contains(strings.ToLower(string(header)), "v1="+want) {
				t.Fatalf("%q over %q passed without its signature", header, body)
			}
		}
	})
}

// tOf is the t of a header Verify accepted, as written.
func tOf(h []byte) string {
	for _, item := range strings.Split(string(h), ",") {
		if k, v, _ := strings.Cut(strings.TrimSpace(item), "="); k == "t" {
			return v
		}
	}
	return ""
}
