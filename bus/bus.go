// Package bus adapts NATS to flashgate: the JetStream stream that carries admitted
// orders from gateways to backends (durable, deduplicated by order id), and the core
// NATS subjects that carry sale events to every gateway's local cache (docs/design.md §7).
package bus

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/config"
)

// Connect dials NATS with a name and endless reconnects: a NATS restart is an
// outage to ride out, not a reason to exit.
func Connect(cfg config.NATS, name string) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.Timeout(2 * time.Second),
		nats.RetryOnFailedConnect(false),
		// No reconnect buffer: a publish while NATS is away fails at once (the
		// gateway answers 503 and releases) instead of being sent later, after
		// its buyer was told 503.
		nats.ReconnectBufSize(-1),
	}
	if cfg.User != "" {
		opts = append(opts, nats.UserInfo(cfg.User, cfg.Password))
	}
	if cfg.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(cfg.InboxPrefix))
	}
	nc, err := nats.Connect(cfg.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("nats %s: %w", cfg.URL, err)
	}
	return nc, nil
}

// EnsureStream creates or updates the orders stream: file storage, work-queue
// retention (a message leaves once a backend acked it), a duplicate window on
// Nats-Msg-Id.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg config.NATS) (jetstream.Stream, error) {
	s, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        cfg.Stream,
		Description: "flashgate admitted orders",
		Subjects:    []string{cfg.OrderSubject + ".>"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.WorkQueuePolicy,
		Duplicates:  cfg.DedupWindow,
		Replicas:    cfg.Replicas,
		MaxMsgs:     orNone(cfg.MaxStreamMsgs),
		MaxMsgSize:  orNone32(cfg.MaxMsgSize),
		MaxBytes:    orNone(cfg.MaxBytes),
		Discard:     jetstream.DiscardNew,
	})
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", cfg.Stream, err)
	}
	return s, nil
}

func orNone32(n int64) int32 {
	if n <= 0 || n > 1<<31-1 {
		return -1
	}
	return int32(n)
}

func orNone(n int64) int64 {
	if n <= 0 {
		return -1
	}
	return n
}

// OrderSubject is the subject of sale's orders.
func OrderSubject(cfg config.NATS, sale string) string { return cfg.OrderSubject + "." + sale }

// Event types on the sale subjects.
const (
	EventCreated   = "created"
	EventClosed    = "closed"
	EventPaused    = "paused"  // purchases answer 503 paused until resumed
	EventResumed   = "resumed" // a paused sale sells again
	EventSoldOut   = "sold_out"
	EventRestocked = "restocked"
	EventWarm      = "warm"    // a gateway found the sale not warmed: a backend should warm it
	EventRetired   = "retired" // retention removed the sale from Redis: gateways forget it
)

// SaleEvent tells gateways (and backends, for warm) that a sale changed.
type SaleEvent struct {
	Type   string          `json:"type"`
	SaleID string          `json:"sale_id"`
	Region string          `json:"region,omitempty"`
	Sale   *flashgate.Sale `json:"sale,omitempty"`
}

// EventSubject is the subject of sale's events.
func EventSubject(cfg config.NATS, sale string) string { return cfg.EventSubject + "." + sale }

// HintSubject is the subject of a gateway's hints about sale: sold out,
// restocked, or not warmed. Hints have a subject of their own so that NATS
// permissions can let gateways send hints and only backends send the events
// that change a sale (created, closed): a gateway's credentials cannot close
// a sale. The extra token keeps it apart from any sale's event subject.
func HintSubject(cfg config.NATS, sale string) string { return cfg.EventSubject + ".hint." + sale }

// IsHint reports whether a gateway may send events of type typ.
func IsHint(typ string) bool {
	return typ == EventSoldOut || typ == EventRestocked || typ == EventWarm
}

// PublishEvent sends a sale event on core NATS (at most once: gateways also
// refresh their cache periodically, so a lost event heals).
func PublishEvent(nc *nats.Conn, cfg config.NATS, ev SaleEvent) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	return nc.Publish(EventSubject(cfg, ev.SaleID), b)
}

// PublishHint sends a gateway's hint (IsHint) on the sale's hint subject.
func PublishHint(nc *nats.Conn, cfg config.NATS, ev SaleEvent) error {
	if !IsHint(ev.Type) {
		return fmt.Errorf("sale event %q is not a gateway's hint", ev.Type)
	}
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	return nc.Publish(HintSubject(cfg, ev.SaleID), b)
}

// SubscribeEvents calls fn for every sale event and every hint. An event
// counts only on its own sale's subject, and a hint subject carries only
// hints: whoever may publish hints cannot pass off a closed sale as one.
func SubscribeEvents(nc *nats.Conn, cfg config.NATS, fn func(SaleEvent)) (*nats.Subscription, error) {
	prefix := cfg.EventSubject + "."
	return nc.Subscribe(cfg.EventSubject+".>", func(m *nats.Msg) {
		sale, hint := strings.CutPrefix(m.Subject[len(prefix):], "hint.")
		if !hint && strings.Contains(sale, ".") {
			return
		}
		ev, ok := DecodeEvent(m.Data)
		if !ok || ev.SaleID != sale || (hint && !IsHint(ev.Type)) {
			return
		}
		fn(ev)
	})
}

// DecodeEvent reads a sale event off the wire; ok is false for one a
// subscriber must ignore: not JSON, a bad sale id, or a created event whose
// sale is missing, is another sale or is not valid (a gateway would serve it
// as it is). A type the subscriber does not know passes: it ignores it.
func DecodeEvent(b []byte) (ev SaleEvent, ok bool) {
	if json.Unmarshal(b, &ev) != nil || !flashgate.ValidID(ev.SaleID) {
		return SaleEvent{}, false
	}
	if ev.Type == EventCreated && (ev.Sale == nil || ev.Sale.ID != ev.SaleID || ev.Sale.Validate() != nil) {
		return SaleEvent{}, false
	}
	return ev, true
}
