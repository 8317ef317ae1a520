package backend

import (
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
)

// TestBurstsAreWrittenWithoutRedelivery: orders published in bursts with
// gaps between them, the way a flood arrives, are each written on their first
// delivery. With an ack wait far longer than the test, a message delivered to
// a pull the consumer had stopped listening to would sit unacknowledged until
// it was redelivered: every order must be in MySQL well before that, and the
// consumer must end with no message pending or redelivered (the old loop's
// two short pulls per batch left some of a flood's last orders waiting out
// ack_wait).
func TestBurstsAreWrittenWithoutRedelivery(t *testing.T) {
	t.Parallel()
	const ackWait = 10 * time.Minute
	s := start(t, testenv.RedisAddrs(), func(c *config.Config) {
		c.Backend.AckWait = ackWait
		c.Backend.BatchSize = 40
		c.Backend.BatchWait = 5 * time.Millisecond
	})
	const bursts, perBurst = 40, 60
	sale := spec(bursts*perBurst, 1, nil)
	k := s.createSale(sale)

	// The orders are admitted first, then published burst by burst: each burst
	// at once (asynchronous publishes), a gap of 0 to 30 ms after it, so that
	// pulls keep expiring while the server is sending.
	orders := make([]flashgate.Order, 0, bursts*perBurst)
	for i := range bursts * perBurst {
		orders = append(orders, admit(t, s.rc, k, "u"+strconv.Itoa(i), 1, ""))
	}
	accepted := ids(orders)
	subject := bus.OrderSubject(s.cfg.NATS, sale.ID)
	for b := range bursts {
		for _, o := range orders[b*perBurst : (b+1)*perBurst] {
			if _, err := s.js.PublishAsync(subject, bus.AppendOrder(nil, &o),
				jetstream.WithMsgID(strconv.FormatUint(o.ID, 10))); err != nil {
				t.Fatalf("publish: %v", err)
			}
		}
		select {
		case <-s.js.PublishAsyncComplete():
		case <-ctx(t).Done():
			t.Fatal("publishes not acknowledged")
		}
		time.Sleep(time.Duration(b%4) * 10 * time.Millisecond)
	}

	// A liveness bound far under the ack wait: a message left to a dead pull
	// only comes back after ackWait.
	eventually(t, 30*time.Second, "every order has a row", func() bool {
		return s.rows(sale.ID, string(flashgate.OrderConfirmed)) == int64(len(orders))
	})
	c, err := s.js.Consumer(ctx(t), s.cfg.NATS.Stream, s.cfg.NATS.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	var info *jetstream.ConsumerInfo
	eventually(t, 5*time.Second, "every message acknowledged", func() bool {
		info, err = c.Info(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		return info.NumAckPending == 0 && info.NumPending == 0
	})
	if info.NumRedelivered != 0 || info.Delivered.Consumer != uint64(len(orders)) {
		t.Errorf("%d orders: %d deliveries, %d redelivered; want each delivered once",
			len(orders), info.Delivered.Consumer, info.NumRedelivered)
	}
	r := check(t, s.env, sale.ID, accepted)
	if r.Lost != 0 || r.Duplicated != 0 || r.Oversold != 0 || r.Sold != int64(len(orders)) {
		t.Errorf("audit: %v", r)
	}
}

// TestLateServerLeavesNoOrderToAckWait: the server reads what the backend
// sends it 1.2 s late (a loaded NATS, as in a flood on one machine) while
// orders trickle in. A pull request then reaches the server after the client
// gave up on it: messages sent to a pull whose inbox the client no longer
// reads would sit unacknowledged until ack_wait (10 min here). The long-lived
// pull keeps its inbox, so every order is written on its first delivery.
func TestLateServerLeavesNoOrderToAckWait(t *testing.T) {
	t.Parallel()
	link := newDelayLink(t, strings.TrimPrefix(testenv.NATSURL(), "nats://"))
	const ackWait = 10 * time.Minute
	s := start(t, testenv.RedisAddrs(), func(c *config.Config) {
		c.NATS.URL = "nats://" + link.addr
		c.Backend.AckWait = ackWait
		c.Backend.BatchSize = 50
		c.Backend.BatchWait = 50 * time.Millisecond
	})
	const n = 300
	sale := spec(n, 1, nil)
	k := s.createSale(sale)
	orders := make([]flashgate.Order, 0, n)
	for i := range n {
		orders = append(orders, admit(t, s.rc, k, "u"+strconv.Itoa(i), 1, ""))
	}

	link.delay.Store(int64(1200 * time.Millisecond))
	subject := bus.OrderSubject(s.cfg.NATS, sale.ID)
	for _, o := range orders {
		if _, err := s.js.PublishAsync(subject, bus.AppendOrder(nil, &o),
			jetstream.WithMsgID(strconv.FormatUint(o.ID, 10))); err != nil {
			t.Fatalf("publish: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case <-s.js.PublishAsyncComplete():
	case <-ctx(t).Done():
		t.Fatal("publishes not acknowledged")
	}
	// Far under the ack wait: an order left to a dead pull only comes back
	// after it.
	eventually(t, 20*time.Second, "every order has a row", func() bool {
		return s.rows(sale.ID, string(flashgate.OrderConfirmed)) == n
	})
	link.delay.Store(0)
	c, err := s.js.Consumer(ctx(t), s.cfg.NATS.Stream, s.cfg.NATS.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	var info *jetstream.ConsumerInfo
	eventually(t, 5*time.Second, "every message acknowledged", func() bool {
		if info, err = c.Info(ctx(t)); err != nil {
			t.Fatal(err)
		}
		return info.NumAckPending == 0 && info.NumPending == 0
	})
	if info.NumRedelivered != 0 || info.Delivered.Consumer != n {
		t.Errorf("%d orders: %d deliveries, %d redelivered; want each delivered once", n, info.Delivered.Consumer, info.NumRedelivered)
	}
}

// delayLink is a TCP proxy to target that holds what clients send for delay
// (0: none) before passing it on; what the server sends goes straight back.
type delayLink struct {
	addr  string
	delay atomic.Int64 // time.Duration
}

func newDelayLink(t *testing.T, target string) *delayLink {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &delayLink{addr: ln.Addr().String()}
	var conns sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		conns.Wait()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			conns.Go(func() { l.pipe(c, up) })
		}
	}()
	return l
}

// pipe carries one connection until either side closes it.
func (l *delayLink) pipe(c, up net.Conn) {
	defer c.Close()
	defer up.Close()
	type chunk struct {
		b   []byte
		due time.Time
	}
	chunks := make(chan chunk, 1024)
	go func() {
		defer close(chunks)
		for {
			b := make([]byte, 32<<10)
			n, err := c.Read(b)
			if n > 0 {
				chunks <- chunk{b[:n], time.Now().Add(time.Duration(l.delay.Load()))}
			}
			if err != nil {
				return
			}
		}
	}()
	go func() {
		_, _ = io.Copy(c, up)
		c.Close()
		up.Close()
	}()
	for ch := range chunks {
		time.Sleep(time.Until(ch.due))
		if _, err := up.Write(ch.b); err != nil {
			return
		}
	}
}
