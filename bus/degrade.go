package bus

import (
	"context"
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/config"
)

// The degraded lane (docs/degrade.md): while a sale's Redis shard is
// unreachable, a gateway sends the purchases of a sale with degrade: mysql to
// a backend over core NATS request-reply, in the backends' queue group (any
// one answers), and the backend decides them in MySQL. No answer is an
// outage (503), never a "no".

// Event types of the lane, on the sale subjects (sent by backends).
const (
	// EventStale: the lane wrote orders Redis does not count; gateways keep
	// the sale on the lane until EventFresh.
	EventStale = "stale"
	// EventFresh: the leader warmed the stale sale again from MySQL; the fast
	// path may resume.
	EventFresh = "fresh"
)

// PurchaseSubject is the subject of lane purchases: the command subject's
// own sub-subject (the NATS permissions name it, scripts/stack.sh).
func PurchaseSubject(cfg config.NATS) string { return cfg.CommandSubject + ".purchase" }

// LanePurchase is a purchase a gateway hands to the lane: the order it would
// have published had Redis admitted it, with the buyer's facts (the backend
// works the charges out again from them and the sale in MySQL), without an
// id: the lane makes it (its own order-id node, docs/degrade.md).
type LanePurchase struct {
	SaleID    string `json:"sale_id"`
	UserID    string `json:"user_id"`
	Quantity  int64  `json:"quantity"`
	Region    string `json:"region,omitempty"`
	IdemKey   string `json:"idem,omitempty"`
	Phone     string `json:"phone,omitempty"`
	Device    string `json:"device,omitempty"`
	IP        string `json:"ip,omitempty"`
	Address   string `json:"address,omitempty"`
	CreatedMS int64  `json:"created_ms"`
	ExpiresMS int64  `json:"expires_ms"`
}

// PurchaseOf is the lane request of order o.
func PurchaseOf(o *flashgate.Order) LanePurchase {
	return LanePurchase{SaleID: o.SaleID, UserID: o.UserID, Quantity: o.Quantity, Region: o.Region,
		IdemKey: o.IdemKey, Phone: o.Phone, Device: o.Device, IP: o.IP, Address: o.Address,
		CreatedMS: o.CreatedAt.UnixMilli(), ExpiresMS: o.ExpiresAt.UnixMilli()}
}

// Order is the order p asks for (no charges: the backend works them out).
func (p *LanePurchase) Order() flashgate.Order {
	return flashgate.Order{SaleID: p.SaleID, UserID: p.UserID, Quantity: p.Quantity, Region: p.Region,
		IdemKey: p.IdemKey, Phone: p.Phone, Device: p.Device, IP: p.IP, Address: p.Address,
		CreatedAt: time.UnixMilli(p.CreatedMS).UTC(), ExpiresAt: time.UnixMilli(p.ExpiresMS).UTC()}
}

// LaneReply is the backend's decision: Outcome is one of mysql.LaneOutcome's
// words ("ok", "replay", "sold_out", …), or "unavailable" when the backend
// could not decide (MySQL down, shutting down) and "invalid" for a malformed
// request.
type LaneReply struct {
	Outcome   string `json:"outcome"`
	OrderID   uint64 `json:"order_id,string,omitempty"`
	Status    string `json:"status,omitempty"`
	Remaining int64  `json:"remaining,omitempty"`
	WaitMS    int64  `json:"wait_ms,omitempty"`
	Limit     int    `json:"limit,omitempty"`
	Held      int64  `json:"held,omitempty"`
	Message   string `json:"message,omitempty"`
}

// Outcomes of a LaneReply that are not the lane's decision.
const (
	LaneUnavailable = "unavailable"
	LaneInvalid     = "invalid"
)

// Purchase sends p to the lane and waits for the decision; ErrNoBackend when
// no backend answered in time.
func Purchase(ctx context.Context, nc *nats.Conn, cfg config.NATS, p LanePurchase) (LaneReply, error) {
	return ask[LaneReply](ctx, nc, cfg, PurchaseSubject(cfg), p, "lane reply")
}

// DecodePurchase reads a lane purchase off the wire; ok is false for a
// malformed one.
func DecodePurchase(b []byte) (p LanePurchase, ok bool) {
	if err := json.Unmarshal(b, &p); err != nil || !flashgate.ValidID(p.SaleID) ||
		!flashgate.ValidID(p.UserID) || p.CreatedMS <= 0 || p.ExpiresMS < p.CreatedMS ||
		(p.IdemKey != "" && !flashgate.ValidID(p.IdemKey)) || (p.Region != "" && !flashgate.ValidRegion(p.Region)) {
		return LanePurchase{}, false
	}
	for _, f := range []string{p.Phone, p.Device, p.IP, p.Address} {
		if f != "" && !flashgate.ValidSubject(f) {
			return LanePurchase{}, false
		}
	}
	return p, true
}

// ServePurchases answers lane purchases with handle, in the backends' queue
// group. handle must reply within the gateway's timeout.
func ServePurchases(nc *nats.Conn, cfg config.NATS, handle func(LanePurchase) LaneReply) (*nats.Subscription, error) {
	return nc.QueueSubscribe(PurchaseSubject(cfg), CommandQueue, func(m *nats.Msg) {
		var r LaneReply
		if p, ok := DecodePurchase(m.Data); !ok {
			r = LaneReply{Outcome: LaneInvalid, Message: "malformed lane purchase"}
		} else {
			r = handle(p)
		}
		b, _ := json.Marshal(r)
		_ = m.Respond(b)
	})
}
