package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/internal/wire"
)

// serve runs the gateway or the backend until SIGINT or SIGTERM.
func serve(name string, args []string, stderr io.Writer) error {
	c := newCommand(name, "[--config FILE] [--log-level LEVEL]", stderr)
	level := c.String("log-level", envOr("FLASHGATE_LOG_LEVEL", "info"), "debug, info, warn or error (env FLASHGATE_LOG_LEVEL)")
	pos, err := c.parse(args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return c.usageError("%s takes no arguments", name)
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*level)); err != nil {
		return c.usageError("--log-level: %v", err)
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: lvl})).With("process", name)
	slog.SetDefault(log)

	cfg, err := c.config()
	if err != nil {
		log.Error("configuration", "err", err, "config", c.configPath)
		return exitCode(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	runner := wire.RunGateway
	if name == "backend" {
		runner = wire.RunBackend
	} else if mb := cfg.Gateway.MemoryLimitMB; mb > 0 {
		// The soft limit is the process's: set here, where the process is
		// the gateway, not in gateway.Start or internal/wire (tests run a
		// gateway, a backend and the load in one process, under -race).
		debug.SetMemoryLimit(int64(mb) << 20)
	}
	if cfg.Dev {
		log.Warn("dev mode (FLASHGATE_DEV): weak and published secrets are accepted; never run it so outside a local stack")
	}
	log.Info("starting", "config", c.configPath, "pid", os.Getpid())
	if err := runner(ctx, cfg); err != nil && !errors.Is(err, context.Canceled) {
		log.Error("stopped", "err", err)
		return exitCode(1)
	}
	log.Info("stopped")
	return nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// errNoSecret is what every command that mints tokens says without a secret.
var errNoSecret = auth.ErrNoSecret
