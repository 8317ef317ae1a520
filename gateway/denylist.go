package gateway

import (
	"context"
	"log/slog"
	"time"

	"github.com/flashgate/flashgate/internal/tick"
	"github.com/flashgate/flashgate/lua"
)

// denylistPoll is how often a gateway asks Redis whether the denylist
// changed (lua.Denylist): a revoked subject or token is refused here, cached
// token or not, within this plus a Redis round trip (docs/security.md).
const denylistPoll = 250 * time.Millisecond

// denylistFull: the whole list is read again this often even when its
// counter did not move (a hash restored from a snapshot may carry an old one).
const denylistFull = 30 * time.Second

// denylist follows Redis's denylist into the token cache's.
type denylist struct {
	ver  int64
	read time.Time
}

// sync reads the counter and, when it moved (or a full read is due), the
// whole list.
func (d *denylist) sync(ctx context.Context, g *Gateway, now time.Time) error {
	ver, err := lua.DenylistVersionOf(ctx, g.rc)
	if err != nil {
		return err
	}
	if ver == d.ver && !d.read.IsZero() && now.Sub(d.read) < denylistFull {
		return nil
	}
	entries, ver, err := lua.LoadDenylist(ctx, g.rc)
	if err != nil {
		return err
	}
	g.auth.Denylist().Replace(entries)
	d.ver, d.read = ver, now
	return nil
}

// denylistLoop keeps the token cache's denylist current until ctx ends.
func (g *Gateway) denylistLoop(ctx context.Context, d *denylist) {
	tick.Every(ctx, denylistPoll, func(now time.Time) {
		c, cancel := context.WithTimeout(ctx, denylistPoll)
		defer cancel()
		if err := d.sync(c, g, now); err != nil && ctx.Err() == nil {
			slog.Debug("gateway: denylist", "err", err)
		}
	})
}
