package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/clip"
)

// ReplyPrefix is where the answers to order commands and lane purchases come
// back: <command_subject>.reply.<token>, one token per request. A backend may
// publish there by name (its NATS permissions, docs/credentials.md), so it
// needs no allow_responses. That matters for more than tidiness: with
// allow_responses nats-server records every message delivered to the backend
// with a reply subject, each JetStream delivery included, keeps the record
// for two minutes, and once a connection holds more than 4,096 of them it
// walks all of them on every further delivery. At a flood's rates that walk
// was most of NATS's CPU per purchase (BENCHMARKS.md, issue 13).
func ReplyPrefix(cfg config.NATS) string { return cfg.CommandSubject + ".reply." }

// request publishes data on subject with a reply subject of its own under
// ReplyPrefix and waits for the one answer; nats.ErrNoResponders when nobody
// listens on subject.
func request(ctx context.Context, nc *nats.Conn, cfg config.NATS, subject string, data []byte) (*nats.Msg, error) {
	reply := ReplyPrefix(cfg) + nuid.Next()
	// One answer is awaited, so a channel of one: SubscribeSync's holds
	// nats.Options.SubChanLen (64k) pointers, half a megabyte allocated per
	// request, which at a junk flood's rates was the gateway's garbage
	// collector's whole time (docs/hostile.md, "Junk commands").
	ch := make(chan *nats.Msg, 1)
	sub, err := nc.ChanSubscribe(reply, ch)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := sub.AutoUnsubscribe(1); err != nil {
		return nil, err
	}
	if err := nc.PublishRequest(subject, reply, data); err != nil {
		return nil, err
	}
	select {
	case m := <-ch:
		// The server's "no responders" status, as SubscribeSync would read it.
		if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
			return nil, nats.ErrNoResponders
		}
		return m, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// ask sends v (JSON) on subject to the backends and decodes their answer
// (what names it in an error); ErrNoBackend when none answered in time.
func ask[T any](ctx context.Context, nc *nats.Conn, cfg config.NATS, subject string, v any, what string) (T, error) {
	var r T
	b, err := json.Marshal(v)
	if err != nil {
		return r, err
	}
	msg, err := request(ctx, nc, cfg, subject, b)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) {
			return r, fmt.Errorf("%w: %v", ErrNoBackend, err)
		}
		return r, err
	}
	if err := json.Unmarshal(msg.Data, &r); err != nil {
		return r, fmt.Errorf("%s %s: %w", what, clip.Quote(msg.Data), err)
	}
	return r, nil
}
