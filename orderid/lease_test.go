package orderid

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

func tctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func acquire(t *testing.T, c rueidis.Client, ttl time.Duration) *Lease {
	t.Helper()
	l, err := Acquire(tctx(t), c, ttl)
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

func get(t *testing.T, c rueidis.Client, key string) (string, bool) {
	t.Helper()
	v, err := c.Do(tctx(t), c.B().Get().Key(key).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return "", false
	}
	if err != nil {
		t.Fatal(err)
	}
	return v, true
}

func TestLeaseDistinctAndClose(t *testing.T) {
	for _, target := range testenv.RedisTargets(t) {
		t.Run(target.Name, func(t *testing.T) {
			c := target.Client
			const ttl = 5 * time.Second
			a, b := acquire(t, c, ttl), acquire(t, c, ttl)
			if a.Node() == b.Node() {
				t.Fatalf("two leases share node %d", a.Node())
			}
			for _, l := range []*Lease{a, b} {
				if l.key != KeyPrefix+strconv.Itoa(l.Node()) {
					t.Fatalf("key %q for node %d", l.key, l.Node())
				}
				if v, ok := get(t, c, l.key); !ok || v != l.token {
					t.Fatalf("%s = %q, %v; want our token", l.key, v, ok)
				}
				pttl, err := c.Do(tctx(t), c.B().Pttl().Key(l.key).Build()).AsInt64()
				if err != nil || pttl <= 0 || pttl > ttl.Milliseconds() {
					t.Fatalf("PTTL %s = %d, %v", l.key, pttl, err)
				}
				if !l.Valid() {
					t.Fatal("a fresh lease is not valid")
				}
				if id := l.Next(); NodeOf(id) != l.Node() {
					t.Fatalf("lease of node %d makes ids of node %d", l.Node(), NodeOf(id))
				}
			}
			if err := a.Close(tctx(t)); err != nil {
				t.Fatal(err)
			}
			if _, ok := get(t, c, a.key); ok {
				t.Fatalf("Close left %s", a.key)
			}
			if v, ok := get(t, c, b.key); !ok || v != b.token {
				t.Fatal("closing one lease touched the other")
			}
			// Close twice is harmless.
			if err := a.Close(tctx(t)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestLeaseRenews(t *testing.T) {
	c := testenv.Redis(t, testenv.RedisAddrs())
	const ttl = 600 * time.Millisecond
	l := acquire(t, c, ttl)
	// Hold it for several TTLs: the key must never lapse.
	for end := time.Now().Add(3 * ttl); time.Now().Before(end); time.Sleep(ttl / 10) {
		if v, ok := get(t, c, l.key); !ok || v != l.token {
			t.Fatalf("%s = %q, %v after %v: not renewed", l.key, v, ok, ttl)
		}
		if !l.Valid() {
			t.Fatal("lease lost while Redis is up")
		}
	}
}

func TestLeaseLostWhenTaken(t *testing.T) {
	for _, target := range testenv.RedisTargets(t) {
		t.Run(target.Name, func(t *testing.T) {
			c := target.Client
			l := acquire(t, c, 300*time.Millisecond)
			t.Cleanup(func() { c.Do(context.Background(), c.B().Del().Key(l.key).Build()) })
			if err := c.Do(tctx(t), c.B().Set().Key(l.key).Value("someone-else").Px(10*time.Second).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			select {
			case <-l.Lost():
			case <-time.After(10 * time.Second):
				t.Fatal("lease not reported lost after its key was taken")
			}
			if l.Valid() {
				t.Fatal("Valid after Lost")
			}
			if err := l.Close(tctx(t)); err != nil {
				t.Fatal(err)
			}
			if v, _ := get(t, c, l.key); v != "someone-else" {
				t.Fatalf("Close of a lost lease deleted the new holder's key (now %q)", v)
			}
		})
	}
}

// TestLeaseLostBeforeExpiry cuts the lease holder off Redis. Lost must close
// while the key is still ours: once it expires another gateway may take the node
// id, and two generators of one node can make the same id.
func TestLeaseLostBeforeExpiry(t *testing.T) {
	direct := testenv.Redis(t, testenv.RedisAddrs())
	p := newProxy(t, testenv.RedisAddrs()[0])
	c := testenv.Redis(t, []string{p.addr()})
	const ttl = 1500 * time.Millisecond
	l, err := Acquire(tctx(t), c, ttl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = l.Close(ctx)
		_ = lua.Unlock(context.Background(), direct, l.key, l.token)
	})
	// Let a renewal or two happen, then cut at an arbitrary point of the cycle.
	time.Sleep(ttl/2 + 37*time.Millisecond)
	p.cut()
	select {
	case <-l.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("lease not reported lost with Redis unreachable")
	}
	if v, ok := get(t, direct, l.key); !ok || v != l.token {
		t.Fatalf("lease reported lost only after its key expired (%s = %q, %v): another node could have taken it", l.key, v, ok)
	}
}

func TestAcquireNoFreeNode(t *testing.T) {
	// A database of its own, so that filling every node id disturbs nobody.
	opt := testenv.RedisOption(testenv.RedisAddrs())
	opt.SelectDB = 14
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ctx := tctx(t)
	cmds := make(rueidis.Commands, 0, MaxNode+1)
	for n := 0; n <= MaxNode; n++ {
		cmds = append(cmds, c.B().Set().Key(KeyPrefix+strconv.Itoa(n)).Value("taken").Px(time.Minute).Build())
	}
	t.Cleanup(func() {
		for n := 0; n <= MaxNode; n++ {
			c.Do(context.Background(), c.B().Del().Key(KeyPrefix+strconv.Itoa(n)).Build())
		}
	})
	for _, r := range c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Acquire(ctx, c, time.Second); !errors.Is(err, ErrNoNode) {
		t.Fatalf("Acquire with every node taken: %v, want ErrNoNode", err)
	}
	if err := c.Do(ctx, c.B().Del().Key(KeyPrefix+"613").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	l, err := Acquire(ctx, c, time.Second)
	if err != nil || l.Node() != 613 {
		t.Fatalf("Acquire with node 613 free = %v, %v", l, err)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// proxy forwards TCP to a server until cut.
type proxy struct {
	ln     net.Listener
	mu     sync.Mutex
	conns  []net.Conn
	closed bool
	wg     sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln}
	t.Cleanup(p.wg.Wait)
	t.Cleanup(p.cut)
	p.wg.Go(func() {
		for {
			down, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				down.Close()
				continue
			}
			if !p.track(down, up) {
				continue
			}
			p.wg.Go(func() { _, _ = io.Copy(up, down); up.Close() })
			p.wg.Go(func() { _, _ = io.Copy(down, up); down.Close() })
		}
	})
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	p.conns = append(p.conns, cs...)
	return true
}

// cut closes the listener and every connection: the server is unreachable.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	p.ln.Close()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}
