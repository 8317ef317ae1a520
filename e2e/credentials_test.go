package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/eventcheck"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/mysql"
)

// The servers here authenticate their clients with the users and permissions
// scripts/stack.sh gives the local stack (docs/credentials.md).

// TestRolesRunASale: a backend and a gateway, each with its own role's logins
// only, run a sale from creation to a paid order and a sold-out answer: the
// permissions are enough for everything they do.
func TestRolesRunASale(t *testing.T) {
	st := testenv.StartAuthStack(t)
	base := e2eConfig(t)
	// The webhook too: the backend's role reads the events stream for it.
	var hooked atomic.Int64
	shop := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hooked.Add(1) }))
	t.Cleanup(shop.Close)
	base.Events.Webhook.URL, base.Events.Webhook.Secret = shop.URL, testenv.Secret("e2e-webhook-secret-0123456789-")
	be := startBackend(t, st.Config(base, st.Backend))
	gcfg := st.Config(base, st.Gateway)
	gw := startGateway(t, gcfg)
	s := newSale(1, 1)
	createSale(t, base, be.AdminAddr(), s)
	awaitSale(t, gw, s.ID)
	orders := "http://" + gw.Addr() + "/v1/sales/" + s.ID + "/orders"
	a := call(t, gcfg, "POST", orders, "alice")
	if a.status != 202 {
		t.Fatalf("purchase: %d %s", a.status, a.Code)
	}
	deadline := time.Now().Add(20 * time.Second)
	for call(t, gcfg, "GET", orders+"/"+a.Order, "alice").State != "confirmed" {
		if time.Now().After(deadline) {
			t.Fatalf("order %s never confirmed", a.Order)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r := pay(t, gw.Addr(), paymentBody(s.ID, a.Order, "pi_a", s.PriceCents), gcfg.Payments.Secret...); r.status != 200 || r.State != "paid" {
		t.Fatalf("payment (gateway → backend request): %d %s", r.status, r.raw)
	}
	if r := call(t, gcfg, "POST", orders, "bob"); r.status != 409 {
		t.Fatalf("second buyer of one unit: %d %s", r.status, r.Code)
	}
	consumerReadsEvents(t, st, base, s.ID)
	deadline = time.Now().Add(20 * time.Second)
	for hooked.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the webhook got %d of the 2 events", hooked.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The backend leads (reconcile, expiry) and keeps its lead past a renewal
	// of the lock, which runs scripts of its own.
	deadline = time.Now().Add(20 * time.Second)
	for !be.IsLeader() {
		if time.Now().After(deadline) {
			t.Fatal("the backend never took the leader lock")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(6 * time.Second) // the lock is renewed every 2.5 s
	if !be.IsLeader() {
		t.Fatal("the backend lost the leader lock")
	}
	// Nothing either of them tried was refused (Redis logs every refusal).
	admin, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{st.Redis.Addr},
		Username: st.Admin.RedisUser, Password: st.Admin.RedisPassword, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	refused, err := admin.Do(context.Background(), admin.B().AclLog().Count(100).Build()).ToAny()
	if err != nil {
		t.Fatal(err)
	}
	if l, _ := refused.([]any); len(l) > 0 {
		t.Fatalf("Redis refused the roles: %v", refused)
	}
}

// collector gathers the sale events a connection hears through
// bus.SubscribeEvents, as a gateway does.
type collector struct {
	mu  sync.Mutex
	evs []bus.SaleEvent
}

func (c *collector) add(ev bus.SaleEvent) { c.mu.Lock(); c.evs = append(c.evs, ev); c.mu.Unlock() }

func (c *collector) has(typ, sale string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ev := range c.evs {
		if ev.Type == typ && ev.SaleID == sale {
			return true
		}
	}
	return false
}

func connectAs(t *testing.T, url string, r testenv.Role, errs chan<- error) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.UserInfo(r.NATSUser, r.NATSPassword), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case errs <- err:
		default:
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestForgedSaleEventsRefused: nobody but a backend can close a sale through
// NATS. A client without credentials is not let in; a gateway's credentials
// cannot publish a sale event (the server refuses, no gateway hears it), and
// what a gateway may publish, hints, cannot carry a closed sale.
func TestForgedSaleEventsRefused(t *testing.T) {
	st := testenv.StartAuthStack(t)
	cfg := st.Config(config.Default(), st.Gateway).NATS
	sale := testenv.ID("forged")
	closed, _ := json.Marshal(bus.SaleEvent{Type: bus.EventClosed, SaleID: sale})

	// Anonymous: no connection at all, so no publish.
	if nc, err := nats.Connect(st.NATS.URL(), nats.Timeout(3*time.Second)); err == nil {
		nc.Close()
		t.Fatal("a client without credentials connected")
	} else if !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
		t.Fatalf("anonymous connect: %v, want an authorization violation", err)
	}
	// Wrong password.
	if nc, err := nats.Connect(st.NATS.URL(), nats.UserInfo(st.Gateway.NATSUser, "not-"+st.Gateway.NATSPassword)); err == nil {
		nc.Close()
		t.Fatal("a wrong password connected")
	}

	// A gateway listening, as every gateway does.
	heard := &collector{}
	listener := connectAs(t, st.NATS.URL(), st.Gateway, make(chan error, 1))
	if _, err := bus.SubscribeEvents(listener, cfg, heard.add); err != nil {
		t.Fatal(err)
	}
	if err := listener.Flush(); err != nil {
		t.Fatal(err)
	}

	errs := make(chan error, 4)
	forger := connectAs(t, st.NATS.URL(), st.Gateway, errs)
	if err := forger.Publish(bus.EventSubject(cfg, sale), closed); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errs:
		if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Fatalf("gateway publishing a sale event: %v, want a permissions violation", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server accepted a sale event from a gateway's credentials")
	}
	// A hint subject carries no closed sale.
	if err := forger.Publish(bus.HintSubject(cfg, sale), closed); err != nil {
		t.Fatal(err)
	}
	if err := bus.PublishHint(forger, cfg, bus.SaleEvent{Type: bus.EventClosed, SaleID: sale}); err == nil {
		t.Fatal("PublishHint sent a closed event")
	}
	// What a gateway may send still arrives: a sold-out hint.
	if err := bus.PublishHint(forger, cfg, bus.SaleEvent{Type: bus.EventSoldOut, SaleID: sale}); err != nil {
		t.Fatal(err)
	}
	// And a backend's closed event arrives: the listener was listening.
	backend := connectAs(t, st.NATS.URL(), st.Backend, make(chan error, 1))
	if err := bus.PublishEvent(backend, cfg, bus.SaleEvent{Type: bus.EventClosed, SaleID: sale + "b"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !heard.has(bus.EventClosed, sale+"b") || !heard.has(bus.EventSoldOut, sale) {
		if time.Now().After(deadline) {
			t.Fatalf("the backend's event or the gateway's hint never arrived: %+v", heard.evs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if heard.has(bus.EventClosed, sale) {
		t.Fatal("a gateway heard the forged closed event")
	}
	// A gateway cannot consume orders or delete the stream either.
	if err := forger.Publish("$JS.API.STREAM.DELETE."+cfg.Stream, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errs:
		if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Fatalf("gateway deleting the stream: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server took a stream delete from a gateway's credentials")
	}
}

// TestRedisRoles: Redis answers no one who has not logged in, and a gateway's
// or backend's user runs only what flashgate needs, on flashgate's keys.
func TestRedisRoles(t *testing.T) {
	st := testenv.StartAuthStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// rueidis sends HELLO first; a bare connection shows the server's answer
	// to a client that did not log in.
	anon, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{st.Redis.Addr}, DisableCache: true, AlwaysRESP2: true, DisableRetry: true})
	if err == nil {
		err = anon.Do(ctx, anon.B().Ping().Build()).Error()
		anon.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("anonymous PING: %v, want NOAUTH", err)
	}

	for _, r := range []struct {
		name string
		role testenv.Role
	}{{"gateway", st.Gateway}, {"backend", st.Backend}} {
		t.Run(r.name, func(t *testing.T) {
			c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{st.Redis.Addr}, Username: r.role.RedisUser, Password: r.role.RedisPassword, DisableCache: true})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			key := "fg:{s:" + testenv.ID("acl") + "}:stock"
			if err := c.Do(ctx, c.B().Set().Key(key).Value("1").Build()).Error(); err != nil {
				t.Fatalf("SET %s: %v", key, err)
			}
			if err := c.Do(ctx, c.B().Eval().Script("return redis.call('INCRBY', KEYS[1], 1)").Numkeys(1).Key(key).Build()).Error(); err != nil {
				t.Fatalf("EVAL on its keys: %v", err)
			}
			for _, cmd := range []rueidis.Completed{
				c.B().Flushall().Build(),
				c.B().Flushdb().Build(),
				c.B().ConfigGet().Parameter("*").Build(),
				c.B().ConfigSet().ParameterValue().ParameterValue("appendonly", "no").Build(),
				c.B().Keys().Pattern("*").Build(),
				c.B().AclList().Build(),
				c.B().Shutdown().Build(),
				c.B().Set().Key("other:key").Value("1").Build(),
				c.B().Eval().Script("return redis.call('FLUSHALL')").Numkeys(0).Build(),
			} {
				err := c.Do(ctx, cmd).Error()
				// A refusal inside a script is worded differently.
				if err == nil || !strings.Contains(err.Error(), "NOPERM") && !strings.Contains(err.Error(), "can't run this command") {
					t.Errorf("%v as %s: %v, want NOPERM", cmd.Commands(), r.name, err)
				}
			}
		})
	}
}

// consumerReadsEvents: the backend's role published the sale's order events
// (the purchase's confirmation and its payment) to a stream it created; the
// consumer role reads them, and may do nothing else: not publish an event,
// not read the orders stream.
func consumerReadsEvents(t *testing.T, st *testenv.AuthStack, base config.Config, sale string) {
	t.Helper()
	db, err := mysql.OpenDB(base.MySQL.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok, err := eventcheck.Drained(context.Background(), db)
		if err == nil && ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the backend's role never published the order events (%v)", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	errs := make(chan error, 10)
	nc := connectAs(t, st.NATS.URL(), st.Consumer, errs)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.Config(base, st.Consumer)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rep, err := eventcheck.Check(ctx, js, cfg.Events, db, sale, nil)
	if err != nil {
		t.Fatalf("the consumer role reading the events: %v", err)
	}
	if !rep.OK() || rep.Changes != 2 || rep.Types["confirmed"] != 1 || rep.Types["paid"] != 1 {
		t.Fatalf("the consumer role saw %s", rep)
	}
	short, cancelShort := context.WithTimeout(context.Background(), time.Second)
	defer cancelShort()
	if _, err := js.Publish(short, bus.OrderEventSubject(cfg.Events, sale), []byte(`{}`)); err == nil {
		t.Error("the consumer role published an order event")
	}
	if _, err := js.Stream(ctx, cfg.NATS.Stream); err == nil {
		t.Error("the consumer role read the orders stream")
	}
}
