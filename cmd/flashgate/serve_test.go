package main

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

// TestServeRefusesPublishedSecrets: neither process starts with the secrets
// the repository publishes unless dev mode is on, and dev mode says so.
func TestServeRefusesPublishedSecrets(t *testing.T) {
	t.Setenv("FLASHGATE_JWT_SECRET", "flashgate-local-dev-jwt-secret")
	t.Setenv("FLASHGATE_ADMIN_TOKEN", "flashgate-local-dev-admin-token")
	// Nothing listens there: a process that got past its configuration fails
	// at once instead of serving.
	t.Setenv("FLASHGATE_REDIS_ADDRS", "127.0.0.1:1")
	t.Setenv("FLASHGATE_NATS_URL", "nats://127.0.0.1:1")
	t.Setenv("FLASHGATE_MYSQL_DSN", "root@tcp(127.0.0.1:1)/x?timeout=1s")
	for _, name := range []string{"gateway", "backend"} {
		t.Setenv("FLASHGATE_DEV", "0")
		var stderr bytes.Buffer
		err := run([]string{name, "--config", ""}, io.Discard, &stderr)
		var code exitCode
		if !errors.As(err, &code) || code != 1 || !strings.Contains(stderr.String(), "published") ||
			strings.Contains(stderr.String(), `"msg":"starting"`) {
			t.Fatalf("%s with published secrets: %v\n%s", name, err, stderr.String())
		}

		t.Setenv("FLASHGATE_DEV", "1")
		stderr.Reset()
		_ = run([]string{name, "--config", ""}, io.Discard, &stderr)
		if !strings.Contains(stderr.String(), "dev mode") || !strings.Contains(stderr.String(), `"msg":"starting"`) {
			t.Fatalf("%s in dev mode: no warning, or it did not get past its configuration:\n%s", name, stderr.String())
		}
	}
}
