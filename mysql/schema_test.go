package mysql

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate/internal/testenv"
)

func ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func openTest(t *testing.T) *sql.DB {
	t.Helper()
	db, err := OpenDB(testenv.MySQL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// upTo applies the migrations up to v with goose alone: a database some
// older binary left behind.
func upTo(t *testing.T, db *sql.DB, v int64) {
	t.Helper()
	err := withLock(ctx(t), db, func(conn *sql.Conn) error {
		p, err := provider(db)
		if err == nil {
			err = prepare(ctx(t), conn)
		}
		if err == nil {
			_, err = p.UpTo(ctx(t), v)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func schemaError(t *testing.T, err error) *SchemaError {
	t.Helper()
	var se *SchemaError
	if !errors.As(err, &se) {
		t.Fatalf("err = %v, want a *SchemaError", err)
	}
	return se
}

func TestMigrationsParse(t *testing.T) {
	p, err := provider(openTest(t))
	if err != nil {
		t.Fatal(err)
	}
	var vs []int64
	for _, s := range p.ListSources() {
		vs = append(vs, s.Version)
	}
	if len(vs) != 12 || vs[0] != 1 || vs[11] != 13 {
		t.Fatalf("versions %v, want 1…13 (no 5)", vs)
	}
	if v, err := LatestVersion(); err != nil || v != 13 {
		t.Fatalf("LatestVersion = %d, %v", v, err)
	}
}

// migrate up on an empty database, then status: every version applied, and
// the check passes.
func TestMigrateUpThenStatus(t *testing.T) {
	t.Parallel()
	db := openTest(t)
	if err := CheckSchema(ctx(t), db); schemaError(t, err).Version != 0 {
		t.Errorf("empty database: %v", err)
	}
	if err := Migrate(ctx(t), db); err != nil {
		t.Fatal(err)
	}
	ms, err := MigrationStatus(ctx(t), db)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 12 {
		t.Fatalf("status lists %d migrations, want 12", len(ms))
	}
	for _, m := range ms {
		if !m.Applied || m.AppliedAt.IsZero() || !strings.HasSuffix(m.Name, ".sql") {
			t.Errorf("after up: %+v", m)
		}
	}
	if err := CheckSchema(ctx(t), db); err != nil {
		t.Errorf("check after up: %v", err)
	}
	if err := Migrate(ctx(t), db); err != nil {
		t.Errorf("a second up: %v", err)
	}
}

// Two backends starting together both migrate one database: the named lock
// makes one wait, and every version is applied once.
func TestMigrateConcurrent(t *testing.T) {
	t.Parallel()
	dsn := testenv.MySQL(t)
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			db, err := OpenDB(dsn)
			if err != nil {
				errs <- err
				return
			}
			defer db.Close()
			errs <- Migrate(context.Background(), db)
		}()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	db, err := OpenDB(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM goose_db_version WHERE version_id > 0`).Scan(&n); err != nil || n != 12 {
		t.Errorf("goose_db_version has %d versions (%v), want 12", n, err)
	}
	// The CHECK constraint is there: sold can never pass total.
	now := time.Now().UTC()
	if _, err := db.Exec(`INSERT INTO sales (id, title, price_cents, total, sold, starts_at, ends_at, per_user_limit, per_order_max, created_at, updated_at)
		VALUES ('x', 't', 1, 5, 6, ?, ?, 1, 1, ?, ?)`, now, now, now, now); err == nil {
		t.Error("a sale with sold > total was accepted")
	}
}

// An old schema is refused with the command that fixes it; up brings it to date.
func TestOldSchemaRefused(t *testing.T) {
	t.Parallel()
	db := openTest(t)
	upTo(t, db, 2)
	err := CheckSchema(ctx(t), db)
	se := schemaError(t, err)
	if se.Version != 2 || se.Want != 13 || len(se.Pending) != 10 {
		t.Errorf("%+v", se)
	}
	if want := "schema at version 2, this binary needs 13: run `flashgate migrate up`"; err.Error() != want {
		t.Errorf("message %q, want %q", err, want)
	}
	if err := Migrate(ctx(t), db); err != nil {
		t.Fatal(err)
	}
	if err := CheckSchema(ctx(t), db); err != nil {
		t.Error(err)
	}
}

// A schema with a version this binary does not know is refused by the check
// and by up, which changes nothing.
func TestNewerSchemaRefused(t *testing.T) {
	t.Parallel()
	db := openTest(t)
	if err := Migrate(ctx(t), db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO goose_db_version (version_id, is_applied) VALUES (9999, 1)`); err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]func(context.Context, *sql.DB) error{"check": CheckSchema, "up": Migrate} {
		err := f(ctx(t), db)
		se := schemaError(t, err)
		if len(se.Unknown) != 1 || se.Unknown[0] != 9999 || !strings.Contains(err.Error(), "newer than this binary knows") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// A migration that failed halfway (MySQL committed part of its DDL) is
// recorded as dirty: the next up refuses it instead of re-running it over
// the half, and so does the check.
func TestHalfAppliedRefused(t *testing.T) {
	t.Parallel()
	db := openTest(t)
	upTo(t, db, 2)
	// Migration 3 alters sales and orders, then creates limit_usage: a table
	// already there makes it fail after its first statements committed.
	if _, err := db.Exec(`CREATE TABLE limit_usage (x INT)`); err != nil {
		t.Fatal(err)
	}
	if err := Migrate(ctx(t), db); err == nil {
		t.Fatal("migration 3 over an existing limit_usage succeeded")
	}
	for name, f := range map[string]func(context.Context, *sql.DB) error{"check": CheckSchema, "up": Migrate} {
		err := f(ctx(t), db)
		se := schemaError(t, err)
		if len(se.Dirty) != 1 || se.Dirty[0] != 3 || !strings.Contains(err.Error(), "did not finish") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// A database the hand-written runner built (versions in schema_migrations)
// is adopted: goose records those versions, applies only what is missing,
// and re-runs nothing (a re-run of 0001 would fail on the existing tables).
func TestAdoptLegacyRunner(t *testing.T) {
	t.Parallel()
	db := openTest(t)
	upTo(t, db, 4)
	for _, q := range []string{
		`DROP TABLE goose_db_version`,
		`CREATE TABLE schema_migrations (version INT NOT NULL PRIMARY KEY, applied_at DATETIME(3) NOT NULL)`,
		`INSERT INTO schema_migrations VALUES (1, NOW(3)), (2, NOW(3)), (3, NOW(3)), (4, NOW(3))`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	if err := CheckSchema(ctx(t), db); schemaError(t, err).Version != 4 {
		t.Errorf("adopted check: %v", err)
	}
	if err := Migrate(ctx(t), db); err != nil {
		t.Fatal(err)
	}
	ms, err := MigrationStatus(ctx(t), db)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if !m.Applied {
			t.Errorf("after adoption and up: %+v", m)
		}
	}
	var retired int
	if err := db.QueryRow(`SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = DATABASE()
		AND table_name = 'sales' AND column_name = 'retired_at'`).Scan(&retired); err != nil || retired != 1 {
		t.Errorf("migration 6 not applied: %d %v", retired, err)
	}
}
