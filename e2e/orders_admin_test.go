package e2e

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/loadgen"
)

// cli runs bin/flashgate with cfg's environment and the admin token tok; it
// answers stdout, stderr and the exit status.
func cli(t *testing.T, cfg config.Config, adminAddr, tok string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(binary, append(args, "--config", "")...)
	cmd.Env = append(backendEnv(cfg, "127.0.0.1:0"), "FLASHGATE_ADMIN_URL=http://"+adminAddr, "FLASHGATE_ADMIN_TOKEN="+tok,
		"FLASHGATE_ADMIN_KEYS=[]")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// TestExportFloodedSale: a sale flooded by 1,500 buyers for 300 units is
// exported, as CSV and as JSON, through `flashgate sale export`: every
// accepted order is there exactly once and nothing else is.
func TestExportFloodedSale(t *testing.T) {
	cfg := e2eConfig(t)
	be := startBackend(t, cfg)
	gw := startGateway(t, cfg)
	s := newSale(300, 1)
	createSale(t, cfg, be.AdminAddr(), s)
	awaitSale(t, gw, s.ID)
	const buyers = 1500
	res, err := loadgen.Run(t.Context(), loadgen.Config{Target: "http://" + gw.Addr(), Sale: s.ID,
		Tokens: tokens(t, cfg, "flood", buyers), Concurrency: 200, Requests: buyers})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Accepted) != 300 {
		t.Fatalf("accepted %d, want 300 (%v)", len(res.Accepted), res.ByStatus)
	}
	assertInvariants(t, drain(t, cfg, s.ID, res.Accepted))
	want := make([]string, len(res.Accepted))
	for i, id := range res.Accepted {
		want[i] = strconv.FormatUint(id, 10)
	}
	slices.Sort(want)
	same := func(format string, got []string) {
		t.Helper()
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("%s export: %d orders, want the %d accepted ones exactly once", format, len(got), len(want))
		}
	}

	out, errs, code := cli(t, cfg, be.AdminAddr(), cfg.Admin.Token, "sale", "export", s.ID, "--format", "csv")
	if code != 0 {
		t.Fatalf("export csv: exit %d: %s", code, errs)
	}
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil || len(recs) == 0 || recs[0][0] != "order_id" {
		t.Fatalf("csv: %v, header %v", err, recs[:min(1, len(recs))])
	}
	var ids []string
	for _, r := range recs[1:] {
		if r[1] != s.ID || r[5] != "confirmed" || r[3] != "1" {
			t.Errorf("csv row %v", r)
		}
		ids = append(ids, r[0])
	}
	same("csv", ids)

	out, errs, code = cli(t, cfg, be.AdminAddr(), cfg.Admin.Token, "sale", "export", s.ID, "--format", "json")
	if code != 0 {
		t.Fatalf("export json: exit %d: %s", code, errs)
	}
	var orders []struct {
		OrderID string `json:"order_id"`
		UserID  string `json:"user_id"`
	}
	if err := json.Unmarshal([]byte(out), &orders); err != nil {
		t.Fatalf("json export: %v", err)
	}
	ids, users := ids[:0], map[string]bool{}
	for _, o := range orders {
		ids, users[o.UserID] = append(ids, o.OrderID), true
	}
	same("json", ids)
	if len(users) != 300 {
		t.Fatalf("%d buyers in the export, want 300", len(users))
	}
}

// TestOrderCommands: order list (paged, by buyer), order show, and an
// operator's cancel with a reason, which is the buyer's cancel (the unit is
// back on sale and sells again) and is in the audit log with the reason; a
// viewer may list and show but not cancel; a paid order cannot be canceled.
func TestOrderCommands(t *testing.T) {
	cfg := e2eConfig(t)
	viewer := testenv.Secret("viewer-")
	cfg.Admin.Keys = []config.AdminKey{{ID: "support", Role: config.RoleViewer, Token: viewer}}
	be := startBackend(t, cfg)
	gw := startGateway(t, cfg)
	s := newSale(3, 1)
	createSale(t, cfg, be.AdminAddr(), s)
	awaitSale(t, gw, s.ID)
	orders := "http://" + gw.Addr() + "/v1/sales/" + s.ID + "/orders"
	var accepted []uint64
	ids := map[string]string{}
	for _, u := range []string{"ann", "bob", "cat"} {
		a := call(t, cfg, "POST", orders, u)
		if a.status != 202 {
			t.Fatalf("%s buys: %d %s", u, a.status, a.Code)
		}
		id, _ := strconv.ParseUint(a.Order, 10, 64)
		accepted, ids[u] = append(accepted, id), a.Order
	}
	assertInvariants(t, drain(t, cfg, s.ID, accepted))
	if a := call(t, cfg, "POST", orders, "dan"); a.status != 409 {
		t.Fatalf("dan buys the sold-out sale: %d %s", a.status, a.Code)
	}

	out, errs, code := cli(t, cfg, be.AdminAddr(), viewer, "order", "list", "--sale", s.ID, "--limit", "2", "--all")
	if code != 0 || strings.Count(out, "confirmed") != 3 || !strings.Contains(out, ids["ann"]) || !strings.Contains(out, ids["cat"]) {
		t.Fatalf("order list --all (pages of 2): exit %d\n%s%s", code, out, errs)
	}
	out, errs, code = cli(t, cfg, be.AdminAddr(), viewer, "order", "list", "--sale", s.ID, "--limit", "2")
	if code != 0 || strings.Count(out, "confirmed") != 2 || !strings.Contains(errs, "more: --after ") {
		t.Fatalf("order list, one page of 2: exit %d\n%s%s", code, out, errs)
	}
	out, errs, code = cli(t, cfg, be.AdminAddr(), viewer, "order", "list", "--sale", s.ID, "--user", "bob")
	if code != 0 || strings.Count(out, "confirmed") != 1 || !strings.Contains(out, ids["bob"]) {
		t.Fatalf("order list --user bob: exit %d\n%s%s", code, out, errs)
	}
	out, errs, code = cli(t, cfg, be.AdminAddr(), viewer, "order", "show", ids["bob"])
	if code != 0 || !strings.Contains(out, `"user_id": "bob"`) || !strings.Contains(out, `"status": "confirmed"`) {
		t.Fatalf("order show: exit %d\n%s%s", code, out, errs)
	}
	_, errs, code = cli(t, cfg, be.AdminAddr(), viewer, "order", "cancel", ids["bob"], "--reason", "fraud")
	if code == 0 || !strings.Contains(errs, "403") {
		t.Fatalf("viewer's cancel: exit %d %s", code, errs)
	}
	out, errs, code = cli(t, cfg, be.AdminAddr(), cfg.Admin.Token, "order", "cancel", ids["bob"], "--reason", "card fraud, ticket 42")
	if code != 0 || !strings.Contains(out, `"status": "canceled"`) {
		t.Fatalf("operator's cancel: exit %d\n%s%s", code, out, errs)
	}
	// The unit is back on sale: dan buys it (once the gateways' sold-out mark clears).
	var got answer
	for range 250 { // a liveness wait: the restocked event is on its way
		if got = call(t, cfg, "POST", orders, "dan"); got.status == 202 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got.status != 202 {
		t.Fatalf("dan after the cancel: %d %s", got.status, got.Code)
	}
	dan, _ := strconv.ParseUint(got.Order, 10, 64)
	rep := drain(t, cfg, s.ID, append(accepted, dan))
	assertInvariants(t, rep)
	if rep.Sold != 3 || rep.ByStatus["canceled"] != 1 {
		t.Fatalf("after cancel and resale: %+v", rep)
	}
	out, errs, code = cli(t, cfg, be.AdminAddr(), viewer, "audit-log", "--sale", s.ID, "--json")
	if code != 0 || !strings.Contains(out, `"action": "cancel"`) || !strings.Contains(out, `"cancel_reason": "card fraud, ticket 42"`) ||
		!strings.Contains(out, `"target": "`+ids["bob"]+`"`) {
		t.Fatalf("audit-log: exit %d\n%s%s", code, out, errs)
	}
	// A paid order is closed to a cancel.
	if a := pay(t, gw.Addr(), paymentBody(s.ID, ids["ann"], "pay-ann", s.PriceCents), cfg.Payments.Secret...); a.status != 200 {
		t.Fatalf("ann's payment: %d %s", a.status, a.raw)
	}
	_, errs, code = cli(t, cfg, be.AdminAddr(), cfg.Admin.Token, "order", "cancel", ids["ann"], "--reason", "too late")
	if code == 0 || !strings.Contains(errs, "409") || !strings.Contains(errs, "order_closed") {
		t.Fatalf("cancel of a paid order: exit %d %s", code, errs)
	}
}
