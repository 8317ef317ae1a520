package gateway

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/lua"
)

// A flood of false sold-out hints (anyone with a gateway's NATS credential
// can send them) marks nothing: the sale has stock in Redis, so it stays on
// sale here and buyers are admitted, and the flood starts no goroutines. A
// true hint, once Redis has no stock, marks the sale.
func TestFalseSoldOutHintsMarkNothing(t *testing.T) {
	// Not parallel: it counts the process's goroutines.
	e := start(t)
	s := e.sale(nil)
	cached := e.g.sales.get([]byte(s.ID))
	flag := cached.soldOutFlag("")
	goroutines := runtime.NumGoroutine()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := bus.PublishHint(e.g.nc, e.cfg.NATS, bus.SaleEvent{Type: bus.EventSoldOut, SaleID: s.ID}); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(time.Millisecond)
		}
	})
	marked := 0
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if flag.Load() {
			marked++
		}
		time.Sleep(time.Millisecond)
	}
	peak := runtime.NumGoroutine()
	for i := range 2 {
		if r := e.buy(s, e.token("buyer"+string(rune('a'+i))), `{"quantity":1}`, nil); r.Status != 202 {
			t.Errorf("purchase during the flood: %d %s", r.Status, r.Code)
		}
	}
	close(stop)
	wg.Wait()
	if marked > 0 {
		t.Errorf("the sale with stock was seen marked sold out %d times during the flood", marked)
	}
	if peak > goroutines+5 {
		t.Errorf("goroutines %d during the flood, %d before", peak, goroutines)
	}

	// Redis sold out: a hint now marks the sale.
	_, stock := lua.KeysFor(s.ID, nil).StockKeys()
	if err := e.rc.Do(t.Context(), e.rc.B().Set().Key(stock[0]).Value("0").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for !flag.Load() {
		if time.Now().After(deadline) {
			t.Fatal("a true sold-out hint did not mark the sale")
		}
		_ = bus.PublishHint(e.g.nc, e.cfg.NATS, bus.SaleEvent{Type: bus.EventSoldOut, SaleID: s.ID})
		time.Sleep(20 * time.Millisecond)
	}
}
