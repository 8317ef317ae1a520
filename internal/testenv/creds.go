package testenv

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/redis/rueidis"
)

// The stack authenticates every client (docs/credentials.md): tests log in
// with the operator's set, which `make infra-up` writes to var/secrets.env.
// A variable in the environment wins over the file, so FLASHGATE_* point the
// tests at other servers with other credentials.

var (
	secretsOnce sync.Once
	secrets     map[string]string
)

// SecretsFile is var/secrets.env of the repository the tests run in ("" when
// the tests do not run inside it).
func SecretsFile() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/flashgate/flashgate\n") {
			return filepath.Join(dir, "var", "secrets.env")
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// readSecrets parses the lines NAME=VALUE of the stack's secrets file
// (optionally "export "; VALUE bare or in single quotes, a quote inside
// written '\” as the shell does).
func readSecrets(path string) map[string]string {
	out := map[string]string{}
	f, err := os.Open(path)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		if !ok {
			continue
		}
		if len(v) >= 2 && v[0] == '\'' && v[len(v)-1] == '\'' {
			v = strings.ReplaceAll(v[1:len(v)-1], `'\''`, `'`)
		}
		out[k] = v
	}
	return out
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	secretsOnce.Do(func() {
		if p := SecretsFile(); p != "" {
			secrets = readSecrets(p)
		}
	})
	if v := secrets[name]; v != "" {
		return v
	}
	return def
}

// RedisUsername and RedisPassword log the tests in to Redis ("" when the
// stack has no authentication).
func RedisUsername() string { return env("FLASHGATE_REDIS_USERNAME", "") }

// RedisPassword is RedisUsername's password.
func RedisPassword() string { return env("FLASHGATE_REDIS_PASSWORD", "") }

// RedisOption is a client option for addrs with the tests' credentials.
func RedisOption(addrs []string) rueidis.ClientOption {
	return rueidis.ClientOption{InitAddress: addrs, Username: RedisUsername(), Password: RedisPassword(), DisableCache: true}
}

// NATSUser and NATSPassword log the tests in to NATS.
func NATSUser() string { return env("FLASHGATE_NATS_USER", "") }

// NATSPassword is NATSUser's password.
func NATSPassword() string { return env("FLASHGATE_NATS_PASSWORD", "") }

// NATSOptions are the options every test connection to NATS needs (its
// credentials), followed by extra.
func NATSOptions(extra ...nats.Option) []nats.Option {
	var opts []nats.Option
	if u := NATSUser(); u != "" {
		opts = append(opts, nats.UserInfo(u, NATSPassword()))
	}
	return append(opts, extra...)
}

// ReadSecrets is readSecrets for the tests' other helpers: the NAME=VALUE
// lines of a secrets file of the stack (empty when it cannot be read).
func ReadSecrets(path string) map[string]string { return readSecrets(path) }
