package wire

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/flashgate/flashgate/internal/dial"
	"github.com/flashgate/flashgate/internal/testenv"
)

// TestGatewayShutdownOrder: a wired gateway serves; its Shutdown stops the
// ports first, then closes the clients it was started on. A second Shutdown
// is harmless.
func TestGatewayShutdownOrder(t *testing.T) {
	cfg := testenv.Config(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g, err := StartGateway(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.Get("http://" + g.AdminAddr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("readyz: %d", res.StatusCode)
	}
	if err := g.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	// Drain finishes in the background; 10 s only bounds a hang.
	for deadline := time.Now().Add(10 * time.Second); !g.clients.NATS.IsClosed(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("NATS connection not closed after Shutdown: %v", g.clients.NATS.Status())
		}
	}
	if err := g.clients.Redis.Do(ctx, g.clients.Redis.B().Ping().Build()).Error(); err == nil {
		t.Error("Redis client still answers after Shutdown")
	}
	if _, err := http.Get("http://" + g.Addr() + "/v1/sales/x"); err == nil {
		t.Error("public port still serves after Shutdown")
	}
	if err := g.Shutdown(ctx); err != nil {
		t.Fatalf("second shutdown: %v", err)
	}
}

// TestRunGateway: RunGateway serves until its context ends and then returns
// without error.
func TestRunGateway(t *testing.T) {
	cfg := testenv.Config(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- RunGateway(ctx, cfg) }()
	time.Sleep(200 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("RunGateway: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("RunGateway did not return after its context ended")
	}
}

// TestBackendShutdownOrder: a wired backend serves; its Shutdown stops it
// first, then closes the clients it was started on. A second Shutdown is
// harmless.
func TestBackendShutdownOrder(t *testing.T) {
	cfg := testenv.Config(t)
	cfg.MySQL.AutoMigrate = true
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := StartBackend(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.Get("http://" + b.AdminAddr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("readyz: %d", res.StatusCode)
	}
	if err := b.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if !b.clients.NATS.IsClosed() {
		t.Errorf("NATS connection not closed after Shutdown: %v", b.clients.NATS.Status())
	}
	if err := b.clients.Redis.Do(ctx, b.clients.Redis.B().Ping().Build()).Error(); err == nil {
		t.Error("Redis client still answers after Shutdown")
	}
	if err := b.clients.DB.PingContext(ctx); err == nil {
		t.Error("MySQL pool still answers after Shutdown")
	}
	if _, err := http.Get("http://" + b.AdminAddr() + "/healthz"); err == nil {
		t.Error("admin port still serves after Shutdown")
	}
	if err := b.Shutdown(ctx); err != nil {
		t.Fatalf("second shutdown: %v", err)
	}
}

// TestRunBackend: RunBackend returns, without error, once its context ends.
func TestRunBackend(t *testing.T) {
	cfg := testenv.Config(t)
	cfg.MySQL.AutoMigrate = true
	// The schema first, as the backends of the other tests find it.
	db, err := dial.MySQL(context.Background(), cfg.MySQL)
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- RunBackend(rctx, cfg) }()
	time.Sleep(300 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}
