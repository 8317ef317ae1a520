// Package authstack starts a private Redis and NATS that authenticate their
// clients with exactly the users and permissions of package roles, for the
// tests of what each role may and may not do (e2e/credentials_test.go).
package authstack

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/roles"
)

// Role is one role's logins (docs/credentials.md).
type Role struct {
	RedisUser, RedisPassword string
	NATSUser, NATSPassword   string
	// InboxPrefix is the role's NATS inbox prefix (roles.InboxPrefix).
	InboxPrefix string
	// MySQLUser and MySQLPassword: the local stack's MariaDB account of the
	// role ("" for the gateway, which has none).
	MySQLUser, MySQLPassword string
	// NodeIDs: a gateway's order-id nodes (gateway.node_ids), the only lease
	// keys its Redis user may write.
	NodeIDs string
}

// AuthStack is a private Redis and NATS that authenticate their clients with
// exactly the users and permissions of package roles (as scripts/stack.sh
// renders them for the local stack), with fresh passwords; MySQL is the local
// stack's, whose role accounts scripts/stack.sh made (var/secrets/).
type AuthStack struct {
	Redis, NATS *testenv.Server
	Admin       Role
	// Gateway and Gateway2 are two gateways' users, each leasing order-id
	// nodes of its own range (roles.GatewayUser).
	Gateway, Gateway2 Role
	Backend           Role
	// Consumer reads the order-events stream only (NATS; no Redis user).
	Consumer Role
	// Migrator changes the MySQL schema (MySQL only).
	Migrator Role
}

// Start renders the roles' Redis ACL and NATS users into a directory
// of the test's own and starts a Redis and a NATS on free ports with them.
// Their subjects and stream are the defaults of config.Default (the
// permissions name them).
func Start(t testing.TB) *AuthStack {
	t.Helper()
	dir := t.TempDir()
	pw := func() string { return testenv.Secret("pw-") }
	a := &AuthStack{
		Admin: Role{RedisUser: roles.Admin, RedisPassword: pw(), NATSUser: roles.Admin, NATSPassword: pw()},
		Gateway: Role{RedisUser: roles.Gateway, RedisPassword: pw(), NATSUser: roles.Gateway, NATSPassword: pw(), InboxPrefix: roles.GatewayInbox,
			NodeIDs: "0-503"},
		Gateway2: Role{RedisUser: roles.Gateway + "_2", RedisPassword: pw(), NATSUser: roles.Gateway, InboxPrefix: roles.GatewayInbox,
			NodeIDs: "504-1007"},
		Backend:  Role{RedisUser: roles.Backend, RedisPassword: pw(), NATSUser: roles.Backend, NATSPassword: pw(), InboxPrefix: roles.BackendInbox},
		Consumer: Role{NATSUser: roles.Consumer, NATSPassword: pw()},
	}
	// MySQL: the local stack's accounts (scripts/stack.sh, from package roles).
	stack := testenv.ReadSecrets(filepath.Join(filepath.Dir(testenv.SecretsFile()), "secrets", "generated.env"))
	a.Admin.MySQLUser, a.Admin.MySQLPassword = roles.Admin, stack["S_MYSQL_ADMIN"]
	a.Backend.MySQLUser, a.Backend.MySQLPassword = roles.Backend, stack["S_MYSQL_BACKEND"]
	a.Migrator = Role{MySQLUser: roles.Migrator, MySQLPassword: stack["S_MYSQL_MIGRATOR"]}
	a.Gateway2.NATSPassword = a.Gateway.NATSPassword
	redisPW := roles.Passwords{"default": pw(), roles.Admin: a.Admin.RedisPassword, roles.Gateway: a.Gateway.RedisPassword,
		a.Gateway2.RedisUser: a.Gateway2.RedisPassword, roles.Backend: a.Backend.RedisPassword, roles.Replica: pw()}
	gws := []roles.GatewayUser{{Name: a.Gateway.RedisUser, From: 0, To: 503}, {Name: a.Gateway2.RedisUser, From: 504, To: roles.AllNodes}}
	var acl bytes.Buffer
	if err := roles.RenderRedisACL(&acl, roles.RedisOptions{SetInfo: redisSetInfo(t), Gateways: gws}, redisPW); err != nil {
		t.Fatal(err)
	}
	aclFile := filepath.Join(dir, "redis-users.acl")
	if err := os.WriteFile(aclFile, acl.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}

	port := testenv.FreePort(t)
	a.Redis = testenv.NewServer(t, "redis-server", "127.0.0.1:"+strconv.Itoa(port), []string{
		// Persistence as the stack has it (an append-only file), fsynced at every
		// write so that a kill -9 and a start show what a restart loads.
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes", "--appendfsync", "always",
		"--dir", t.TempDir(), "--aclfile", aclFile}...)
	t.Cleanup(a.Redis.Kill)
	a.Redis.Start()

	var users bytes.Buffer
	natsPW := roles.Passwords{roles.Admin: a.Admin.NATSPassword, roles.Gateway: a.Gateway.NATSPassword,
		roles.Backend: a.Backend.NATSPassword, roles.Consumer: a.Consumer.NATSPassword}
	if err := roles.RenderNATSUsers(&users, config.Default(), natsPW); err != nil {
		t.Fatal(err)
	}
	port = testenv.FreePort(t)
	conf := "listen: \"127.0.0.1:" + strconv.Itoa(port) + "\"\nhttp: \"127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)) + "\"\n" +
		"server_name: " + testenv.ID("auth") + "\njetstream { store_dir: \"" + filepath.Join(dir, "js") + "\" }\n" +
		"authorization {\n" + users.String() + "}\n"
	path := filepath.Join(dir, "nats-test.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	a.NATS = testenv.NewServer(t, "nats-server", "127.0.0.1:"+strconv.Itoa(port), "-c", path)
	t.Cleanup(a.NATS.Kill)
	a.NATS.Start()
	return a
}

// Config is c pointed at the stack's servers with role's logins, and the
// stack's stream and subjects.
func (a *AuthStack) Config(c config.Config, r Role) config.Config {
	def := config.Default().NATS
	c.Redis.Addrs = []string{a.Redis.Addr}
	c.Redis.Username, c.Redis.Password = r.RedisUser, r.RedisPassword
	c.NATS.URL = a.NATS.URL()
	c.NATS.User, c.NATS.Password = r.NATSUser, r.NATSPassword
	c.NATS.InboxPrefix = r.InboxPrefix
	c.Gateway.NodeIDs = r.NodeIDs
	c.NATS.Stream, c.NATS.OrderSubject, c.NATS.EventSubject = def.Stream, def.OrderSubject, def.EventSubject
	c.NATS.CommandSubject, c.NATS.Consumer = def.CommandSubject, def.Consumer
	c.Events.Stream, c.Events.Subject = config.Default().Events.Stream, config.Default().Events.Subject
	return c
}

// redisSetInfo: the redis-server on PATH knows CLIENT SETINFO (7.2+).
func redisSetInfo(t testing.TB) bool {
	out, err := exec.Command("redis-server", "--version").Output()
	if err != nil {
		t.Fatalf("redis-server --version: %v", err)
	}
	m := regexp.MustCompile(`v=(\d+)\.(\d+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("redis-server --version: %q", out)
	}
	major, _ := strconv.Atoi(string(m[1]))
	minor, _ := strconv.Atoi(string(m[2]))
	return major > 7 || major == 7 && minor >= 2
}

// MySQLAs is dsn with role's MySQL login instead of its own.
func MySQLAs(t testing.TB, dsn string, r Role) string {
	t.Helper()
	if r.MySQLUser == "" || r.MySQLPassword == "" {
		t.Fatalf("no MySQL login for the role (var/secrets/generated.env of the local stack: %q)", r.MySQLUser)
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Passwd = r.MySQLUser, r.MySQLPassword
	return cfg.FormatDSN()
}

// StackSecret is one secret of the local stack (var/secrets/generated.env,
// S_…): the tests that check the stack's own accounts log in with it.
func StackSecret(t testing.TB, name string) string {
	t.Helper()
	v := testenv.ReadSecrets(filepath.Join(filepath.Dir(testenv.SecretsFile()), "secrets", "generated.env"))[name]
	if v == "" {
		t.Fatalf("%s not in var/secrets/generated.env (run scripts/stack.sh infra-up)", name)
	}
	return v
}
