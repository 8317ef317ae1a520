package bus

import (
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flashgate/flashgate/config"
)

// GatewayStats is one gateway's purchase answers per sale and code, counted
// since the gateway started. Every gateway sends its own every second (core
// NATS, at most once: the next one carries the totals again); the backends'
// live view turns the differences into rates (docs/observability.md).
type GatewayStats struct {
	Gateway string                       `json:"gateway"`
	At      time.Time                    `json:"at"`
	Sales   map[string]map[string]uint64 `json:"sales"`
	// AcceptedLatency is, per sale, the 202s answered since the gateway
	// started by latency bucket (metrics.LatencyBounds, then one past the
	// largest): the live view's p99 of the 202s. Absent: none yet.
	AcceptedLatency map[string][]uint64 `json:"accepted_latency,omitempty"`
	// Limits are the gateway's rate limits in force (its GET /admin/v1/limits).
	Limits json.RawMessage `json:"limits,omitempty"`
}

// StatsSubject is the subject of gateway's stats. It sits under the event
// subject's "stats." token: never a sale's event subject (a sale id holds no
// dot), and a gateway's credentials may publish there as they may publish hints.
func StatsSubject(cfg config.NATS, gateway string) string {
	return cfg.EventSubject + ".stats." + gateway
}

// PublishStats sends a gateway's stats.
func PublishStats(nc *nats.Conn, cfg config.NATS, st GatewayStats) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return nc.Publish(StatsSubject(cfg, st.Gateway), b)
}

// MaxStatsBytes bounds one stats message: a larger one is dropped unread
// (a gateway's is a few hundred bytes a sale).
const MaxStatsBytes = 64 << 10

// SubscribeStats calls fn with every gateway's stats; a message over
// MaxStatsBytes, one that does not decode, or one whose gateway is not the
// one its subject names, is dropped.
func SubscribeStats(nc *nats.Conn, cfg config.NATS, fn func(GatewayStats)) (*nats.Subscription, error) {
	prefix := cfg.EventSubject + ".stats."
	return nc.Subscribe(prefix+"*", func(m *nats.Msg) {
		if len(m.Data) > MaxStatsBytes {
			return
		}
		var st GatewayStats
		if err := json.Unmarshal(m.Data, &st); err != nil || m.Subject != prefix+st.Gateway {
			return
		}
		fn(st)
	})
}
