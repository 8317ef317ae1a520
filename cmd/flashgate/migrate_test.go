package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/flashgate/flashgate/internal/testenv"
)

// `migrate status` on a new database lists every migration pending and fails
// (the schema is not fit to run on); `migrate up` applies them and lists them
// applied.
func TestMigrateCommand(t *testing.T) {
	t.Setenv("FLASHGATE_MYSQL_DSN", testenv.MySQL(t))
	var out, errb bytes.Buffer
	if err := run([]string{"migrate", "status", "--config", ""}, &out, &errb); err == nil ||
		!strings.Contains(err.Error(), "run `flashgate migrate up`") {
		t.Errorf("status of an empty database: %v", err)
	}
	if got := strings.Count(out.String(), "pending"); got != 12 {
		t.Errorf("status lists %d pending, want 12:\n%s", got, out.String())
	}
	out.Reset()
	if err := run([]string{"migrate", "up", "--config", ""}, &out, &errb); err != nil {
		t.Fatalf("up: %v\n%s", err, errb.String())
	}
	if got := strings.Count(out.String(), "applied"); got != 12 || !strings.Contains(out.String(), "0007  0007_degrade.sql") || !strings.Contains(out.String(), "0009  0009_sale_epoch.sql") ||
		!strings.Contains(out.String(), "0010  0010_payments.sql") || !strings.Contains(out.String(), "0011  0011_order_events.sql") ||
		!strings.Contains(out.String(), "0012  0012_admin_audit.sql") || !strings.Contains(out.String(), "0013  0013_sale_rebuilt_at.sql") {
		t.Errorf("after up:\n%s", out.String())
	}
	out.Reset()
	if err := run([]string{"migrate", "status", "--config", ""}, &out, &errb); err != nil {
		t.Errorf("status after up: %v", err)
	}
	if err := run([]string{"migrate", "down", "--config", ""}, &out, &errb); err == nil {
		t.Error("migrate down was taken")
	}
}
