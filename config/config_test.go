package config

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

const exampleFile = "../configs/flashgate.yaml"

// clearEnv hides the caller's FLASHGATE_* variables for the test's duration, so
// that a developer pointing tests at other servers does not change the outcome.
func clearEnv(t *testing.T) {
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "FLASHGATE_") {
			t.Setenv(name, "") // restores the value afterwards
			os.Unsetenv(name)
		}
	}
}

func TestDefaultValidates(t *testing.T) {
	c := Default()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		check      func(c Config) bool
		err        string // "" for success
	}{
		{name: "empty", yaml: "", check: isDefault},
		{name: "blank lines", yaml: "\n\n", check: isDefault},
		{name: "comments only", yaml: "# nothing\n# at all\n", check: isDefault},
		{name: "null document", yaml: "~\n", check: isDefault},
		{name: "explicit document", yaml: "---\ngateway:\n  listen: :9000\n",
			check: func(c Config) bool { return c.Gateway.Listen == ":9000" }},
		{name: "one key, others default", yaml: "gateway:\n  listen: :9000\n", check: func(c Config) bool {
			d := Default()
			d.Gateway.Listen = ":9000"
			return reflect.DeepEqual(c, d)
		}},
		{name: "empty section", yaml: "gateway:\nbackend:\n", check: isDefault},
		{name: "duration", yaml: "gateway: {read_timeout: 1m30s, admit_timeout: 250ms}", check: func(c Config) bool {
			return c.Gateway.ReadTimeout == 90*time.Second && c.Gateway.AdmitTimeout == 250*time.Millisecond
		}},
		{name: "list replaces", yaml: "redis:\n  addrs: [a:1, b:2, c:3]\n",
			check: func(c Config) bool { return slices.Equal(c.Redis.Addrs, []string{"a:1", "b:2", "c:3"}) }},
		{name: "int64", yaml: "nats: {max_stream_msgs: 10000000000}",
			check: func(c Config) bool { return c.NATS.MaxStreamMsgs == 1e10 }},
		{name: "unknown top-level key", yaml: "gatway:\n  listen: :9000\n", err: "gatway"},
		{name: "unknown nested key", yaml: "gateway:\n  lisen: :9000\n", err: "lisen"},
		{name: "unknown rate-limit key", yaml: "ratelimit:\n  per_planet: {rate: 1, burst: 1}\n", err: "per_planet"},
		{name: "bare int duration", yaml: "gateway: {read_timeout: 5}", err: "time.Duration"},
		{name: "bad duration", yaml: "gateway: {read_timeout: soon}", err: "soon"},
		{name: "string for int", yaml: "backend: {batch_size: many}", err: "many"},
		{name: "scalar for list", yaml: "redis: {addrs: a:1}", err: "[]string"},
		{name: "list for section", yaml: "gateway: []", err: "config.Gateway"},
		{name: "not a mapping", yaml: "[]", err: "config.Config"},
		{name: "bad yaml", yaml: "gateway: {listen", err: "yaml"},
		// A second document would be ignored silently: ops would believe it applied.
		{name: "second document", yaml: "gateway:\n  listen: x\n---\nbackend: {batch_size: 7}\n", err: "document"},
		{name: "empty then second document", yaml: "---\n---\ngatway: 1\n", err: "document"},
		{name: "trailing separator", yaml: "gateway:\n  listen: x\n---\n",
			check: func(c Config) bool { return c.Gateway.Listen == "x" }},
		{name: "document end marker", yaml: "gateway:\n  listen: x\n...\n",
			check: func(c Config) bool { return c.Gateway.Listen == "x" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			err := Parse([]byte(tc.yaml), &c)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Parse(%q) = %v, want an error naming %q", tc.yaml, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q): %v", tc.yaml, err)
			}
			if !tc.check(c) {
				t.Fatalf("Parse(%q) = %+v", tc.yaml, c)
			}
		})
	}
}

func isDefault(c Config) bool { return reflect.DeepEqual(c, Default()) }

func TestEnv(t *testing.T) {
	for _, tc := range []struct {
		name  string
		env   map[string]string
		check func(c Config) bool
		err   string
	}{
		{"redis addrs", map[string]string{"FLASHGATE_REDIS_ADDRS": "10.0.0.1:7001, 10.0.0.2:7002,,"},
			func(c Config) bool { return slices.Equal(c.Redis.Addrs, []string{"10.0.0.1:7001", "10.0.0.2:7002"}) }, ""},
		{"nats url", map[string]string{"FLASHGATE_NATS_URL": "nats://n:4222"},
			func(c Config) bool { return c.NATS.URL == "nats://n:4222" }, ""},
		{"mysql dsn", map[string]string{"FLASHGATE_MYSQL_DSN": "u:p@tcp(db:3306)/x?parseTime=true"},
			func(c Config) bool { return c.MySQL.DSN == "u:p@tcp(db:3306)/x?parseTime=true" }, ""},
		{"jwt secret, short name", map[string]string{"FLASHGATE_JWT_SECRET": "s1"},
			func(c Config) bool { return c.Auth.JWTSecret == "s1" }, ""},
		{"jwt secret, full name", map[string]string{"FLASHGATE_AUTH_JWT_SECRET": "s2"},
			func(c Config) bool { return c.Auth.JWTSecret == "s2" }, ""},
		{"jwt secret, both: docs/design.md's name wins", map[string]string{"FLASHGATE_AUTH_JWT_SECRET": "long", "FLASHGATE_JWT_SECRET": "short"},
			func(c Config) bool { return c.Auth.JWTSecret == "short" }, ""},
		{"admin token", map[string]string{"FLASHGATE_ADMIN_TOKEN": "tok"},
			func(c Config) bool { return c.Admin.Token == "tok" }, ""},
		{"eddsa key file", map[string]string{"FLASHGATE_AUTH_EDDSA_PUBLIC_KEY_FILE": "/k.pem"},
			func(c Config) bool { return c.Auth.EdDSAPublicKeyFile == "/k.pem" }, ""},
		{"duration", map[string]string{"FLASHGATE_GATEWAY_READ_TIMEOUT": "3s"},
			func(c Config) bool { return c.Gateway.ReadTimeout == 3*time.Second }, ""},
		{"int", map[string]string{"FLASHGATE_BACKEND_BATCH_SIZE": "64"},
			func(c Config) bool { return c.Backend.BatchSize == 64 }, ""},
		{"int64", map[string]string{"FLASHGATE_NATS_MAX_STREAM_MSGS": "5000000000"},
			func(c Config) bool { return c.NATS.MaxStreamMsgs == 5e9 }, ""},
		{"several", map[string]string{"FLASHGATE_GATEWAY_LISTEN": ":1", "FLASHGATE_ORDERS_PAYMENT_TIMEOUT": "1h"},
			func(c Config) bool { return c.Gateway.Listen == ":1" && c.Orders.PaymentTimeout == time.Hour }, ""},
		{"unrelated variables", map[string]string{"FLASHGATE_NOPE": "x", "REDIS_ADDRS": "x"}, isDefault, ""},
		{"bad int", map[string]string{"FLASHGATE_BACKEND_BATCH_SIZE": "lots"}, nil, "FLASHGATE_BACKEND_BATCH_SIZE"},
		{"float for int", map[string]string{"FLASHGATE_GATEWAY_MAX_BODY_BYTES": "1.5"}, nil, "FLASHGATE_GATEWAY_MAX_BODY_BYTES"},
		{"bad duration", map[string]string{"FLASHGATE_GATEWAY_READ_TIMEOUT": "3"}, nil, "FLASHGATE_GATEWAY_READ_TIMEOUT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			err := applyEnv(&c, func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("applyEnv(%v) = %v, want an error naming %s", tc.env, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("applyEnv(%v): %v", tc.env, err)
			}
			if !tc.check(c) {
				t.Fatalf("applyEnv(%v) = %+v", tc.env, c)
			}
		})
	}
}

// TestEveryKeyHasAnEnvName: every leaf of Config answers to FLASHGATE_<PATH>.
func TestEveryKeyHasAnEnvName(t *testing.T) {
	for _, path := range leafPaths(reflect.TypeOf(Config{}), nil) {
		name := "FLASHGATE_" + strings.ToUpper(strings.Join(path, "_"))
		c := Default()
		err := applyEnv(&c, func(k string) (string, bool) {
			if k == name {
				return "not-a-valid-value-for-anything-but-a-string", true
			}
			return "", false
		})
		changed := !reflect.DeepEqual(c, Default())
		if err == nil && !changed {
			t.Errorf("%s (%s) is ignored", name, strings.Join(path, "."))
		}
	}
}

func TestLoad(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "f.yaml")
	write := func(s string) {
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("gateway:\n  listen: :9000\n  read_timeout: 7s\nredis:\n  addrs: [file:1]\n")
	t.Setenv("FLASHGATE_GATEWAY_READ_TIMEOUT", "3s")
	const envSecret = "from-env-0123456789abcdef0123456789"
	t.Setenv("FLASHGATE_JWT_SECRET", envSecret)
	c, err := Load(file)
	if err != nil {
		t.Fatal(err)
	}
	// Defaults, then the file, then the environment.
	if c.Gateway.Listen != ":9000" || c.Gateway.ReadTimeout != 3*time.Second ||
		!slices.Equal(c.Redis.Addrs, []string{"file:1"}) || c.Auth.JWTSecret != envSecret ||
		c.Gateway.WriteTimeout != 5*time.Second {
		t.Fatalf("Load = %+v", c)
	}

	if c, err := Load(""); err != nil || c.Auth.JWTSecret != envSecret {
		t.Fatalf(`Load("") = %v; secret %q`, err, c.Auth.JWTSecret)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Fatal("Load of a missing file: no error")
	}
	write("gateway:\n  lisen: :9000\n")
	if _, err := Load(file); err == nil || !strings.Contains(err.Error(), "lisen") || !strings.Contains(err.Error(), file) {
		t.Fatalf("Load of a bad file = %v, want the key and the file named", err)
	}
	write("")
	t.Setenv("FLASHGATE_BACKEND_BATCH_SIZE", "x")
	if _, err := Load(file); err == nil || !strings.Contains(err.Error(), "FLASHGATE_BACKEND_BATCH_SIZE") {
		t.Fatalf("Load with a bad env value = %v", err)
	}
	t.Setenv("FLASHGATE_BACKEND_BATCH_SIZE", "0")
	if _, err := Load(file); err == nil || !strings.Contains(err.Error(), "batch_size") {
		t.Fatalf("Load of an invalid config = %v, want Validate's error", err)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(c *Config)
		err  string
	}{
		{"no redis", func(c *Config) { c.Redis.Addrs = nil }, "redis.addrs"},
		{"small body", func(c *Config) { c.Gateway.MaxBodyBytes = 63 }, "max_body_bytes"},
		{"batch 0", func(c *Config) { c.Backend.BatchSize = 0 }, "batch_size"},
		{"batch too big", func(c *Config) { c.Backend.BatchSize = 5001 }, "batch_size"},
		{"short dedup", func(c *Config) { c.NATS.DedupWindow = time.Minute }, "dedup_window"},
		{"no payment timeout", func(c *Config) { c.Orders.PaymentTimeout = 0 }, "payment_timeout"},
		{"two algorithms", func(c *Config) { c.Auth.JWTSecret, c.Auth.EdDSAPublicKeyFile = "s", "/k" }, "not both"},
		{"nats password alone", func(c *Config) { c.NATS.Password = "p" }, "nats.password"},
		{"redis user without password", func(c *Config) { c.Redis.Username = "u" }, "redis.username"},
		{"several at once", func(c *Config) { c.Redis.Addrs, c.Backend.BatchSize = nil, 0 }, "batch_size"},
		{"jwt secret 31 bytes", func(c *Config) { c.Auth.JWTSecret = strings.Repeat("j", 31) }, "at least 32"},
		{"jwt secret published", func(c *Config) { c.Auth.JWTSecret = "flashgate-local-dev-jwt-secret" }, "published"},
		{"admin token 23 bytes", func(c *Config) { c.Admin.Token = strings.Repeat("a", 23) }, "at least 24"},
		{"admin token published", func(c *Config) { c.Admin.Token = "flashgate-local-dev-admin-token" }, "published"},
		{"admin token is the published jwt secret", func(c *Config) { c.Admin.Token = "flashgate-local-dev-jwt-secret" }, "published"},
		{"key secret short", func(c *Config) { c.Auth.Keys = []Key{{Kid: "k2", Secret: "short"}} }, "k2"},
		{"key without kid", func(c *Config) { c.Auth.Keys = []Key{{Secret: strings.Repeat("k", 32)}} }, "kid is empty"},
		{"key twice", func(c *Config) {
			c.Auth.Keys = []Key{{Kid: "a", Secret: strings.Repeat("k", 32)}, {Kid: "a", Secret: strings.Repeat("l", 32)}}
		}, "twice"},
		{"key with secret and file", func(c *Config) {
			c.Auth.Keys = []Key{{Kid: "a", Secret: strings.Repeat("k", 32), PublicKeyFile: "/k.pem"}}
		}, "exactly one"},
		{"key with neither", func(c *Config) { c.Auth.Keys = []Key{{Kid: "a"}} }, "exactly one"},
		{"signing kid unknown", func(c *Config) { c.Auth.SigningKid = "nope" }, "signing_kid"},
		{"signing kid is a public key", func(c *Config) {
			c.Auth.Keys, c.Auth.SigningKid = []Key{{Kid: "ed", PublicKeyFile: "/k.pem"}}, "ed"
		}, "signing_kid"},
		{"max token ttl 0", func(c *Config) { c.Auth.MaxTokenTTL = 0 }, "max_token_ttl"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.edit(&c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("Validate = %v, want an error naming %s", err, tc.err)
			}
		})
	}
	// The edges that are allowed.
	c := Default()
	c.Gateway.MaxBodyBytes, c.Backend.BatchSize, c.NATS.DedupWindow = 64, 5000, 2*time.Minute
	c.Auth.JWTSecret = strings.Repeat("s", 32)
	c.Admin.Token = strings.Repeat("t", 24)
	c.Auth.Keys = []Key{{Kid: "k2", Secret: strings.Repeat("k", 32)}, {Kid: "ed", PublicKeyFile: "/k.pem"}}
	c.Auth.SigningKid = "k2"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	// Dev mode lets the local stack's published and short values through.
	c.Auth.JWTSecret, c.Admin.Token = "flashgate-local-dev-jwt-secret", "flashgate-local-dev-admin-token"
	c.Auth.Keys = []Key{{Kid: "k2", Secret: "s"}}
	c.Dev = true
	if err := c.Validate(); err != nil {
		t.Fatalf("dev mode: %v", err)
	}
	// An empty admin token is allowed: it closes the admin API.
	c = Default()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
}

// TestLoadRefusesWeakSecrets: what the gateway and backend processes load
// (Load validates) refuses the Makefile's values unless FLASHGATE_DEV=1.
func TestLoadRefusesWeakSecrets(t *testing.T) {
	t.Setenv("FLASHGATE_DEV", "0") // make test runs in dev mode
	t.Setenv("FLASHGATE_JWT_SECRET", "flashgate-local-dev-jwt-secret")
	t.Setenv("FLASHGATE_ADMIN_TOKEN", "flashgate-local-dev-admin-token")
	_, err := Load("")
	if err == nil || !strings.Contains(err.Error(), "auth.jwt_secret") || !strings.Contains(err.Error(), "admin.token") {
		t.Fatalf("Load with the published secrets = %v, want both refused", err)
	}
	t.Setenv("FLASHGATE_DEV", "1")
	c, err := Load("")
	if err != nil || !c.Dev {
		t.Fatalf("Load in dev mode = %v (dev %v)", err, c.Dev)
	}
	t.Setenv("FLASHGATE_DEV", "0")
	t.Setenv("FLASHGATE_AUTH_KEYS", `[{kid: k2, secret: `+strings.Repeat("x", 32)+`}]`)
	t.Setenv("FLASHGATE_JWT_SECRET", strings.Repeat("y", 32))
	t.Setenv("FLASHGATE_ADMIN_TOKEN", strings.Repeat("z", 24))
	c, err = Load("")
	if err != nil || len(c.Auth.Keys) != 1 || c.Auth.Keys[0] != (Key{Kid: "k2", Secret: strings.Repeat("x", 32)}) {
		t.Fatalf("auth.keys from the environment: %+v %v", c.Auth.Keys, err)
	}
	t.Setenv("FLASHGATE_AUTH_KEYS", `[{kid: k2, secret: short, extra: 1}]`)
	if _, err := Load(""); err == nil || !strings.Contains(err.Error(), "FLASHGATE_AUTH_KEYS") {
		t.Fatalf("a bad FLASHGATE_AUTH_KEYS = %v", err)
	}
}

// TestExampleFile keeps configs/flashgate.yaml honest: it loads, it holds the
// defaults, every key of Config appears in it, and each has a comment.
func TestExampleFile(t *testing.T) {
	clearEnv(t)
	c, err := Load(exampleFile)
	if err != nil {
		t.Fatal(err)
	}
	if c.Source != exampleFile {
		t.Fatalf("Source %q, want %q", c.Source, exampleFile)
	}
	c.Source = ""
	if !reflect.DeepEqual(c, Default()) {
		t.Fatalf("%s differs from Default():\n got %+v\nwant %+v", exampleFile, c, Default())
	}
	b, err := os.ReadFile(exampleFile)
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	comments := map[string]string{} // "gateway.listen" -> its line comment
	// A key of a flow mapping ({rate: 20, burst: 40}  # …) shares its parent's comment.
	var collect func(n *yaml.Node, prefix, inherited string)
	collect = func(n *yaml.Node, prefix, inherited string) {
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			c := k.LineComment + v.LineComment
			if c == "" {
				c = inherited
			}
			comments[prefix+k.Value] = c
			if v.Kind == yaml.MappingNode {
				collect(v, prefix+k.Value+".", c)
			}
		}
	}
	collect(doc.Content[0], "", "")
	for _, path := range leafPaths(reflect.TypeOf(Config{}), nil) {
		key := strings.Join(path, ".")
		comment, ok := comments[key]
		if !ok {
			t.Errorf("%s lacks %s", exampleFile, key)
			continue
		}
		if strings.TrimSpace(strings.TrimPrefix(comment, "#")) == "" {
			t.Errorf("%s: %s has no comment saying what it does", exampleFile, key)
		}
	}
	// Secrets stay out of the file and say where they come from.
	for key, env := range map[string]string{"auth.jwt_secret": "FLASHGATE_JWT_SECRET", "admin.token": "FLASHGATE_ADMIN_TOKEN", "payments.secret": "FLASHGATE_PAYMENTS_SECRET"} {
		if !strings.Contains(comments[key], env) {
			t.Errorf("%s: the comment of %s does not name %s", exampleFile, key, env)
		}
	}
}

// leafPaths lists the yaml paths of every non-struct field.
func leafPaths(t reflect.Type, prefix []string) [][]string {
	var out [][]string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		path := append(slices.Clone(prefix), name)
		if f.Type.Kind() == reflect.Struct {
			out = append(out, leafPaths(f.Type, path)...)
		} else {
			out = append(out, path)
		}
	}
	return out
}

func FuzzParse(f *testing.F) {
	if b, err := os.ReadFile(exampleFile); err == nil {
		f.Add(b)
	}
	for _, s := range []string{"", "~", "gateway: {listen: x}", "gateway:\n  lisen: 1\n", "[]", "a: &a [*a]",
		"redis: {addrs: [a, b]}", "---\n---\n", "gateway: {read_timeout: 5}", "{", "\t"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c := Default()
		if err := Parse(b, &c); err != nil {
			return
		}
		_ = c.Validate()
		// What parsed must parse again the same way once written out.
		out, err := yaml.Marshal(&c)
		if err != nil {
			t.Fatalf("marshal %+v: %v", c, err)
		}
		c2 := Default()
		if err := Parse(out, &c2); err != nil {
			t.Fatalf("re-parse of %q: %v", out, err)
		}
		if !reflect.DeepEqual(c, c2) && !(len(c.Redis.Addrs) == 0 && len(c2.Redis.Addrs) == 0) {
			t.Fatalf("round trip: %+v != %+v", c, c2)
		}
	})
}

func TestRateLimitValidate(t *testing.T) {
	cases := []struct {
		name string
		mut  func(*RateLimit)
		err  string
	}{
		{"defaults", func(*RateLimit) {}, ""},
		{"off", func(r *RateLimit) { r.PerIP = Rate{} }, ""},
		{"negative rate", func(r *RateLimit) { r.PerUser.Rate = -1 }, "per_user"},
		{"rate without burst", func(r *RateLimit) { r.PerSale = Rate{Rate: 10} }, "per_sale"},
		{"negative inflight", func(r *RateLimit) { r.MaxInflight = -1 }, "max_inflight"},
	}
	for _, c := range cases {
		r := Default().RateLimit
		c.mut(&r)
		err := r.Validate()
		if (err == nil) != (c.err == "") || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%s: %v, want error naming %q", c.name, err, c.err)
		}
	}
	t.Setenv("FLASHGATE_RATELIMIT_PER_IP_RATE", "2.5")
	t.Setenv("FLASHGATE_RATELIMIT_PER_IP_BURST", "7")
	c, err := Load("")
	if err != nil || c.RateLimit.PerIP != (Rate{Rate: 2.5, Burst: 7}) {
		t.Fatalf("env override of a rate: %+v %v", c.RateLimit.PerIP, err)
	}
}

// TestEnvironRoundTrip: a config written out by Environ and read back by the
// environment overrides is the same config, every key of it.
func TestEnvironRoundTrip(t *testing.T) {
	want := Default()
	want.Redis.Addrs = []string{"127.0.0.1:1", "127.0.0.1:2"}
	want.NATS.Consumer = "c-1"
	want.Auth.JWTSecret = "s3cret"
	want.Admin.Token = "t0ken"
	want.Gateway.AdmitTimeout = 1500 * time.Millisecond
	want.RateLimit.PerIP.Rate = 2.5
	want.Gateway.ReusePort = true
	want.Redis.Username, want.Redis.Password = "flashgate_gateway", "r-pass"
	want.NATS.User, want.NATS.Password = "gateway", "n-pass"
	want.MySQL.DSN = "flashgate_app:m-pass@tcp(127.0.0.1:13306)/flashgate"
	want.MySQL.AutoMigrate = true // FLASHGATE_MYSQL_AUTO_MIGRATE (the tests' backends)
	want.Auth.Keys = []Key{{Kid: "k2", Secret: "s2: with, [yaml] chars"}, {Kid: "ed", PublicKeyFile: "/a b.pem"}}
	want.Auth.SigningKid = "k2"
	want.Auth.MaxTokenTTL = time.Hour
	want.Payments.Secret = Secrets{"new-pay-secret", "old-pay-secret"}
	want.Dev = true
	env := map[string]string{}
	for _, kv := range Environ(want) {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	got := Default()
	if err := applyEnv(&got, func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil {
		t.Fatal(err)
	}
	// The names the stack's var/secrets.env writes are the ones Environ writes.
	for _, k := range []string{"FLASHGATE_REDIS_USERNAME", "FLASHGATE_REDIS_PASSWORD", "FLASHGATE_NATS_USER", "FLASHGATE_NATS_PASSWORD", "FLASHGATE_MYSQL_DSN", "FLASHGATE_MYSQL_AUTO_MIGRATE"} {
		if env[k] == "" {
			t.Errorf("Environ has no %s", k)
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, want)
	}
}

// A backend migrates by itself only when told to: by default a schema change
// is an operator's step (`flashgate migrate up`).
func TestAutoMigrateOffByDefault(t *testing.T) {
	if Default().MySQL.AutoMigrate {
		t.Error("mysql.auto_migrate defaults to on")
	}
	c := Default()
	if err := Parse([]byte("mysql:\n  auto_migrate: true\n"), &c); err != nil || !c.MySQL.AutoMigrate {
		t.Errorf("auto_migrate: true read as %t (%v)", c.MySQL.AutoMigrate, err)
	}
}

// TestPaymentsSecret: payments.secret takes one secret or a list (rotation),
// from the file or from FLASHGATE_PAYMENTS_SECRET (commas), and is held to
// the strength of the other secrets outside dev mode.
func TestPaymentsSecret(t *testing.T) {
	clearEnv(t)
	strong, other := strings.Repeat("p", 32), strings.Repeat("q", 32)
	for _, c := range []struct {
		yaml string
		want Secrets
	}{
		{"payments: {secret: " + strong + "}\n", Secrets{strong}},
		{"payments: {secret: [" + strong + ", " + other + "]}\n", Secrets{strong, other}},
		{"payments: {secret: \"\"}\n", nil},
		{"payments: {secret: []}\n", nil},
	} {
		cfg := Default()
		if err := Parse([]byte(c.yaml), &cfg); err != nil || !reflect.DeepEqual(cfg.Payments.Secret, c.want) {
			t.Errorf("%q: %q %v, want %q", c.yaml, cfg.Payments.Secret, err, c.want)
		}
	}
	cfg := Default()
	if err := Parse([]byte("payments: {secret: x, extra: 1}\n"), &cfg); err == nil {
		t.Error("an unknown key under payments was accepted")
	}
	if err := Parse([]byte("payments: {secret: {a: b}}\n"), &cfg); err == nil {
		t.Error("a mapping as payments.secret was accepted")
	}
	t.Setenv("FLASHGATE_PAYMENTS_SECRET", strong+","+other)
	c, err := Load("")
	if err != nil || !reflect.DeepEqual(c.Payments.Secret, Secrets{strong, other}) {
		t.Fatalf("from the environment: %q %v", c.Payments.Secret, err)
	}
	t.Setenv("FLASHGATE_PAYMENTS_SECRET", strong+",short")
	if _, err := Load(""); err == nil || !strings.Contains(err.Error(), "payments.secret[1]") {
		t.Fatalf("a weak second secret: %v", err)
	}
	t.Setenv("FLASHGATE_DEV", "1")
	if _, err := Load(""); err != nil {
		t.Fatalf("a weak secret in dev mode: %v", err)
	}
}
