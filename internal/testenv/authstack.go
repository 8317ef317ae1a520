package testenv

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/flashgate/flashgate/config"
)

// Role is one role's logins (docs/credentials.md).
type Role struct {
	RedisUser, RedisPassword string
	NATSUser, NATSPassword   string
}

// AuthStack is a private Redis and NATS that authenticate their clients with
// exactly the users and permissions scripts/stack.sh gives the local stack,
// rendered by the script itself (stack.sh auth-conf) with fresh secrets.
type AuthStack struct {
	Redis, NATS *Server
	Admin       Role
	Gateway     Role
	Backend     Role
}

// StartAuthStack renders the stack's Redis ACL and NATS configuration into a
// directory of the test's own and starts a Redis and a NATS on free ports with
// them. Their subjects and stream are the defaults of config.Default (the
// permissions name them).
func StartAuthStack(t testing.TB) *AuthStack {
	t.Helper()
	root := filepath.Dir(SecretsFile())
	if root == "." || root == "" {
		t.Fatal("not inside the flashgate repository")
	}
	root = filepath.Dir(root)
	dir := t.TempDir()
	cmd := command(InstallTimeout, "bash", filepath.Join(root, "scripts", "stack.sh"), "auth-conf")
	// Only what the script needs: a password the environment gives would
	// replace a generated one.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "STACK_VAR=" + dir}
	if out, err := cmd.CombinedOutput(); cmd.Done(err) != nil {
		t.Fatalf("stack.sh auth-conf: %v\n%s", err, out)
	}
	s := readSecrets(filepath.Join(dir, "secrets", "generated.env"))
	a := &AuthStack{
		Admin:   Role{"flashgate_admin", s["S_REDIS_ADMIN"], "flashgate_admin", s["S_NATS_ADMIN"]},
		Gateway: Role{"flashgate_gateway", s["S_REDIS_GATEWAY"], "flashgate_gateway", s["S_NATS_GATEWAY"]},
		Backend: Role{"flashgate_backend", s["S_REDIS_BACKEND"], "flashgate_backend", s["S_NATS_BACKEND"]},
	}
	if a.Gateway.RedisPassword == "" || a.Backend.NATSPassword == "" {
		t.Fatalf("stack.sh auth-conf wrote no secrets: %v", s)
	}

	port := FreePort(t)
	a.Redis = &Server{t: t, bin: "redis-server", Addr: "127.0.0.1:" + strconv.Itoa(port), args: []string{
		// Persistence as the stack has it (an append-only file), fsynced at every
		// write so that a kill -9 and a start show what a restart loads.
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes", "--appendfsync", "always",
		"--dir", t.TempDir(), "--aclfile", filepath.Join(dir, "secrets", "redis-users.acl")}}
	t.Cleanup(a.Redis.Kill)
	a.Redis.Start()

	// The same configuration on this test's ports and store.
	b, err := os.ReadFile(filepath.Join(dir, "secrets", "nats.conf"))
	if err != nil {
		t.Fatal(err)
	}
	port = FreePort(t)
	conf := string(b)
	for re, repl := range map[string]string{
		`(?m)^listen: .*$`:    `listen: "127.0.0.1:` + strconv.Itoa(port) + `"`,
		`(?m)^http: .*$`:      `http: "127.0.0.1:` + strconv.Itoa(FreePort(t)) + `"`,
		`(?m)^jetstream .*$`:  `jetstream { store_dir: "` + filepath.Join(dir, "js") + `" }`,
		`(?m)^server_name.*$`: `server_name: ` + ID("auth"),
	} {
		if !regexp.MustCompile(re).MatchString(conf) {
			t.Fatalf("nats.conf has no line %s:\n%s", re, conf)
		}
		conf = regexp.MustCompile(re).ReplaceAllLiteralString(conf, repl)
	}
	path := filepath.Join(dir, "nats-test.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	a.NATS = &Server{t: t, bin: "nats-server", Addr: "127.0.0.1:" + strconv.Itoa(port), args: []string{"-c", path}}
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
	c.NATS.Stream, c.NATS.OrderSubject, c.NATS.EventSubject = def.Stream, def.OrderSubject, def.EventSubject
	c.NATS.CommandSubject, c.NATS.Consumer = def.CommandSubject, def.Consumer
	return c
}
