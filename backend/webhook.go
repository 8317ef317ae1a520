package backend

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
)

// The webhook (docs/events.md): for shops without NATS, the leader also
// delivers the order events over HTTP. It reads the order-events stream —
// not the outbox — with a durable consumer of its own that lets one event out
// at a time (MaxAckPending 1), so the shop receives them in stream order, and
// so in order per order. Each event is POSTed with its signature; a 2xx
// answer delivers it (ack); anything else is tried again after a doubling
// wait, the event held in progress meanwhile, up to events.webhook.max_attempts
// tries, after which it goes to the dead-letter stream and the next one is
// delivered. A leader that dies mid-delivery leaves the event unacked: the
// next leader delivers it again, so the shop, like every consumer, dedupes on
// the event id.

// SignatureHeader carries a delivery's signature.
const SignatureHeader = "Flashgate-Signature"

// Sign is the Flashgate-Signature of body at t: "t=<unix seconds>,v1=<hex
// HMAC-SHA256(secret, "<t>.<body>")>", docs/design.md §3.2's scheme.
func Sign(secret []byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(ts))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac.Sum(nil))
}

// webhookMetrics counts the webhook's deliveries.
type webhookMetrics struct {
	deliveries *prometheus.CounterVec
}

func newWebhookMetrics(reg prometheus.Registerer) *webhookMetrics {
	m := &webhookMetrics{deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "flashgate", Subsystem: "backend",
		Name: "webhook_deliveries_total",
		Help: "Order event deliveries to the webhook, by result: ok (a 2xx), retry (refused or failed; tried again), dead_letter (refused max_attempts times)."},
		[]string{"result"})}
	for _, r := range []string{"ok", "retry", "dead_letter"} {
		m.deliveries.WithLabelValues(r)
	}
	reg.MustRegister(m.deliveries)
	return m
}

// webhook delivers the order events to the shop's endpoint.
type webhook struct {
	js      jetstream.JetStream
	cons    jetstream.Consumer
	cfg     config.Events
	client  *http.Client
	log     *slog.Logger
	metrics *webhookMetrics
	now     func() time.Time
}

// newWebhook ensures the webhook's durable consumer and its dead-letter
// stream; nil when no webhook is configured.
func newWebhook(ctx context.Context, js jetstream.JetStream, cfg config.Events, replicas int, log *slog.Logger, reg prometheus.Registerer) (*webhook, error) {
	w := cfg.Webhook
	if w.URL == "" {
		return nil, nil
	}
	if _, err := bus.EnsureOrderEventDeadLetterStream(ctx, js, cfg, replicas); err != nil {
		return nil, err
	}
	// The consumer's ack wait covers one attempt, or one wait between two:
	// the deliverer marks the event in progress before each, so a live
	// leader's event is never redelivered to another.
	cons, err := js.CreateOrUpdateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{
		Durable:       w.Consumer,
		Description:   "flashgate webhook: one event at a time, in stream order",
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       w.Timeout + w.RetryMax + 30*time.Second,
		MaxAckPending: 1,
		MaxDeliver:    -1,
		FilterSubject: cfg.Subject + ".>",
		Replicas:      replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("webhook consumer %s: %w", w.Consumer, err)
	}
	return &webhook{js: js, cons: cons, cfg: cfg, client: &http.Client{Timeout: w.Timeout}, log: log,
		metrics: newWebhookMetrics(reg), now: time.Now}, nil
}

// run delivers events until ctx (the leader's) ends.
func (wh *webhook) run(ctx context.Context) {
	for ctx.Err() == nil {
		m, err := wh.cons.Next(jetstream.FetchMaxWait(wh.cfg.Poll + time.Second))
		if err != nil {
			if !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, jetstream.ErrNoMessages) && ctx.Err() == nil {
				wh.log.Warn("webhook: fetch", "err", err)
				_ = sleep(ctx, wh.cfg.Webhook.RetryMin)
			}
			continue
		}
		wh.deliver(ctx, m)
	}
}

// deliver tries one event until the endpoint takes it, its attempts run
// out (dead letter), or ctx ends (nak'ed: the next leader delivers it).
func (wh *webhook) deliver(ctx context.Context, m jetstream.Msg) {
	w := wh.cfg.Webhook
	wait := w.RetryMin
	var err error
	for attempt := 1; ; attempt++ {
		_ = m.InProgress()
		if err = wh.post(ctx, m.Data()); err == nil {
			wh.metrics.deliveries.WithLabelValues("ok").Inc()
			if err := m.Ack(); err != nil {
				wh.log.Warn("webhook: ack (the event may be delivered again)", "err", err)
			}
			return
		}
		if ctx.Err() != nil {
			_ = m.Nak() // the next leader delivers it now, not after the ack wait
			return
		}
		if attempt == w.MaxAttempts {
			break
		}
		wh.metrics.deliveries.WithLabelValues("retry").Inc()
		wh.log.Warn("webhook: delivery failed; trying again", "event", m.Headers().Get(jetstream.MsgIDHeader),
			"attempt", attempt, "retry_in", wait, "err", err)
		_ = m.InProgress()
		if sleep(ctx, wait) != nil {
			_ = m.Nak()
			return
		}
		wait = min(2*wait, w.RetryMax)
	}
	id := m.Headers().Get(jetstream.MsgIDHeader)
	dead := nats.NewMsg(bus.OrderEventDeadLetterSubject(wh.cfg, saleOfEvent(wh.cfg, m.Subject())))
	dead.Data = m.Data()
	for k, v := range m.Headers() {
		dead.Header[k] = v
	}
	dead.Header.Set(jetstream.MsgIDHeader, "dlq-"+id)
	dead.Header.Set(bus.HdrWebhookError, err.Error())
	dead.Header.Set(bus.HdrWebhookAttempts, strconv.Itoa(w.MaxAttempts))
	if _, perr := wh.js.PublishMsg(ctx, dead); perr != nil {
		// Not acked: delivered again (and tried max_attempts times again).
		wh.log.Error("webhook: dead-lettering an event failed; it will be tried again", "event", id, "err", perr)
		return
	}
	wh.metrics.deliveries.WithLabelValues("dead_letter").Inc()
	wh.log.Error("webhook: the endpoint refused an event every time: dead-lettered", "event", id,
		"attempts", w.MaxAttempts, "stream", bus.OrderEventDeadLetterStream(wh.cfg), "err", err)
	if err := m.Ack(); err != nil {
		wh.log.Warn("webhook: ack", "err", err)
	}
}

// post sends one event, signed now.
func (wh *webhook) post(ctx context.Context, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, wh.cfg.Webhook.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(SignatureHeader, Sign([]byte(wh.cfg.Webhook.Secret), wh.now(), body))
	res, err := wh.client.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	if res.StatusCode/100 != 2 {
		return fmt.Errorf("webhook answered %d", res.StatusCode)
	}
	return nil
}

// saleOfEvent is the sale token of an order-events subject.
func saleOfEvent(cfg config.Events, subject string) string {
	if len(subject) > len(cfg.Subject)+1 && subject[:len(cfg.Subject)+1] == cfg.Subject+"." {
		return subject[len(cfg.Subject)+1:]
	}
	return "_"
}
