package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/flashgate/flashgate/api"
	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/metrics"
)

func (g *Gateway) adminMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		var errs []error
		if err := g.rc.Do(ctx, g.rc.B().Ping().Build()).Error(); err != nil {
			errs = append(errs, fmt.Errorf("redis: %w", err))
		}
		if !g.nc.IsConnected() {
			errs = append(errs, errors.New("nats: not connected"))
		}
		if !g.lease.Load().Valid() {
			errs = append(errs, errors.New("order-id node lease lost"))
		}
		if why := g.edge.notAccepting(); why != "" {
			errs = append(errs, errors.New(why))
		}
		if err := errors.Join(errs...); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})
	// The probes, /metrics and /openapi.json stay open (orchestrators and Prometheus scrape
	// them; they reveal counts, not orders). The admin API and pprof need the
	// admin token: profiles expose internals (heap contents, stacks, the
	// command line) and a CPU profile or trace costs the process while it
	// runs, even on a loopback port anything on the host can reach.
	mux.Handle("GET /metrics", g.metrics.Handler())
	mux.Handle("GET /openapi.json", api.Handler())
	mux.Handle("GET /admin/v1/limits", auth.RequireAdmin(g.cfg.AdminToken, http.HandlerFunc(g.serveLimits)))
	mux.Handle("/admin/", auth.RequireAdmin(g.cfg.AdminToken, http.NotFoundHandler()))
	mux.Handle("/debug/pprof/", auth.RequireAdmin(g.cfg.AdminToken, metrics.PprofHandler()))
	return mux
}

// serveLimits is GET /admin/v1/limits: the limits in force, when and from
// where they were loaded, and the last reload that was refused.
func (g *Gateway) serveLimits(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(g.limits.View())
}
