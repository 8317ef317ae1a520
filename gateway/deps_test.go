package gateway

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate/internal/dial"
	"github.com/flashgate/flashgate/internal/testenv"
)

// TestGatewayDoesNotDial: the gateway is handed dialed clients and its own
// options; no file of the package dials a server or reads the whole
// configuration (the CLI and internal/wire do).
func TestGatewayDoesNotDial(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	forbidden := []string{"rueidis.NewClient", "nats.Connect(", "bus.Connect(", "jetstream.New(",
		"config.Config", "config.Load(", "dial."}
	checked := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, s := range forbidden {
			if strings.Contains(string(b), s) {
				t.Errorf("%s contains %q", f, s)
			}
		}
	}
	if checked < 10 {
		t.Fatalf("checked %d files: not the gateway's directory?", checked)
	}
}

// TestStartOwnsNoClients: the clients belong to whoever dialed them. A
// gateway that fails to start and one that shut down both leave them open
// and working; Start refuses to run without them.
func TestStartOwnsNoClients(t *testing.T) {
	cfg := testenv.Config(t)
	c, err := dial.Gateway(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	deps := Deps{Redis: c.Redis, NATS: c.NATS, JetStream: c.JetStream}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	working := func(when string) {
		t.Helper()
		if err := c.Redis.Do(ctx, c.Redis.B().Ping().Build()).Error(); err != nil {
			t.Fatalf("%s: Redis client: %v", when, err)
		}
		if !c.NATS.IsConnected() {
			t.Fatalf("%s: NATS connection %v", when, c.NATS.Status())
		}
	}

	if _, err := Start(ctx, Deps{Redis: c.Redis}, cfg.GatewayOptions()); err == nil {
		t.Fatal("Start without NATS: no error")
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	bad := cfg.GatewayOptions()
	bad.Gateway.AdminListen = busy.Addr().String()
	if _, err := Start(ctx, deps, bad); err == nil {
		t.Fatal("Start on an admin port in use: no error")
	}
	working("after a failed start")

	g, err := Start(ctx, deps, cfg.GatewayOptions())
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	working("after Shutdown")
}
