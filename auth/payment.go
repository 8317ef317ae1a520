package auth

// The payment service's signature (docs/design.md §3 "Payments", docs/payments.md):
// header Flashgate-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>,
// one v1 per secret the service signs with while a secret is rotated.

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"
)

const (
	// PaymentHeader carries the signature of a payment callback.
	PaymentHeader = "Flashgate-Signature"
	// PaymentTolerance is how far a signature's t may be from the gateway's
	// clock, either way: an older (replayed) or later request is refused.
	PaymentTolerance = 5 * time.Minute
	// maxPaymentSigs bounds the v1 entries one header may bring (each costs
	// a comparison per secret).
	maxPaymentSigs = 8
)

// ErrBadSignature wraps every reason a payment's signature is refused; the
// reason's text is what the caller is told.
var ErrBadSignature = errors.New("bad signature")

var (
	errSigMissing   = fmt.Errorf("%w: no %s header", ErrBadSignature, PaymentHeader)
	errSigMalformed = fmt.Errorf("%w: %s must be t=<unix seconds>,v1=<hex HMAC-SHA256>[,v1=…]", ErrBadSignature, PaymentHeader)
	errSigWindow    = fmt.Errorf("%w: t is more than %s from now (replayed, or a clock off)", ErrBadSignature, PaymentTolerance)
	errSigMismatch  = fmt.Errorf("%w: no v1 matches a payments secret", ErrBadSignature)
	errSigNoSecret  = fmt.Errorf("%w: this gateway has no payments secret", ErrBadSignature)
)

// SignPayment is the v1 signature of body sent at unix second t.
func SignPayment(secret string, t int64, body []byte) string {
	return hex.EncodeToString(paymentMAC([]byte(secret), strconv.AppendInt(nil, t, 10), body))
}

// PaymentSignature is the Flashgate-Signature header for body sent at t,
// with one v1 per secret.
func PaymentSignature(secrets []string, t time.Time, body []byte) string {
	b := []byte("t=")
	b = strconv.AppendInt(b, t.Unix(), 10)
	for _, s := range secrets {
		b = append(b, ",v1="...)
		b = append(b, SignPayment(s, t.Unix(), body)...)
	}
	return string(b)
}

func paymentMAC(secret, t, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write(t)
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// PaymentVerifier checks payment signatures against the secrets in force
// (payments.secret: two while one is rotated). It is safe for concurrent use.
type PaymentVerifier struct {
	secrets [][]byte
}

// NewPaymentVerifier verifies with secrets (none: every signature is refused).
func NewPaymentVerifier(secrets []string) *PaymentVerifier {
	v := &PaymentVerifier{}
	for _, s := range secrets {
		v.secrets = append(v.secrets, []byte(s))
	}
	return v
}

// Verify checks header (the Flashgate-Signature value) against body at now:
// t within PaymentTolerance of now, and one v1 equal (in constant time) to the
// HMAC of "<t>.<body>" under one of the secrets. Entries other than t and v1
// are ignored, so a signer can add a scheme before verifiers know it. Every
// refusal wraps ErrBadSignature.
func (v *PaymentVerifier) Verify(header, body []byte, now time.Time) error {
	if len(header) == 0 {
		return errSigMissing
	}
	var t []byte
	var sigs [maxPaymentSigs][sha256.Size]byte
	n := 0
	for rest := header; len(rest) > 0; {
		var item []byte
		item, rest, _ = bytes.Cut(rest, []byte{','})
		k, val, ok := bytes.Cut(bytes.TrimSpace(item), []byte{'='})
		if !ok {
			return errSigMalformed
		}
		switch string(k) {
		case "t":
			if t != nil || len(val) == 0 || len(val) > 12 || !digits(val) {
				return errSigMalformed
			}
			t = val
		case "v1":
			if n == maxPaymentSigs || hex.DecodedLen(len(val)) != sha256.Size {
				return errSigMalformed
			}
			if _, err := hex.Decode(sigs[n][:], val); err != nil {
				return errSigMalformed
			}
			n++
		}
	}
	if t == nil || n == 0 {
		return errSigMalformed
	}
	sec, _ := strconv.ParseInt(string(t), 10, 64)
	if d := now.Sub(time.Unix(sec, 0)); d > PaymentTolerance || d < -PaymentTolerance {
		return errSigWindow
	}
	if len(v.secrets) == 0 {
		return errSigNoSecret
	}
	ok := false
	for _, s := range v.secrets {
		mac := paymentMAC(s, t, body)
		for i := range n {
			// Every pair is compared: which secret matched, and where, is not
			// told by the time taken.
			ok = hmac.Equal(mac, sigs[i][:]) || ok
		}
	}
	if !ok {
		return errSigMismatch
	}
	return nil
}

func digits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
