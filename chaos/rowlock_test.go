package chaos

import (
	"bufio"
	"context"
	"database/sql"
	"strconv"
	"strings"
	"testing"
	"time"
)

// MySQL answers but cannot write the sale: a competing transaction holds the
// sale's row for longer than all of an order's deliveries wait for the lock
// together, with innodb_lock_wait_timeout at 1 s. The backend's quick probe
// succeeds the whole time; the orders must wait the lock out, not be taken for
// poison and dead-lettered failed.
func init() {
	scenarios = append(scenarios, scenario{"mysql row locked", func(t *testing.T) {
		const (
			lockWait   = time.Second
			maxDeliver = 3
			// Every delivery waits at most the lock wait (a few times over
			// within one ack wait of 2 s): 12 s outlasts all of them together.
			hold    = 12 * time.Second
			maxHold = 60 * time.Second
		)
		st := newStack(t)
		root, err := sql.Open("mysql", st.cfg.MySQL.DSN)
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		if _, err := root.Exec(`SET GLOBAL innodb_lock_wait_timeout = ` + strconv.Itoa(int(lockWait/time.Second))); err != nil {
			t.Fatal(err)
		}
		// A backend whose connections all open under the short lock wait,
		// and whose messages run out of deliveries quickly.
		for _, b := range st.backends {
			b.kill()
			b.env = append(b.env, "FLASHGATE_BACKEND_MAX_DELIVER="+strconv.Itoa(maxDeliver))
			b.start()
		}
		st.leader()
		s := st.createSale(2000, 1)

		// The row is locked before the flood, so that every order of it meets
		// the lock (locked during the flood, a fast machine could have written
		// them all first, and the fault would not bite).
		holder, err := root.BeginTx(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		var id string
		if err := holder.QueryRow(`SELECT id FROM sales WHERE id = ? FOR UPDATE`, s.ID).Scan(&id); err != nil {
			t.Fatal(err)
		}
		locked := time.Now()
		requests, accepted := st.flood(s.ID, 3000, 3000, func() {
			st.faultEnd = locked.Add(hold) // set again once the lock goes
		})
		// The lock is held at least hold, and on until the backends put
		// orders on hold (they met the lock and wait, spending no delivery)
		// more often than one order's deliveries, so that the fault bites.
		time.Sleep(time.Until(locked.Add(hold)))
		held := backendCounter(t, st, "flashgate_backend_outage_holds_total")
		for held <= maxDeliver && time.Since(locked) < maxHold {
			time.Sleep(200 * time.Millisecond)
			held = backendCounter(t, st, "flashgate_backend_outage_holds_total")
		}
		if err := holder.Rollback(); err != nil {
			t.Fatal(err)
		}
		st.faultEnd = time.Now()
		if held <= maxDeliver {
			t.Errorf("orders were put on hold %v times under the lock: the fault did not bite", held)
		}
		rep, rec := st.settle(s.ID, accepted)
		record(t, "mysql row locked", requests, accepted, rep, rec)

		// Accepted orders that ended failed: none (a 202 is an order).
		var failed int
		if err := root.QueryRow(`SELECT COUNT(*) FROM orders WHERE sale_id = ? AND status = 'failed'`, s.ID).Scan(&failed); err != nil {
			t.Fatal(err)
		}
		dead := backendCounter(t, st, `flashgate_backend_dead_letters_total{kind="poison"}`)
		t.Logf("mysql row locked: %d accepted, %d failed, %v held, %v dead-lettered", len(accepted), failed, held, dead)
		if failed != 0 || dead != 0 {
			t.Errorf("mysql row locked: %d accepted orders failed, %v dead-lettered", failed, dead)
		}
	}})
}

// backendCounter reads one sample (name with its labels, as exposed) from the
// backends' /metrics, summed over them; 0 if absent.
func backendCounter(t *testing.T, st *stack, sample string) float64 {
	t.Helper()
	var sum float64
	for _, b := range st.backends {
		res, err := httpClient.Get("http://" + b.admin + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
			name, v, ok := strings.Cut(sc.Text(), " ")
			if ok && name == sample {
				f, _ := strconv.ParseFloat(v, 64)
				sum += f
			}
		}
		res.Body.Close()
	}
	return sum
}
