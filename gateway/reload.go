package gateway

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/flashgate/flashgate/config"
)

// reload reads the configuration file again and puts its rate limits in force.
// Only the ratelimit block is live; other changes need a restart (and say so).
// A file that does not load or validate keeps the limits in force.
func (g *Gateway) reload(why string) {
	rl, err := config.LoadRateLimit(g.cfg.File)
	if err == nil {
		err = g.limits.Apply(rl, g.cfg.File)
	} else {
		g.limits.Refused(err)
	}
	g.metrics.Reloaded(err == nil)
	if err != nil {
		slog.Error("rate limits NOT reloaded; the limits in force stay", "why", why, "file", g.cfg.File, "err", err)
		return
	}
	slog.Info("rate limits reloaded", "why", why, "file", g.cfg.File, "limits", rl)
	g.noteShadowed(config.Shadowed("ratelimit"))
}

// noteShadowed records and logs the rate-limit keys a FLASHGATE_* variable
// sets: the environment wins over the file at every reload, so an edit of
// such a key in the file changes nothing, and the operator must be told.
func (g *Gateway) noteShadowed(keys map[string]string) {
	g.limits.Shadow(keys)
	for key, env := range keys {
		slog.Warn("rate limit key set by the environment: the file's value is not used", "key", key, "env", env, "file", g.cfg.File)
	}
}

// watchConfig reloads on SIGHUP and when the configuration file changes. It
// watches the file's directory: editors and config managers replace a file
// (write a new one, rename it over) rather than write it in place.
func (g *Gateway) watchConfig(ctx context.Context) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	var events chan fsnotify.Event
	if g.cfg.File != "" {
		w, err := fsnotify.NewWatcher()
		if err == nil {
			defer w.Close()
			if err = w.Add(filepath.Dir(g.cfg.File)); err == nil {
				events = w.Events
			}
		}
		if err != nil {
			slog.Warn("not watching the configuration file; SIGHUP still reloads", "file", g.cfg.File, "err", err)
		}
	}
	target := filepath.Clean(g.cfg.File)
	// Saving a file makes several events: wait for them to settle.
	var settle <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			if g.cfg.File == "" {
				slog.Warn("SIGHUP: no configuration file to reload")
				continue
			}
			g.reload("SIGHUP")
		case ev := <-events:
			if filepath.Clean(ev.Name) == target && ev.Op&(fsnotify.Write|fsnotify.Create|fsnotify.Rename) != 0 {
				settle = time.After(100 * time.Millisecond)
			}
		case <-settle:
			settle = nil
			g.reload("file changed")
		}
	}
}
