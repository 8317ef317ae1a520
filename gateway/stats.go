package gateway

// What the gateway tells others about its traffic, beside its /metrics: the
// request id of each admitted order (nginx's $request_id, which travels with
// the order to the backend's log), a sampled access log, and every sale's
// purchase answers by code and its 202s by latency, sent to the backends every
// second for their live view (docs/observability.md).

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/internal/clip"
	"github.com/flashgate/flashgate/internal/tick"
	"github.com/flashgate/flashgate/metrics"
)

var hdrRequestID = []byte(bus.HeaderRequestID)

// maxRequestID bounds a request id taken from the request (nginx's is 32 hex
// digits).
const maxRequestID = 64

// requestID is the request's X-Request-Id (set by nginx, nginx/nginx.conf) or,
// when it has none or one that is not 1-64 characters of [A-Za-z0-9_.-], a new
// one the gateway makes and puts on the request. Called on the paths that
// need it (an admitted order, a sampled access log line), never on a refusal's.
func requestID(ctx *fasthttp.RequestCtx) string {
	if v := ctx.Request.Header.PeekBytes(hdrRequestID); validRequestID(v) {
		return string(v)
	}
	id := newRequestID()
	ctx.Request.Header.SetBytesKV(hdrRequestID, []byte(id))
	return id
}

func validRequestID(v []byte) bool {
	if len(v) == 0 || len(v) > maxRequestID {
		return false
	}
	for _, c := range v {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// newRequestID is 32 random hex digits, the shape of nginx's $request_id.
func newRequestID() string {
	var b [16]byte
	for i := range 2 {
		v := rand.Uint64()
		for j := range 8 {
			b[i*8+j] = byte(v >> (8 * j))
		}
	}
	return hex.EncodeToString(b[:])
}

// accessLog writes one request's access log line (gateway.access_log_sample
// decides which requests get one).
func (g *Gateway) accessLog(ctx *fasthttp.RequestCtx, route metrics.Route, code flashgate.Code) {
	slog.Info("access",
		"request_id", requestID(ctx),
		"method", string(ctx.Method()),
		"path", clip.Text(ctx.Path()), // the client's: bounded
		"route", route.String(),
		"status", ctx.Response.StatusCode(),
		"code", string(code),
		"client", g.proxies.clientIP(ctx).String(),
		"duration", time.Since(ctx.Time()),
	)
}

// statsEvery is how often a gateway sends its per-sale counts.
const statsEvery = time.Second

// statsLoop sends the per-sale purchase counts (bus.GatewayStats) every
// statsEvery until ctx ends. Core NATS, at most once: each message carries
// the totals, so a lost one only makes the next rate cover two seconds.
func (g *Gateway) statsLoop(ctx context.Context) {
	tick.Every(ctx, statsEvery, func(now time.Time) {
		st := bus.GatewayStats{Gateway: g.id, At: now.UTC(), Sales: map[string]map[string]uint64{}}
		st.Limits, _ = json.Marshal(g.limits.View())
		for _, s := range g.sales.list() {
			if c := s.counts.Snapshot(); len(c) > 0 {
				st.Sales[s.spec.ID] = c
			}
			if l := s.counts.AcceptedLatency(); l != nil {
				if st.AcceptedLatency == nil {
					st.AcceptedLatency = map[string][]uint64{}
				}
				st.AcceptedLatency[s.spec.ID] = l
			}
		}
		if err := bus.PublishStats(g.nc, g.cfg.NATS, st); err != nil {
			slog.Debug("gateway: stats", "err", err)
		}
	})
}
