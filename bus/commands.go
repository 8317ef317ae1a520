package bus

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/config"
)

// Order commands: a gateway asks a backend to change an order in MySQL (pay,
// cancel) over core NATS request-reply; the backends form one queue group, so
// exactly one answers. No backend answering is an outage (503), never a "no".
const (
	// CmdPay records a payment the gateway verified (POST /v1/payments): it
	// carries the payment, and no user (the payment service is not a buyer).
	CmdPay    = "pay"
	CmdCancel = "cancel"
	// CmdGet reads an order from MySQL: the gateway asks when Redis has no
	// record of it (Redis lost it). It changes nothing.
	CmdGet = "get"
)

// CommandQueue is the queue group backends answer order commands in.
const CommandQueue = "flashgate-backend"

// OrderCommand is a buyer's request about their order (cancel, get), or a
// payment (pay). The gateway has checked the token or the payment's
// signature; the backend checks ownership again against MySQL.
type OrderCommand struct {
	Op      string `json:"op"`
	SaleID  string `json:"sale_id"`
	OrderID uint64 `json:"order_id,string"`
	UserID  string `json:"user_id,omitempty"`
	// PaymentID and AmountCents are a pay's payment; empty for the others.
	PaymentID   string `json:"payment_id,omitempty"`
	AmountCents int64  `json:"amount_cents,omitempty"`
}

// PayCommand is the command of payment p.
func PayCommand(p flashgate.Payment) OrderCommand {
	return OrderCommand{Op: CmdPay, SaleID: p.SaleID, OrderID: p.OrderID, PaymentID: p.PaymentID, AmountCents: p.AmountCents}
}

// Payment is a pay command's payment.
func (c *OrderCommand) Payment() flashgate.Payment {
	return flashgate.Payment{OrderID: c.OrderID, SaleID: c.SaleID, PaymentID: c.PaymentID, AmountCents: c.AmountCents}
}

// OrderReply is the backend's answer. Code is flashgate.CodeAccepted-style
// "ok" on success, else the docs/design.md §3 code to answer with (order_not_found,
// order_closed, conflict for an order still pending, unavailable).
type OrderReply struct {
	Code      string    `json:"code"`
	Message   string    `json:"message,omitempty"`
	Status    string    `json:"status,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	Quantity  int64     `json:"quantity,omitempty"`
	Region    string    `json:"region,omitempty"`
	CreatedAt time.Time `json:"created_at,omitzero"`
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// RetryAfterMS, with code unavailable, is how long the backend expects
	// the cause to last (a full queue: the time to work it off); the
	// gateway's Retry-After is derived from it.
	RetryAfterMS int64 `json:"retry_after_ms,omitempty"`
}

// Order is the order a reply shows: sale, id and user are the command's (the
// reply does not repeat them). Times are in UTC.
func (r *OrderReply) Order(sale string, id uint64, user string) flashgate.Order {
	return flashgate.Order{ID: id, SaleID: sale, UserID: user, Quantity: r.Quantity, Region: r.Region,
		Status: flashgate.OrderStatus(r.Status), Reason: r.Reason, CreatedAt: r.CreatedAt.UTC(), ExpiresAt: r.ExpiresAt.UTC()}
}

// ReplyOf answers code (ReplyOK or a flashgate.Code) and msg with order o.
func ReplyOf(code, msg string, o *flashgate.Order) OrderReply {
	return OrderReply{Code: code, Message: msg, Status: string(o.Status), Reason: o.Reason, Quantity: o.Quantity,
		Region: o.Region, CreatedAt: o.CreatedAt, ExpiresAt: o.ExpiresAt}
}

// ReplyOK is the Code of a command that was carried out (or already was).
const ReplyOK = "ok"

// ErrNoBackend means no backend answered in time.
var ErrNoBackend = errors.New("no backend answered")

// Command sends cmd and waits for the reply.
func Command(ctx context.Context, nc *nats.Conn, cfg config.NATS, cmd OrderCommand) (OrderReply, error) {
	return ask[OrderReply](ctx, nc, cfg, cfg.CommandSubject, cmd, "order command reply")
}

// DecodeCommand reads an order command off the wire; ok is false for a
// malformed one (answered invalid_request, never handled). A pay is a
// payment with no user (a buyer's pay, as gateways before payments sent it,
// is malformed); cancel and get are a user's, with no payment.
func DecodeCommand(b []byte) (cmd OrderCommand, ok bool) {
	if err := json.Unmarshal(b, &cmd); err != nil || cmd.OrderID == 0 || !flashgate.ValidID(cmd.SaleID) {
		return OrderCommand{}, false
	}
	switch cmd.Op {
	case CmdPay:
		p := cmd.Payment()
		ok = cmd.UserID == "" && p.Validate() == nil
	case CmdCancel, CmdGet:
		ok = flashgate.ValidID(cmd.UserID) && cmd.PaymentID == "" && cmd.AmountCents == 0
	}
	if !ok {
		return OrderCommand{}, false
	}
	return cmd, true
}

// ServeCommands answers order commands with handle, in the backends' queue
// group. handle must reply within the gateway's timeout.
func ServeCommands(nc *nats.Conn, cfg config.NATS, handle func(OrderCommand) OrderReply) (*nats.Subscription, error) {
	return ServeCommandsLater(nc, cfg, func(cmd OrderCommand, answer func(OrderReply)) { answer(handle(cmd)) })
}

// ServeCommandsLater is ServeCommands for a server that answers later, off
// the subscription's goroutine: take is handed each well-formed command and
// the function that answers it (call it once). A malformed command is
// answered invalid_request here.
func ServeCommandsLater(nc *nats.Conn, cfg config.NATS, take func(OrderCommand, func(OrderReply))) (*nats.Subscription, error) {
	return nc.QueueSubscribe(cfg.CommandSubject, CommandQueue, func(m *nats.Msg) {
		answer := func(r OrderReply) {
			b, _ := json.Marshal(r)
			_ = m.Respond(b)
		}
		cmd, ok := DecodeCommand(m.Data)
		if !ok {
			answer(OrderReply{Code: string(flashgate.CodeInvalidRequest), Message: "malformed order command"})
			return
		}
		take(cmd, answer)
	})
}
