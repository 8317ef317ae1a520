package testenv

import (
	"os"
	"path/filepath"
	"testing"
)

// TestReadSecrets reads var/secrets.env as the shell would.
func TestReadSecrets(t *testing.T) {
	p := filepath.Join(t.TempDir(), "secrets.env")
	body := "# comment\nexport FLASHGATE_REDIS_USERNAME='flashgate_admin'\nexport FLASHGATE_MYSQL_DSN='u:p@tcp(127.0.0.1:1)/flashgate'\n" +
		"export FLASHGATE_JWT_SECRET='it'\\''s'\nFLASHGATE_NATS_USER=bare\n\n"
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	got := readSecrets(p)
	for k, v := range map[string]string{
		"FLASHGATE_REDIS_USERNAME": "flashgate_admin",
		"FLASHGATE_MYSQL_DSN":      "u:p@tcp(127.0.0.1:1)/flashgate",
		"FLASHGATE_JWT_SECRET":     "it's",
		"FLASHGATE_NATS_USER":      "bare",
	} {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if len(got) != 4 {
		t.Errorf("read %v", got)
	}
}
