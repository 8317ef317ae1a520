package backend

import (
	"strconv"
	"testing"
	"time"

	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
)

// TestDeadLetterRedrive: an order MySQL refuses every time (a trigger stands
// for the bug) is dead-lettered: it ends failed, its unit goes back. The
// viewer lists it and may not redrive it. Once the cause is gone, the
// operator's redrive republishes it (Nats-Msg-Id: the order id) and takes it
// out of the dead-letter stream: the order is confirmed, Redis's books hold
// it, and every invariant holds. A second redrive of it finds nothing.
func TestDeadLetterRedrive(t *testing.T) {
	t.Parallel()
	viewer := testenv.Secret("viewer-")
	s := start(t, testenv.RedisAddrs(), func(c *config.Config) {
		fewDeliveries(c)
		c.NATS.DedupWindow = time.Second // the redrive waits it out
		c.Admin.Keys = []config.AdminKey{{ID: "noc", Role: config.RoleViewer, Token: viewer}}
	})
	op := s.cfg.Admin.Token
	sale := spec(5, 1, nil)
	k := s.createSale(sale)
	good := admit(t, s.rc, k, "g", 1, "")
	poison := admit(t, s.rc, k, "p", 1, "")
	trigger := "fg_poison_" + strconv.FormatUint(poison.ID, 10)
	if _, err := s.db.ExecContext(ctx(t), `CREATE TRIGGER `+trigger+` BEFORE INSERT ON orders FOR EACH ROW
		BEGIN IF NEW.id = `+strconv.FormatUint(poison.ID, 10)+` AND NEW.status = 'confirmed' THEN
		SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'the bug that makes this order poison'; END IF; END`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = s.db.Exec(`DROP TRIGGER IF EXISTS ` + trigger) })
	s.publish(poison)
	s.publish(good)
	eventually(t, 20*time.Second, "poison order dead-lettered", func() bool {
		st, why, ok := s.order(poison.ID)
		return ok && st == "failed" && why == ReasonDeadLetter
	})
	eventually(t, 10*time.Second, "good order written", func() bool { return s.rows(sale.ID, "confirmed") == 1 })
	eventually(t, 10*time.Second, "the poison's unit back", func() bool { return remaining(t, s.rc, k, "") == 4 })

	status, body := s.call("GET", "/admin/v1/dlq?sale="+sale.ID, viewer, "")
	list, _ := body["dead_letters"].([]any)
	if status != 200 || len(list) != 1 {
		t.Fatalf("dlq list: %d %v", status, body)
	}
	dl := list[0].(map[string]any)
	if dl["order_id"] != strconv.FormatUint(poison.ID, 10) || dl["kind"] != "poison" || dl["user_id"] != "p" {
		t.Fatalf("dead letter %v", dl)
	}
	seq := strconv.FormatFloat(dl["seq"].(float64), 'f', 0, 64)
	if status, body := s.call("POST", "/admin/v1/dlq/"+seq+"/redrive", viewer, ""); status != 403 {
		t.Fatalf("viewer's redrive: %d %v", status, body)
	}
	if _, err := s.db.ExecContext(ctx(t), `DROP TRIGGER `+trigger); err != nil {
		t.Fatal(err)
	}
	// The orders stream remembers the order id for its duplicate window
	// after the first publish: until then the redrive answers 409 and puts
	// everything back.
	eventually(t, 20*time.Second, "redrive", func() bool {
		status, body = s.call("POST", "/admin/v1/dlq/"+seq+"/redrive", op, "")
		if status == 409 {
			if st, why, ok := s.order(poison.ID); !ok || st != "failed" || why != ReasonDeadLetter {
				t.Fatalf("a redrive refused left the order %v %s/%s", ok, st, why)
			}
			return false
		}
		return true
	})
	if status != 200 || body["redriven"] != true {
		t.Fatalf("redrive: %d %v", status, body)
	}
	eventually(t, 20*time.Second, "redriven order confirmed", func() bool {
		st, _, ok := s.order(poison.ID)
		return ok && st == "confirmed"
	})
	if n := len(s.deadLetters()); n != 0 {
		t.Fatalf("%d dead letters after the redrive", n)
	}
	eventually(t, 10*time.Second, "consumer idle", s.consumerIdle)
	eventually(t, 10*time.Second, "reservations settled", func() bool { return reservations(t, s.rc, k) == 0 })
	if r := check(t, s.env, sale.ID, []uint64{good.ID, poison.ID}); !r.OK() || r.Sold != 2 || r.RedisRemaining != 3 {
		t.Fatalf("audit after the redrive: %v", r)
	}
	if status, _ := s.call("POST", "/admin/v1/dlq/"+seq+"/redrive", op, ""); status != 404 {
		t.Fatalf("second redrive: %d", status)
	}
	entries := auditLog(t, s, sale.ID)
	if len(entries) != 1 || entries[0].Action != "redrive" || entries[0].Target != strconv.FormatUint(poison.ID, 10) {
		t.Fatalf("audit log: %+v", entries)
	}
}
