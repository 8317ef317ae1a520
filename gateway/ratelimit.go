package gateway

import (
	"context"
	"log/slog"
	"time"

	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/ratelimit"
)

// The per-user and per-sale budgets, local or fleet-wide (ratelimit.mode,
// docs/gateway.md, "Rate limits"). Local: this gateway's own GCRA in memory. Global: a
// GCRA in Redis (lua.RateAllow) that every gateway shares, so the fleet lets
// through what one gateway would; a key Redis has refused is refused from
// memory until its wait has passed (Limits.Denied), so a flood over a limit
// is not a flood on Redis. When Redis does not answer, the local budget
// decides (the fleet then lets through up to gateways × the limit, as in
// local mode, rather than refusing every purchase).

// allowUser applies the per-user budget.
func (g *Gateway) allowUser(user string, now time.Time) (bool, time.Duration) {
	if !g.limits.Global() {
		return g.limits.User.Allow(ratelimit.KeyString(user), now.UnixNano())
	}
	return g.allowGlobal(g.limits.User, rateUser, user, ratelimit.KeyString(user), now)
}

// allowSale applies the per-sale budget.
func (g *Gateway) allowSale(s *sale, now time.Time) (bool, time.Duration) {
	if !g.limits.Global() {
		return g.limits.Sale.Allow(s.rateKey, now.UnixNano())
	}
	return g.allowGlobal(g.limits.Sale, rateSale, s.spec.ID, s.rateKey, now)
}

// The kinds of fleet-wide limit: their names in lua.RateKey, their numbers in
// the deny cache.
const (
	rateUser = "user"
	rateSale = "sale"
)

var denyKind = map[string]uint8{rateUser: 1, rateSale: 2}

// allowGlobal takes one request from the fleet-wide limit kind of id, with
// the rate of the local limiter k (which decides when Redis does not answer).
func (g *Gateway) allowGlobal(k *ratelimit.Keyed, kind, id string, local uint64, now time.Time) (bool, time.Duration) {
	interval, tolerance, on := k.Params()
	if !on {
		return true, 0
	}
	n := now.UnixNano()
	deny := ratelimit.DenyKey{Kind: denyKind[kind], ID: id}
	if denied, wait := g.limits.Denied.Denied(deny, n); denied {
		return false, wait
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.Gateway.AdmitTimeout)
	ok, wait, err := lua.RateAllow(ctx, g.rc, lua.RateKey(kind, id), interval, tolerance)
	cancel()
	if err != nil {
		slog.Debug("fleet-wide rate limit unavailable; the local one decides", "kind", kind, "err", err)
		return k.Allow(local, n)
	}
	if !ok {
		g.limits.Denied.Deny(deny, n, n+int64(wait))
	}
	return ok, wait
}
