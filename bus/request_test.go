package bus

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/internal/testenv"
)

// TestCommandCostsLittleMemory: one order command's round trip allocates
// kilobytes, not SubscribeSync's half-megabyte channel: a junk flood's
// commands must not become the gateway's garbage (docs/hostile.md, "Junk
// commands"). And no backend listening is still ErrNoBackend at once.
func TestCommandCostsLittleMemory(t *testing.T) {
	cfg := testenv.Config(t).NATS
	nc := testenv.NATS(t)
	c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := Command(c, nc, cfg, OrderCommand{Op: CmdCancel, SaleID: "s", OrderID: 1, UserID: "u"}); !errors.Is(err, ErrNoBackend) {
		t.Fatalf("no backend: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("no backend answered after %v, not at once", d)
	}
	backend := testenv.NATS(t)
	sub, err := ServeCommands(backend, cfg, func(OrderCommand) OrderReply {
		return OrderReply{Code: string(flashgate.CodeOrderNotFound)}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := backend.Flush(); err != nil {
		t.Fatal(err)
	}
	const n = 200
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range n {
		r, err := Command(c, nc, cfg, OrderCommand{Op: CmdCancel, SaleID: "s", OrderID: 1, UserID: "u"})
		if err != nil || r.Code != string(flashgate.CodeOrderNotFound) {
			t.Fatalf("command: %+v, %v", r, err)
		}
	}
	runtime.ReadMemStats(&after)
	// Both connections are in this process: the bytes count the backend's
	// side too.
	if per := (after.TotalAlloc - before.TotalAlloc) / n; per > 64<<10 {
		t.Fatalf("%d bytes allocated per command, want under 64 KiB", per)
	}
}
