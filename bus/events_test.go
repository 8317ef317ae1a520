package bus_test

import (
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/internal/testenv"
)

// TestHintsCannotChangeASale: SubscribeEvents takes from a hint subject only
// what a gateway may say (sold out, restocked, warm), and an event only on its
// own sale's subject; everything else is dropped.
func TestHintsCannotChangeASale(t *testing.T) {
	cfg := testenv.Config(t).NATS
	nc := testenv.NATS(t)
	var mu sync.Mutex
	var got []bus.SaleEvent
	sub, err := bus.SubscribeEvents(nc, cfg, func(ev bus.SaleEvent) { mu.Lock(); got = append(got, ev); mu.Unlock() })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	pub := func(subject, typ, sale string) {
		b, _ := json.Marshal(bus.SaleEvent{Type: typ, SaleID: sale})
		if err := nc.Publish(subject, b); err != nil {
			t.Fatal(err)
		}
	}
	pub(bus.HintSubject(cfg, "s1"), bus.EventClosed, "s1")   // dropped: not a hint
	pub(bus.HintSubject(cfg, "s1"), bus.EventCreated, "s1")  // dropped: not a hint
	pub(bus.HintSubject(cfg, "s2"), bus.EventSoldOut, "s1")  // dropped: another sale's subject
	pub(bus.EventSubject(cfg, "s2"), bus.EventClosed, "s1")  // dropped: another sale's subject
	pub(cfg.EventSubject+".s1.extra", bus.EventClosed, "s1") // dropped: not a sale's subject
	pub(bus.HintSubject(cfg, "s1"), bus.EventSoldOut, "s1")  // kept
	pub(bus.HintSubject(cfg, "s1"), bus.EventWarm, "s1")     // kept
	pub(bus.EventSubject(cfg, "s1"), bus.EventClosed, "s1")  // kept
	if err := bus.PublishHint(nc, cfg, bus.SaleEvent{Type: bus.EventClosed, SaleID: "s1"}); err == nil {
		t.Fatal("PublishHint sent a closed event")
	}
	if err := bus.PublishHint(nc, cfg, bus.SaleEvent{Type: bus.EventRestocked, SaleID: "s1"}); err != nil {
		t.Fatal(err)
	}
	want := []string{bus.EventSoldOut, bus.EventWarm, bus.EventClosed, bus.EventRestocked}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n >= len(want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	// One more round trip: anything wrongly let through would have arrived.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(got) != len(want) {
		t.Fatalf("got %+v, want types %v", got, want)
	}
	for i, ev := range got {
		if ev.Type != want[i] || ev.SaleID != "s1" {
			t.Fatalf("event %d: %+v, want %s of s1", i, ev, want[i])
		}
	}
}
