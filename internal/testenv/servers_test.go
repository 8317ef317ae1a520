package testenv_test

import (
	"database/sql"
	"testing"

	"github.com/flashgate/flashgate/internal/testenv"
)

func TestStartMariaDB(t *testing.T) {
	m := testenv.StartMariaDB(t)
	db, _ := sql.Open("mysql", m.DSN())
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE x (a INT PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	m.Kill()
	m.Start()
	if _, err := db.Exec("INSERT INTO x VALUES (1)"); err != nil {
		t.Fatal(err)
	}
}
