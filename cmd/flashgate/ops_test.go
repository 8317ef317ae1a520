package main

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/internal/wire"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/mysql"
)

// TestSaleDayCommands runs sale pause, resume and audit and audit-log
// against a real backend: a viewer's key is refused the pause (403, nothing
// changes) and may audit; the operator's pause and resume are in the audit
// log with before and after; sale audit exits 0 on a sound sale and 3 once
// its Redis stock is off by one unit.
func TestSaleDayCommands(t *testing.T) {
	cfg := testenv.Config(t)
	viewer := testenv.Secret("viewer-")
	cfg.Admin.Keys = []config.AdminKey{{ID: "noc", Role: config.RoleViewer, Token: viewer}}
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
	as := func(tok string, args ...string) (string, error) {
		t.Setenv("FLASHGATE_ADMIN_TOKEN", tok)
		var out, errOut bytes.Buffer
		err := run(append(args, "--config", ""), &out, &errOut)
		return out.String() + errOut.String(), err
	}
	op := cfg.Admin.Token
	id := testenv.ID("day")
	if out, err := as(op, "sale", "create", "--id", id, "--total", "10", "--starts-at", "-1m", "--duration", "1h"); err != nil {
		t.Fatalf("create: %v %s", err, out)
	}
	if out, err := as(viewer, "sale", "pause", id); err == nil || !strings.Contains(err.Error(), "403") || !strings.Contains(err.Error(), "forbidden") {
		t.Fatalf("viewer's pause: %v %s", err, out)
	}
	if out, err := as(viewer, "sale", "show", id); err != nil || strings.Contains(out, `"paused": true`) {
		t.Fatalf("show after the viewer's pause: %v %s", err, out)
	}
	if out, err := as(op, "sale", "pause", id); err != nil || !strings.Contains(out, `"paused": true`) {
		t.Fatalf("pause: %v %s", err, out)
	}
	if out, err := as(viewer, "sale", "list"); err != nil || !strings.Contains(out, id+"  paused") {
		t.Fatalf("list: %v %s", err, out)
	}
	if out, err := as(op, "sale", "resume", id); err != nil || strings.Contains(out, `"paused": true`) {
		t.Fatalf("resume: %v %s", err, out)
	}
	out, err := as(viewer, "audit-log", "--sale", id)
	if err != nil {
		t.Fatalf("audit-log: %v %s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.Contains(lines[1], "resume") || !strings.Contains(lines[2], "pause") || !strings.Contains(lines[3], "create") {
		t.Fatalf("audit-log, want resume, pause, create:\n%s", out)
	}
	if !strings.Contains(lines[2], "default(operator)") || !strings.Contains(lines[2], "127.0.0.1") ||
		!strings.Contains(lines[2], `{"paused":false,"closed":false}  {"paused":true,"closed":false}`) {
		t.Errorf("pause entry: %s", lines[2])
	}
	if out, err := as(viewer, "sale", "audit", id); err != nil || !strings.Contains(out, `"holds": true`) {
		t.Fatalf("audit of a sound sale: %v %s", err, out)
	}
	// One unit appears in Redis from nowhere: invariant 3 is broken.
	rc := testenv.Redis(t, cfg.Redis.Addrs)
	_, stock := lua.KeysFor(id, nil).StockKeys()
	if err := rc.Do(ctx, rc.B().Incrby().Key(stock[0]).Increment(1).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	out, err = as(viewer, "sale", "audit", id)
	var code exitCode
	if !errors.As(err, &code) || code != exitBroken || !strings.Contains(out, `"ledger_diff": 1`) || !strings.Contains(out, "invariant is broken") {
		t.Fatalf("audit of a broken ledger: %v %s", err, out)
	}
	if out, err := as(viewer, "sale", "audit", "nosuch"); err == nil || errors.As(err, &code) {
		t.Fatalf("audit of no sale: %v %s", err, out)
	}
}

// TestDLQCommands: dlq list shows a dead-lettered poison order and an
// unparseable message; dlq redrive of the message is refused (exit 1, 409),
// of the order republishes it (after the stream forgot its id) and takes it
// out of the list; a viewer may list but not redrive.
func TestDLQCommands(t *testing.T) {
	cfg := testenv.Config(t)
	cfg.Backend.MaxDeliver, cfg.Backend.AckWait, cfg.NATS.DedupWindow = 2, time.Second, time.Second
	viewer := testenv.Secret("viewer-")
	cfg.Admin.Keys = []config.AdminKey{{ID: "noc", Role: config.RoleViewer, Token: viewer}}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
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
	as := func(tok string, args ...string) (string, error) {
		t.Setenv("FLASHGATE_ADMIN_TOKEN", tok)
		var out, errOut bytes.Buffer
		err := run(append(args, "--config", ""), &out, &errOut)
		return out.String() + errOut.String(), err
	}
	id := testenv.ID("dlq")
	if out, err := as(cfg.Admin.Token, "sale", "create", "--id", id, "--total", "10", "--starts-at", "-1m", "--duration", "1h"); err != nil {
		t.Fatalf("create: %v %s", err, out)
	}
	js, err := jetstream.New(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	subj := bus.OrderSubject(cfg.NATS, id)
	if _, err := js.Publish(ctx, subj, []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	// MySQL refuses mallory's rows (a test trigger): her order is poison.
	db, err := mysql.OpenDB(cfg.MySQL.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	testenv.PoisonOrders(t, db, "mallory")
	now := time.Now().UTC().Truncate(time.Millisecond)
	p := flashgate.Order{ID: uint64(now.UnixNano()), SaleID: id, UserID: "mallory", Quantity: 1, Status: flashgate.OrderPending,
		CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	pid := strconv.FormatUint(p.ID, 10)
	if _, err := js.Publish(ctx, subj, bus.AppendOrder(nil, &p), jetstream.WithMsgID(pid)); err != nil {
		t.Fatal(err)
	}
	var out string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if out, err = as(viewer, "dlq", "list", "--sale", id); err == nil && strings.Contains(out, "unparseable") && strings.Contains(out, pid) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dlq list: %v\n%s", err, out)
		}
	}
	seqOf := func(what string) string {
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, what) {
				return strings.Fields(l)[0]
			}
		}
		t.Fatalf("no %s in\n%s", what, out)
		return ""
	}
	garbage, poison := seqOf("unparseable"), seqOf(pid)
	if got, err := as(cfg.Admin.Token, "dlq", "redrive", garbage); err == nil || !strings.Contains(err.Error(), "409") {
		t.Fatalf("redrive of an unparseable message: %v %s", err, got)
	}
	if got, err := as(viewer, "dlq", "redrive", poison); err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("viewer's redrive: %v %s", err, got)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		got, err := as(cfg.Admin.Token, "dlq", "redrive", poison)
		if err == nil && strings.Contains(got, `"redriven": true`) {
			break
		}
		if err == nil || !strings.Contains(err.Error(), "409") || time.Now().After(deadline) {
			t.Fatalf("redrive: %v %s", err, got)
		}
	}
	// Its dead letter is gone (the order, poison still, may come back as a new one).
	got, err := as(viewer, "dlq", "list", "--sale", id)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(got, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == poison {
			t.Fatalf("dead letter %s still listed after its redrive:\n%s", poison, got)
		}
	}
	if got, err := as(viewer, "audit-log", "--sale", id); err != nil || !strings.Contains(got, "redrive") || !strings.Contains(got, pid) {
		t.Fatalf("audit-log: %v %s", err, got)
	}
}
