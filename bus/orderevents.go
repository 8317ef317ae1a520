package bus

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/config"
)

// The order-events stream (docs/events.md): every status change of an order,
// published by the backend leader from MySQL's outbox, on
// <events.subject>.<sale>, one message per change, Nats-Msg-Id = the event
// id. Its retention is limits (max age, max bytes): any number of consumers
// read it at their own pace; nothing here acks it away.

// OrderEventSubject is the subject of sale's order events.
func OrderEventSubject(cfg config.Events, sale string) string { return cfg.Subject + "." + sale }

// Headers of an order event besides Nats-Msg-Id: what a consumer needs to
// route or dedupe without decoding the body.
const (
	HdrEventType  = "Flashgate-Event-Type"  // confirmed | failed | paid | canceled | expired
	HdrEventOrder = "Flashgate-Event-Order" // the order id
	HdrEventSeq   = "Flashgate-Event-Seq"   // the event's place in its order's history, from 1
)

// EnsureOrderEventStream creates or updates the order-events stream: file
// storage, limits retention bounded by age and size (the oldest events go
// first), a duplicate window on the event id, the orders stream's replicas.
func EnsureOrderEventStream(ctx context.Context, js jetstream.JetStream, cfg config.Events, replicas int) (jetstream.Stream, error) {
	maxBytes := cfg.MaxBytes
	if maxBytes <= 0 {
		maxBytes = -1
	}
	s, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        cfg.Stream,
		Description: "flashgate order events: every status change of an order, once, in order per order (api/asyncapi.yaml)",
		Subjects:    []string{cfg.Subject + ".>"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      cfg.MaxAge,
		MaxBytes:    maxBytes,
		Discard:     jetstream.DiscardOld,
		Duplicates:  cfg.DedupWindow,
		Replicas:    replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", cfg.Stream, err)
	}
	return s, nil
}

// OrderEventMsg is the message of one order event.
func OrderEventMsg(cfg config.Events, ev *flashgate.OrderEvent) (*nats.Msg, error) {
	b, err := json.Marshal(ev)
	if err != nil {
		return nil, err
	}
	m := nats.NewMsg(OrderEventSubject(cfg, ev.SaleID))
	m.Data = b
	m.Header.Set(jetstream.MsgIDHeader, ev.ID)
	m.Header.Set(HdrEventType, string(ev.Type))
	m.Header.Set(HdrEventOrder, fmt.Sprint(ev.OrderID))
	m.Header.Set(HdrEventSeq, fmt.Sprint(ev.Seq))
	return m, nil
}

// DecodeOrderEvent reads an order event off the wire, as a consumer would
// (a field it does not know is ignored: the schema may grow).
func DecodeOrderEvent(b []byte) (flashgate.OrderEvent, error) {
	var ev flashgate.OrderEvent
	if err := json.Unmarshal(b, &ev); err != nil {
		return ev, fmt.Errorf("order event: %w", err)
	}
	return ev, nil
}

// The webhook's dead letters: events the shop's endpoint refused
// events.webhook.max_attempts times, kept in <events.stream>_DLQ on
// <events.subject>_dlq.webhook.<sale> for an operator to look at.
const (
	HdrWebhookError    = "Flashgate-Webhook-Error"    // the last attempt's error
	HdrWebhookAttempts = "Flashgate-Webhook-Attempts" // attempts made
)

// OrderEventDeadLetterStream is the name of the webhook's dead-letter stream.
func OrderEventDeadLetterStream(cfg config.Events) string { return cfg.Stream + "_DLQ" }

// OrderEventDeadLetterSubject is where a webhook dead letter of sale goes.
func OrderEventDeadLetterSubject(cfg config.Events, sale string) string {
	return cfg.Subject + "_dlq.webhook." + sale
}

// EnsureOrderEventDeadLetterStream creates or updates the webhook's
// dead-letter stream: file storage, kept as long as the events.
func EnsureOrderEventDeadLetterStream(ctx context.Context, js jetstream.JetStream, cfg config.Events, replicas int) (jetstream.Stream, error) {
	name := OrderEventDeadLetterStream(cfg)
	s, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        name,
		Description: "flashgate order events the webhook endpoint refused every time",
		Subjects:    []string{cfg.Subject + "_dlq.>"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      cfg.MaxAge,
		Duplicates:  cfg.DedupWindow,
		Replicas:    replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	return s, nil
}
