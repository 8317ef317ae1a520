package gateway

// POST /v1/payments: the shop's payment service tells that an order was paid
// (docs/design.md §3 "Payments", docs/payments.md). The gateway checks the signature
// and the body, and a backend records the payment in MySQL (bus.CmdPay): the
// gateway never decides whether an order is paid.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/bus"
)

var (
	pathPayments = []byte("/v1/payments")
	hdrPaySig    = []byte(auth.PaymentHeader)
)

// payment is POST /v1/payments. The signature is checked before the body is
// read as JSON: an unsigned request learns nothing of what it sent.
func (g *Gateway) payment(ctx *fasthttp.RequestCtx) {
	body := ctx.PostBody()
	if err := g.payments.Verify(ctx.Request.Header.PeekBytes(hdrPaySig), body, g.now()); err != nil {
		fail(ctx, fasthttp.StatusUnauthorized, flashgate.CodeBadSignature, err.Error())
		return
	}
	p, err := parsePayment(body)
	if err != nil {
		fail(ctx, fasthttp.StatusBadRequest, flashgate.CodeInvalidRequest, err.Error())
		return
	}
	// An id that cannot be an order of a sale this gateway knows is
	// answered here (orderids.go), as a backend would: no such order.
	if s := g.sales.get([]byte(p.SaleID)); s != nil && !possibleID(s, p.OrderID, g.now()) {
		noSuchOrder(ctx)
		return
	}
	cctx, cancel := context.WithTimeout(context.Background(), g.cfg.Gateway.PublishTimeout)
	reply, err := bus.Command(cctx, g.nc, g.cfg.NATS, bus.PayCommand(p))
	cancel()
	if err != nil {
		slog.Warn("payment", "sale", p.SaleID, "order", p.OrderID, "payment", p.PaymentID, "err", err)
		unavailable(ctx, "payment service unavailable")
		return
	}
	switch code := flashgate.Code(reply.Code); code {
	case bus.ReplyOK:
		paid(ctx, &p, reply.Status)
	case flashgate.CodeOrderNotFound:
		fail(ctx, fasthttp.StatusNotFound, code, "no such order")
	case flashgate.CodeOrderClosed:
		// Canceled, expired or failed: its units went back on sale and stay
		// there. The payment service gives the money back.
		fail(ctx, fasthttp.StatusConflict, code, nonEmpty(reply.Message, "the order is closed"))
		refund(ctx)
	case flashgate.CodeAmountMismatch, flashgate.CodeAlreadyPaid, flashgate.CodePaymentIDUsed:
		fail(ctx, fasthttp.StatusConflict, code, nonEmpty(reply.Message, "the payment does not fit the order"))
	case flashgate.CodeConflict:
		failRetry(ctx, fasthttp.StatusConflict, code, nonEmpty(reply.Message, "the order is still being confirmed"), 1)
	case flashgate.CodeInvalidRequest:
		fail(ctx, fasthttp.StatusBadRequest, code, nonEmpty(reply.Message, "invalid payment"))
	default:
		unavailableFor(ctx, nonEmpty(reply.Message, "payment service unavailable"), time.Duration(reply.RetryAfterMS)*time.Millisecond)
	}
}

// paid writes the 200 of a payment: the order and the payment that paid it.
func paid(ctx *fasthttp.RequestCtx, p *flashgate.Payment, status string) {
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentTypeBytes(ctJSON)
	r := &ctx.Response
	r.ResetBody()
	var buf [128]byte
	b := append(buf[:0], `{"order_id":"`...)
	b = strconv.AppendUint(b, p.OrderID, 10)
	b = append(b, `","sale_id":`...)
	b = appendJSONString(b, p.SaleID)
	b = append(b, `,"status":`...)
	b = appendJSONString(b, status)
	b = append(b, `,"payment_id":`...)
	b = appendJSONString(b, p.PaymentID)
	b = append(b, `,"amount_cents":`...)
	b = strconv.AppendInt(b, p.AmountCents, 10)
	r.AppendBody(append(b, '}'))
}

// refund adds "refund":true to the error body fail wrote: the money taken
// must go back, no order holds it.
func refund(ctx *fasthttp.RequestCtx) {
	b := ctx.Response.Body()
	ctx.Response.SetBody(append(bytes.Clone(b[:len(b)-1]), `,"refund":true}`...))
}

// payForbidden is a buyer's POST …/orders/{order}/pay: only the payment
// service marks an order paid (POST /v1/payments). Answered at once, for
// anyone: nothing is asked of Redis, NATS or MySQL. A sale the gateway does
// not know is 404, as on every route under it.
func payForbidden(ctx *fasthttp.RequestCtx, s *sale) {
	if s == nil {
		fail(ctx, fasthttp.StatusNotFound, flashgate.CodeSaleNotFound, "no such sale")
		return
	}
	fail(ctx, fasthttp.StatusForbidden, flashgate.CodeForbidden, "orders are marked paid by the shop's payment service (POST /v1/payments), not by buyers")
}

// errPaymentJSON is what a malformed payment body is told.
var errPaymentJSON = errors.New(`body must be {"order_id":"<decimal>","sale_id":"…","payment_id":"…","amount_cents":<integer>}, no other field`)

// parsePayment reads a payment body strictly: every field, no other. (A
// field given twice is not caught: the body is the signer's own.)
func parsePayment(b []byte) (flashgate.Payment, error) {
	var p flashgate.Payment
	// Presence is checked on the raw fields: a missing amount_cents must not
	// read as 0.
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil || len(raw) != 4 ||
		raw["order_id"] == nil || raw["sale_id"] == nil || raw["payment_id"] == nil || raw["amount_cents"] == nil {
		return p, errPaymentJSON
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil || dec.More() {
		return p, errPaymentJSON
	}
	if err := p.Validate(); err != nil {
		return p, errors.New(strings.TrimPrefix(err.Error(), flashgate.ErrInvalid.Error()+": "))
	}
	return p, nil
}
