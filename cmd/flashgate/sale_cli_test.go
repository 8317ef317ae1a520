package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/internal/wire"
)

// TestSaleCommands runs the operator's sale commands against a real backend:
// create, list, update (a change that breaks nothing, then one refused with
// its reason), close, and update of the closed sale refused.
func TestSaleCommands(t *testing.T) {
	cfg := testenv.Config(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := wire.StartBackend(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = b.Shutdown(c)
	})
	t.Setenv("FLASHGATE_ADMIN_URL", "http://"+b.AdminAddr())
	t.Setenv("FLASHGATE_ADMIN_TOKEN", cfg.Admin.Token)
	id := testenv.ID("cli")
	sale := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := run(append(append([]string{"sale"}, args...), "--config", ""), &out, &errOut)
		if err != nil {
			return out.String() + errOut.String() + err.Error(), err
		}
		return out.String(), nil
	}
	if out, err := sale("create", "--id", id, "--total", "10", "--per-user-limit", "2", "--starts-at", "+1h", "--duration", "1h",
		"--limit", "phone:1:orders:day"); err != nil {
		t.Fatalf("create: %s", out)
	}
	out, err := sale("list")
	if err != nil || !strings.Contains(out, "ID") {
		t.Fatalf("list: %s", out)
	}
	var row string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, id+" ") {
			row = l
		}
	}
	if f := strings.Fields(row); len(f) != 7 || f[1] != "upcoming" || f[2] != "0/10" || f[3] != "2" {
		t.Fatalf("list row of %s: %q in\n%s", id, row, out)
	}
	if out, err := sale("update", id, "--total", "20", "--per-user-limit", "3", "--starts-at", "+30m"); err != nil ||
		!strings.Contains(out, `"total": 20`) || !strings.Contains(out, `"per_user_limit": 3`) {
		t.Fatalf("update: %s", out)
	}
	if out, err := sale("update", id, "--limit", "phone:2:orders:day"); err != nil || !strings.Contains(out, `"max": 2`) {
		t.Fatalf("update of a limit's max: %s", out)
	}
	if out, err := sale("update", id, "--limit", "ip:2"); err == nil || !strings.Contains(out, "409") || !strings.Contains(out, "only its max can change") {
		t.Fatalf("update of what a limit counts: %v %s", err, out)
	}
	// --region sends every region's units (this sale has none: 409).
	if out, err := sale("update", id, "--region", "bj=5"); err == nil || !strings.Contains(out, "409") || !strings.Contains(out, "it has no regions") {
		t.Fatalf("update --region of a sale without regions: %s", out)
	}
	if out, err := sale("update", id); err == nil || !strings.Contains(out, "nothing to change") {
		t.Fatalf("update without a change: %v %s", err, out)
	}
	if out, err := sale("update", id, "--ends-at", "+10m"); err == nil || !strings.Contains(out, "400") {
		t.Fatalf("update with the end before the start: %v %s", err, out)
	}
	if out, err := sale("close", id); err != nil || !strings.Contains(out, `"closed": true`) {
		t.Fatalf("close: %s", out)
	}
	if out, err := sale("update", id, "--total", "30"); err == nil || !strings.Contains(out, "409") || !strings.Contains(out, "closed") {
		t.Fatalf("update of a closed sale: %v %s", err, out)
	}
	out, err = sale("list", "--json")
	if err != nil || !strings.Contains(out, `"id": "`+id+`"`) {
		t.Fatalf("list --json: %s", out)
	}
}
