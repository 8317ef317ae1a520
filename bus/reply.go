package bus

import (
	"context"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/flashgate/flashgate/config"
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
	sub, err := nc.SubscribeSync(reply)
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
	return sub.NextMsgWithContext(ctx)
}
