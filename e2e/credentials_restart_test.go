package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/authstack"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

// TestRedisRestartLoadsScriptEffects: under the stack's ACL, what a role's
// script wrote is still there after Redis restarts from its append-only file.
// Redis 7.0 replays the file as the default user and checks each MULTI block
// (every script's effects are written as one) against that user's rules: with
// the default user switched off, the restart loaded none of it.
func TestRedisRestartLoadsScriptEffects(t *testing.T) {
	st := authstack.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dial := func(r authstack.Role) rueidis.Client {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{st.Redis.Addr},
			Username: r.RedisUser, Password: r.RedisPassword, DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	key := "fg:{s:" + testenv.ID("aof") + "}:stock"
	c := dial(st.Backend)
	err := c.Do(ctx, c.B().Eval().Script("redis.call('SET', KEYS[1], 10); return redis.call('DECRBY', KEYS[1], 3)").
		Numkeys(1).Key(key).Build()).Error()
	if err != nil {
		t.Fatalf("script as the backend: %v", err)
	}
	// And a function of the library, which the backend loads.
	probe := "fg:{s:" + testenv.ID("aof") + "}:meta:probe"
	if err := lua.ProbeWrite(ctx, c, probe, time.Hour); err != nil {
		t.Fatalf("function as the backend: %v", err)
	}
	c.Close()

	st.Redis.Kill()
	st.Redis.Start()

	admin := dial(st.Admin)
	defer admin.Close()
	got, err := admin.Do(ctx, admin.B().Get().Key(key).Build()).ToString()
	if err != nil || got != "7" {
		t.Fatalf("after the restart %s = %q (%v), want 7: the append-only file was not loaded", key, got, err)
	}
	// The library came back with the file: the gateway calls it at once.
	if n, err := admin.Do(ctx, admin.B().Exists().Key(probe).Build()).AsInt64(); err != nil || n != 1 {
		t.Fatalf("after the restart the function's write is gone (%d, %v)", n, err)
	}
	gw := dial(st.Gateway)
	defer gw.Close()
	if _, err := lua.ServerTime(ctx, gw, probe); err != nil {
		t.Fatalf("a function as the gateway after the restart: %v (the library was not loaded from the file)", err)
	}
	denied, err := admin.Do(ctx, admin.B().AclLog().Count(10).Build()).ToArray()
	if err != nil || len(denied) != 0 {
		t.Fatalf("ACL log after the restart: %d entries (%v), want none", len(denied), err)
	}
}

// TestBackendRepublishesOrders: a backend's NATS login may put an order back
// on the orders stream (reconcile republishes a stale reservation's order).
func TestBackendRepublishesOrders(t *testing.T) {
	st := authstack.Start(t)
	cfg := st.Config(config.Default(), st.Backend).NATS
	errs := make(chan error, 10)
	js, err := jetstream.New(connectAs(t, st.NATS.URL(), st.Backend, errs))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := bus.EnsureStream(ctx, js, cfg); err != nil {
		t.Fatalf("the backend creates the stream: %v", err)
	}
	o := flashgate.Order{ID: 7, SaleID: testenv.ID("repub"), UserID: "u", Quantity: 1, Status: flashgate.OrderPending,
		CreatedAt: time.Now().UTC(), ExpiresAt: time.Now().Add(time.Hour).UTC()}
	if _, err := bus.PublishOrder(ctx, js, bus.OrderSubject(cfg, o.SaleID), &o, nil); err != nil {
		t.Fatalf("the backend republishes an order: %v", err)
	}
	select {
	case err := <-errs:
		t.Fatalf("NATS refused the backend: %v", err)
	default:
	}
}
