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
	"github.com/flashgate/flashgate/internal/authstack"
	"github.com/flashgate/flashgate/internal/eventcheck"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/mysql"
	"github.com/flashgate/flashgate/orderid"
	"github.com/flashgate/flashgate/roles"
)

// The servers here authenticate their clients with the users and permissions
// scripts/stack.sh gives the local stack (docs/credentials.md).

// TestRolesRunASale: a backend and a gateway, each with its own role's logins
// only, run a sale from creation to a paid order and a sold-out answer: the
// permissions are enough for everything they do. The schema is the
// migrator's work; the backend's MySQL login has rows only, and the gateway
// has none.
func TestRolesRunASale(t *testing.T) {
	st := authstack.Start(t)
	base := e2eConfig(t)
	migrate(t, authstack.MySQLAs(t, base.MySQL.DSN, st.Migrator))
	// The webhook too: the backend's role reads the events stream for it.
	var hooked atomic.Int64
	shop := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hooked.Add(1) }))
	t.Cleanup(shop.Close)
	base.Events.Webhook.URL, base.Events.Webhook.Secret = shop.URL, testenv.Secret("e2e-webhook-secret-0123456789-")
	bcfg := st.Config(base, st.Backend)
	bcfg.MySQL.DSN, bcfg.MySQL.AutoMigrate = authstack.MySQLAs(t, base.MySQL.DSN, st.Backend), false
	be := startBackend(t, bcfg)
	gcfg := st.Config(base, st.Gateway)
	gcfg.MySQL.DSN = "tcp(127.0.0.1:1)/no-login" // a gateway has no MySQL login
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

// migrate brings the schema of dsn up to date (as the migrator does before a
// deploy).
func migrate(t *testing.T, dsn string) {
	t.Helper()
	db, err := mysql.OpenDB(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := mysql.Migrate(ctx, db); err != nil {
		t.Fatalf("migrate as the migrator: %v", err)
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

func connectAs(t *testing.T, url string, r authstack.Role, errs chan<- error) *nats.Conn {
	t.Helper()
	opts := []nats.Option{nats.UserInfo(r.NATSUser, r.NATSPassword)}
	if r.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(r.InboxPrefix))
	}
	nc, err := nats.Connect(url, append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case errs <- err:
		default:
		}
	}))...)
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
	st := authstack.Start(t)
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

// TestRedisRoles: Redis answers no one who has not logged in; the gateway's
// user runs flashgate's functions and no Lua of its own, cannot load or
// delete functions, and writes no key that decides a sale (its meta: state,
// window, limits; its epoch; the index of sales), not even through a
// function of the library; neither role may run the server's administration.
func TestRedisRoles(t *testing.T) {
	st := authstack.Start(t)
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
	client := func(r authstack.Role) rueidis.Client {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{st.Redis.Addr}, Username: r.RedisUser, Password: r.RedisPassword, DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	admin, gw, be := client(st.Admin), client(st.Gateway), client(st.Backend)

	// The gateway may not load the library; the backend may.
	code, _ := lua.Library()
	if err := gw.Do(ctx, gw.B().FunctionLoad().Replace().FunctionCode(code).Build()).Error(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("FUNCTION LOAD as the gateway: %v, want NOPERM", err)
	}
	if err := lua.LoadLibrary(ctx, be); err != nil {
		t.Fatalf("FUNCTION LOAD as the backend: %v", err)
	}

	spec := newSale(10, 2)
	k := lua.KeysFor(spec.ID, nil)
	if ok, err := lua.Load().Warm(ctx, be, spec, map[string]int64{"": 10}); !ok || err != nil {
		t.Fatalf("warm as the backend: %v, %v", ok, err)
	}
	// What a gateway does: admit through the function.
	a := lua.AdmitArgs{User: "alice", Quantity: 1, OrderID: 1<<40 + 1, Now: time.Now()}
	a.PayBy = a.Now.Add(time.Minute)
	if adm, err := lua.Load().Admit(ctx, gw, k, a); err != nil || adm.Outcome != lua.Admitted {
		t.Fatalf("admit as the gateway: %+v, %v", adm, err)
	}

	// Its own nodes it leases (and the second gateway its own).
	for _, c := range []struct {
		role authstack.Role
		node string
	}{{st.Gateway, lua.NodeLease(0)}, {st.Gateway, lua.NodeLease(503)}, {st.Gateway2, lua.NodeLease(504)}, {st.Gateway2, lua.NodeLease(1007)}} {
		v, err := admin.Do(ctx, admin.B().Arbitrary("ACL").Args("DRYRUN", c.role.RedisUser, "SET", c.node, "x", "NX", "PX", "15000").Build()).ToString()
		if err != nil || v != "OK" {
			t.Errorf("ACL DRYRUN %s SET %s: %q, %v; want OK", c.role.RedisUser, c.node, v, err)
		}
	}
	l, err := orderid.AcquireIn(ctx, gw, 15*time.Second, 0, 503)
	if err != nil {
		t.Fatalf("the gateway leasing a node of its range: %v", err)
	}
	if n := l.Node(); n < 0 || n > 503 {
		t.Errorf("leased node %d, outside 0-503", n)
	}
	if err := l.Close(ctx); err != nil {
		t.Errorf("the gateway freeing its node: %v", err)
	}

	// A function of the library that writes a sale's meta runs with its
	// caller's rights: closing a sale is the backend's.
	if err := lua.Close(ctx, gw, k); err == nil {
		t.Error("the gateway closed a sale through the library's function")
	} else if !strings.Contains(err.Error(), "can't run this command") && !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("the gateway closing a sale through the library: %v, want a refusal", err)
	}
	if err := lua.Close(ctx, be, k); err != nil {
		t.Errorf("the backend closing the sale: %v", err)
	}

	// Each refusal as ACL DRYRUN words it, and as the real command gets it.
	deny := [][]string{
		{"EVAL", "return redis.call('HSET', KEYS[1], 'state', 'closed')", "1", k.Meta},
		{"EVALSHA", "0000000000000000000000000000000000000000", "0"},
		{"SCRIPT", "LOAD", "return 1"},
		{"FUNCTION", "LOAD", "REPLACE", code},
		{"FUNCTION", "DELETE", "x"},
		{"FUNCTION", "FLUSH"},
		{"HSET", k.Meta, "state", "closed"},
		{"HSET", k.Meta, "total", "1000000"},
		{"DEL", k.Meta},
		{"SET", k.Epoch, "9"},
		{"DEL", k.Epoch},
		{"SET", k.Warming, "x"},
		{"SADD", lua.SalesIndex, "x"},
		{"HDEL", lua.Denylist, "sub:bot"}, // the operator's revocations
		{"ZADD", lua.LiveIndex, "1", "x"},
		{"SET", "other:key", "1"},
		// Another gateway's order-id nodes (this one leases 0-503).
		{"SET", lua.NodeLease(504), "x", "NX", "PX", "15000"},
		{"SET", lua.NodeLease(1007), "x", "NX", "PX", "15000"},
		{"DEL", lua.NodeLease(600)},
		{"FLUSHALL"}, {"FLUSHDB"}, {"KEYS", "*"}, {"CONFIG", "GET", "*"}, {"ACL", "LIST"}, {"SHUTDOWN"}, {"MONITOR"}, {"DEBUG", "SLEEP", "1"},
		// Last: where it is allowed, it blocks this Redis for good.
		{"EVAL", "while true do end", "0"},
	}
	for _, cmd := range deny {
		args := append([]string{"DRYRUN", st.Gateway.RedisUser}, cmd...)
		v, err := admin.Do(ctx, admin.B().Arbitrary("ACL").Args(args...).Build()).ToString()
		if err != nil || v == "OK" {
			t.Errorf("ACL DRYRUN gateway %.60q: %q, %v; want a refusal", cmd, v, err)
		}
		if cmd[0] == "SHUTDOWN" || cmd[0] == "MONITOR" || cmd[0] == "DEBUG" {
			continue // DRYRUN says it; not worth sending
		}
		err = gw.Do(ctx, gw.B().Arbitrary(cmd[0]).Args(cmd[1:]...).Build()).Error()
		if err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("%.60q as the gateway: %v, want NOPERM", cmd, err)
		}
	}
	// The backend runs no administration either.
	for _, cmd := range deny[len(deny)-9 : len(deny)-1] {
		if cmd[0] == "SHUTDOWN" || cmd[0] == "MONITOR" || cmd[0] == "DEBUG" {
			continue
		}
		err := be.Do(ctx, be.B().Arbitrary(cmd[0]).Args(cmd[1:]...).Build()).Error()
		if err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("%.60q as the backend: %v, want NOPERM", cmd, err)
		}
	}
}

// TestRedisLostLibrary: a Redis that lost the function library (restarted
// without it, a fresh node) answers the gateway "Function not found", which
// it turns into a 503-class error, until the backend's check loads it again.
func TestRedisLostLibrary(t *testing.T) {
	st := authstack.Start(t)
	base := e2eConfig(t)
	bcfg := st.Config(base, st.Backend)
	be := startBackend(t, bcfg)
	_ = be
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{st.Redis.Addr}, Username: st.Admin.RedisUser, Password: st.Admin.RedisPassword, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	gw, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{st.Redis.Addr}, Username: st.Gateway.RedisUser, Password: st.Gateway.RedisPassword, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	key := lua.KeysFor(testenv.ID("lost"), nil).Meta
	if _, err := lua.ServerTime(ctx, gw, key); err != nil {
		t.Fatalf("a function as the gateway, the library loaded by the backend: %v", err)
	}
	if err := admin.Do(ctx, admin.B().FunctionFlush().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	_, err = lua.ServerTime(ctx, gw, key)
	if !lua.IsNoLibrary(err) {
		t.Fatalf("a function as the gateway on a Redis without the library: %v, want Function not found", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err = lua.ServerTime(ctx, gw, key); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the backend never loaded the library again: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestNATSInboxes: each role's replies arrive under its own inbox prefix, and
// no other role may subscribe there: a gateway's login cannot read the
// orders JetStream delivers to the backends (buyers' data), nor anyone's
// replies on the default _INBOX; a backend's cannot read a gateway's.
func TestNATSInboxes(t *testing.T) {
	st := authstack.Start(t)
	for _, c := range []struct {
		role    authstack.Role
		subject string
	}{
		{st.Gateway, "_INBOX.>"},
		{st.Gateway, "_INBOX.x"},
		{st.Gateway, roles.BackendInbox + ".>"},
		{st.Gateway, ">"},
		{st.Backend, "_INBOX.>"},
		{st.Backend, roles.GatewayInbox + ".>"},
		{st.Consumer, roles.BackendInbox + ".>"},
		{st.Consumer, roles.GatewayInbox + ".>"},
	} {
		errs := make(chan error, 4)
		nc := connectAs(t, st.NATS.URL(), c.role, errs)
		if _, err := nc.SubscribeSync(c.subject); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-errs:
			if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				t.Errorf("%s subscribing to %s: %v, want a permissions violation", c.role.NATSUser, c.subject, err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("%s may subscribe to %s", c.role.NATSUser, c.subject)
		}
	}
}

// TestOrdersStreamCapped: the orders stream and its dead letters have a
// largest message and a most bytes (nats.max_msg_size, nats.max_bytes): an
// order bigger than the cap is refused by JetStream.
func TestOrdersStreamCapped(t *testing.T) {
	st := authstack.Start(t)
	base := e2eConfig(t)
	base.NATS.MaxMsgSize, base.NATS.MaxBytes = 8<<10, 64<<20
	bcfg := st.Config(base, st.Backend)
	startBackend(t, bcfg)
	nc := connectAs(t, st.NATS.URL(), st.Gateway, make(chan error, 1))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, name := range []string{bcfg.NATS.Stream} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if c := s.CachedInfo().Config; c.MaxMsgSize != 8<<10 || c.MaxBytes != 64<<20 {
			t.Errorf("stream %s: max_msg_size %d, max_bytes %d; want 8 KiB and 64 MiB", name, c.MaxMsgSize, c.MaxBytes)
		}
	}
	_, err = js.Publish(ctx, bus.OrderSubject(bcfg.NATS, "capped"), make([]byte, 9<<10))
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "maximum") {
		t.Errorf("a 9 KiB order: %v, want refused by the stream's max_msg_size", err)
	}
}

// TestMySQLRoles: the backend's login changes rows, not the schema (SHOW
// GRANTS lists no CREATE, ALTER, DROP, and a CREATE TABLE is refused), and
// the gateway has no login at all (the local stack's MariaDB, whose accounts
// scripts/stack.sh made from package roles).
func TestMySQLRoles(t *testing.T) {
	st := authstack.Start(t)
	base := e2eConfig(t)
	migrate(t, authstack.MySQLAs(t, base.MySQL.DSN, st.Migrator))
	db, err := mysql.OpenDB(authstack.MySQLAs(t, base.MySQL.DSN, st.Backend))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := db.QueryContext(ctx, "SHOW GRANTS")
	if err != nil {
		t.Fatal(err)
	}
	var grants []string
	for rows.Next() {
		var g string
		if err := rows.Scan(&g); err != nil {
			t.Fatal(err)
		}
		grants = append(grants, g)
	}
	rows.Close()
	if len(grants) < 2 {
		t.Fatalf("the backend's grants: %q", grants)
	}
	for _, g := range grants {
		for _, p := range []string{"CREATE", "ALTER", "DROP", "INDEX", "ALL PRIVILEGES", "GRANT OPTION", "SUPER", "PROCESS", "FILE"} {
			if strings.Contains(strings.ToUpper(g), p) {
				t.Errorf("the backend's login holds %s: %s", p, g)
			}
		}
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE evil (id INT)"); err == nil || !strings.Contains(err.Error(), "1142") {
		t.Errorf("CREATE TABLE as the backend: %v, want error 1142 (command denied)", err)
	}
	if _, err := db.ExecContext(ctx, "ALTER TABLE orders ADD COLUMN evil INT"); err == nil || !strings.Contains(err.Error(), "1142") {
		t.Errorf("ALTER TABLE as the backend: %v, want error 1142", err)
	}
	if _, err := db.ExecContext(ctx, "DROP TABLE orders"); err == nil || !strings.Contains(err.Error(), "1142") {
		t.Errorf("DROP TABLE as the backend: %v, want error 1142", err)
	}
	// Its rows it may change (the positive control of the refusals above).
	if _, err := db.ExecContext(ctx, "SELECT COUNT(*) FROM orders"); err != nil {
		t.Errorf("SELECT as the backend: %v", err)
	}

	// No gateway account: root (the stack's own login) lists none.
	root := authstack.MySQLAs(t, base.MySQL.DSN, authstack.Role{MySQLUser: "root", MySQLPassword: authstack.StackSecret(t, "S_MYSQL_ROOT")})
	rdb, err := mysql.OpenDB(root)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	var n int
	if err := rdb.QueryRowContext(ctx, "SELECT COUNT(*) FROM mysql.user WHERE user = ?", roles.Gateway).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("MariaDB has %d %s accounts, want none", n, roles.Gateway)
	}
	if err := rdb.QueryRowContext(ctx, "SELECT COUNT(*) FROM mysql.user WHERE user IN (?, ?)", roles.Backend, roles.Migrator).Scan(&n); err != nil || n != 2 {
		t.Errorf("MariaDB's backend and migrator accounts: %d, %v; want 2", n, err)
	}
}

// consumerReadsEvents: the backend's role published the sale's order events
// (the purchase's confirmation and its payment) to a stream it created; the
// consumer role reads them, and may do nothing else: not publish an event,
// not read the orders stream.
func consumerReadsEvents(t *testing.T, st *authstack.AuthStack, base config.Config, sale string) {
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
