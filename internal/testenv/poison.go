package testenv

import (
	"context"
	"database/sql"
	"strconv"
	"testing"
	"time"
)

// PoisonOrders makes MySQL refuse, every time, the orders row of any user
// whose id starts with prefix, but a dead-lettered one (reason dead_letter):
// a BEFORE INSERT trigger in db's database, dropped when the test ends. It
// makes a poison order for the dead-letter path, which a message can no
// longer be by its own content: the backend checks every field it would
// store (docs/ingest.md, "The backend trusts no message").
func PoisonOrders(t testing.TB, db *sql.DB, prefix string) {
	t.Helper()
	for _, r := range prefix {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			t.Fatalf("poison prefix %q: letters and digits only", prefix)
		}
	}
	name := "poison_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	// A trigger is not a prepared statement: the prefix is checked above.
	q := `CREATE TRIGGER ` + name + ` BEFORE INSERT ON orders FOR EACH ROW
		IF NEW.user_id LIKE '` + prefix + `%' AND NEW.reason <> 'dead_letter' THEN
			SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'poison order (test trigger)';
		END IF`
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := db.ExecContext(c, q); err != nil {
		t.Fatalf("poison trigger: %v", err)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = db.ExecContext(c, `DROP TRIGGER IF EXISTS `+name)
	})
}
