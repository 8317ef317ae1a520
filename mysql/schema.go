package mysql

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
)

// The schema is versioned by goose: migrations/NNNN_what.sql, each with its
// "-- +goose Up" and "-- +goose Down" halves, embedded in the binary. goose
// records applied versions in its own table (versionTable).

//go:embed migrations/*.sql
var migrationFS embed.FS

const (
	versionTable = "goose_db_version"
	// legacyTable is the version table of the hand-written runner that came
	// before goose: a database it built is adopted (see adopt).
	legacyTable = "schema_migrations"
	// dirtyTable holds one row per migration begun and not finished. MySQL
	// commits DDL implicitly, so a migration that fails (or whose process
	// dies) halfway leaves part of its changes behind and goose's table none of
	// them: without this mark the next run would re-run it over the half.
	dirtyTable = "schema_dirty"
	// migrateLock serialises migrations across processes: two backends
	// starting together would otherwise both see version N missing and both
	// apply it.
	migrateLock = "flashgate_migrate"
)

// Migration is one schema version as `flashgate migrate status` shows it.
type Migration struct {
	Version   int64
	Name      string
	Applied   bool
	AppliedAt time.Time // zero when pending
}

// SchemaError is a schema the binary must not run on: older than it needs,
// newer than it knows, or half-applied. Its message says what to do.
type SchemaError struct {
	// Version is the highest applied version, Want the binary's latest.
	Version, Want int64
	// Pending lists known versions not applied; Unknown applied versions the
	// binary does not know; Dirty versions begun and never finished.
	Pending, Unknown, Dirty []int64
}

func (e *SchemaError) Error() string {
	switch {
	case len(e.Dirty) > 0:
		return fmt.Sprintf("schema: migration %s was begun and did not finish (MySQL cannot roll DDL back): "+
			"finish or undo it by hand, then delete its row from %s and run `flashgate migrate up`", versionList(e.Dirty), dirtyTable)
	case len(e.Unknown) > 0:
		return fmt.Sprintf("schema: version %s is newer than this binary knows (it knows up to %d): run a newer flashgate", versionList(e.Unknown), e.Want)
	default:
		return fmt.Sprintf("schema at version %d, this binary needs %d: run `flashgate migrate up`", e.Version, e.Want)
	}
}

func versionList(vs []int64) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = fmt.Sprint(v)
	}
	return strings.Join(s, ", ")
}

func provider(db *sql.DB) (*goose.Provider, error) {
	sub, err := fs.Sub(migrationFS, "migrations")
	if err != nil {
		return nil, err
	}
	return goose.NewProvider(goose.DialectMySQL, db, sub,
		goose.WithTableName(versionTable), goose.WithDisableGlobalRegistry(true))
}

// Migrate applies the pending migrations in version order, under a MySQL
// named lock, one at a time with a dirty mark around each. It refuses a
// half-applied or newer-than-known schema (*SchemaError) without touching it.
func Migrate(ctx context.Context, db *sql.DB) error {
	return withLock(ctx, db, func(conn *sql.Conn) error {
		p, st, err := inspect(ctx, db, conn)
		if err != nil {
			return err
		}
		if len(st.Dirty) > 0 || len(st.Unknown) > 0 {
			return st
		}
		for _, v := range st.Pending {
			if err := applyOne(ctx, p, conn, v); err != nil {
				return err
			}
		}
		return nil
	})
}

func applyOne(ctx context.Context, p *goose.Provider, conn *sql.Conn, v int64) error {
	if _, err := conn.ExecContext(ctx, `INSERT INTO `+dirtyTable+` (version, started_at) VALUES (?, ?)`, v, time.Now().UTC()); err != nil {
		return fmt.Errorf("migration %d: mark: %w", v, err)
	}
	if _, err := p.ApplyVersion(ctx, v, true); err != nil {
		return fmt.Errorf("migration %d: %w", v, err)
	}
	if _, err := conn.ExecContext(ctx, `DELETE FROM `+dirtyTable+` WHERE version = ?`, v); err != nil {
		return fmt.Errorf("migration %d: unmark: %w", v, err)
	}
	return nil
}

// CheckSchema returns nil when the database holds exactly the schema this
// binary knows, and a *SchemaError otherwise. It changes nothing but goose's
// bookkeeping (it creates the version table, adopting an older runner's).
func CheckSchema(ctx context.Context, db *sql.DB) error {
	return withLock(ctx, db, func(conn *sql.Conn) error {
		_, st, err := inspect(ctx, db, conn)
		if err != nil {
			return err
		}
		if len(st.Dirty) > 0 || len(st.Unknown) > 0 || len(st.Pending) > 0 {
			return st
		}
		return nil
	})
}

// MigrationStatus lists every migration the binary knows, applied or
// pending, in version order.
func MigrationStatus(ctx context.Context, db *sql.DB) ([]Migration, error) {
	var out []Migration
	err := withLock(ctx, db, func(conn *sql.Conn) error {
		p, _, err := inspect(ctx, db, conn)
		if err != nil {
			return err
		}
		ss, err := p.Status(ctx)
		if err != nil {
			return fmt.Errorf("migrate status: %w", err)
		}
		for _, s := range ss {
			out = append(out, Migration{Version: s.Source.Version, Name: pathBase(s.Source.Path),
				Applied: s.State == goose.StateApplied, AppliedAt: s.AppliedAt})
		}
		return nil
	})
	return out, err
}

func pathBase(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[i+1:]
	}
	return p
}

// LatestVersion is the highest migration the binary knows.
func LatestVersion() (int64, error) {
	ents, err := fs.ReadDir(migrationFS, "migrations")
	if err != nil {
		return 0, err
	}
	var v int64
	for _, e := range ents {
		n, err := goose.NumericComponent(e.Name())
		if err != nil {
			return 0, fmt.Errorf("migration %s: %w", e.Name(), err)
		}
		v = max(v, n)
	}
	return v, nil
}

// inspect prepares the bookkeeping tables (adopting a legacy runner's
// versions) and compares what is applied with what the binary knows.
func inspect(ctx context.Context, db *sql.DB, conn *sql.Conn) (*goose.Provider, *SchemaError, error) {
	p, err := provider(db)
	if err != nil {
		return nil, nil, err
	}
	if err := prepare(ctx, conn); err != nil {
		return nil, nil, err
	}
	applied, err := database.NewStore(goose.DialectMySQL, versionTable)
	if err != nil {
		return nil, nil, err
	}
	list, err := applied.ListMigrations(ctx, conn)
	if err != nil {
		return nil, nil, fmt.Errorf("schema: %w", err)
	}
	st := &SchemaError{}
	known := map[int64]bool{}
	for _, s := range p.ListSources() {
		known[s.Version] = true
		st.Want = max(st.Want, s.Version)
	}
	done := map[int64]bool{}
	for _, m := range list {
		if !m.IsApplied || m.Version == 0 {
			continue
		}
		done[m.Version] = true
		st.Version = max(st.Version, m.Version)
		if !known[m.Version] {
			st.Unknown = append(st.Unknown, m.Version)
		}
	}
	for _, s := range p.ListSources() {
		if !done[s.Version] {
			st.Pending = append(st.Pending, s.Version)
		}
	}
	if st.Dirty, err = dirtyVersions(ctx, conn, done); err != nil {
		return nil, nil, err
	}
	return p, st, nil
}

// dirtyVersions lists the dirty marks of versions not applied; a mark left
// by a process that died between goose's record and the unmark is cleared.
func dirtyVersions(ctx context.Context, conn *sql.Conn, done map[int64]bool) ([]int64, error) {
	rows, err := conn.QueryContext(ctx, `SELECT version FROM `+dirtyTable+` ORDER BY version`)
	if err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	var marks []int64
	err = scanRows(rows, func() error {
		var v int64
		err := rows.Scan(&v)
		marks = append(marks, v)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	var dirty []int64
	for _, v := range marks {
		if !done[v] {
			dirty = append(dirty, v)
			continue
		}
		if _, err := conn.ExecContext(ctx, `DELETE FROM `+dirtyTable+` WHERE version = ?`, v); err != nil {
			return nil, fmt.Errorf("schema: %w", err)
		}
	}
	return dirty, nil
}

// prepare creates goose's version table and the dirty marks' table when
// missing. A database built by the runner before goose (its versions in
// schema_migrations) is adopted: goose's table starts with those versions,
// so its schema is neither re-applied nor refused.
func prepare(ctx context.Context, conn *sql.Conn) error {
	// Looked up first: a CREATE, even IF NOT EXISTS, needs the right to create,
	// which the backend's login does not have (docs/credentials.md); it only
	// checks a schema the migrator made.
	has, err := tableExists(ctx, conn, dirtyTable)
	if err != nil {
		return err
	}
	if !has {
		if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+dirtyTable+` (
		version    BIGINT      NOT NULL PRIMARY KEY,
		started_at DATETIME(3) NOT NULL
	) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`); err != nil {
			return fmt.Errorf("schema: %w", err)
		}
	}
	has, err = tableExists(ctx, conn, versionTable)
	if err != nil || has {
		return err
	}
	store, err := database.NewStore(goose.DialectMySQL, versionTable)
	if err != nil {
		return err
	}
	legacy, err := legacyVersions(ctx, conn)
	if err != nil {
		return err
	}
	if err := store.CreateVersionTable(ctx, conn); err != nil {
		return fmt.Errorf("schema: create %s: %w", versionTable, err)
	}
	// goose expects its table to begin with version 0.
	for _, v := range append([]int64{0}, legacy...) {
		if err := store.Insert(ctx, conn, database.InsertRequest{Version: v}); err != nil {
			return fmt.Errorf("schema: record version %d: %w", v, err)
		}
	}
	return nil
}

func tableExists(ctx context.Context, conn *sql.Conn, name string) (bool, error) {
	var n int
	err := conn.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.tables
		WHERE table_schema = DATABASE() AND table_name = ?`, name).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("schema: %w", err)
	}
	return n > 0, nil
}

// legacyVersions reads the old runner's applied versions (none when its
// table does not exist).
func legacyVersions(ctx context.Context, conn *sql.Conn) ([]int64, error) {
	has, err := tableExists(ctx, conn, legacyTable)
	if err != nil || !has {
		return nil, err
	}
	rows, err := conn.QueryContext(ctx, `SELECT version FROM `+legacyTable+` ORDER BY version`)
	if err != nil {
		return nil, fmt.Errorf("schema: adopt %s: %w", legacyTable, err)
	}
	var vs []int64
	err = scanRows(rows, func() error {
		var v int64
		err := rows.Scan(&v)
		vs = append(vs, v)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("schema: adopt %s: %w", legacyTable, err)
	}
	return vs, nil
}

// withLock runs fn on one connection holding the migration lock. GET_LOCK
// belongs to a session, hence the dedicated connection; goose's own work runs
// on the pool, which the lock still serialises because every migrator takes it.
func withLock(ctx context.Context, db *sql.DB, fn func(*sql.Conn) error) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer conn.Close()
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, 30)`, migrateLock).Scan(&got); err != nil {
		return fmt.Errorf("migrate: lock: %w", err)
	}
	if got.Int64 != 1 {
		return fmt.Errorf("migrate: lock %s not granted within 30s", migrateLock)
	}
	defer func() {
		// Release even when ctx is done; the lock would otherwise live as long as the pooled connection.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = conn.ExecContext(rctx, `SELECT RELEASE_LOCK(?)`, migrateLock)
	}()
	return fn(conn)
}

// scanRows calls scan for each row and closes rows.
func scanRows(rows *sql.Rows, scan func() error) error {
	defer rows.Close()
	for rows.Next() {
		if err := scan(); err != nil {
			return err
		}
	}
	return rows.Err()
}
