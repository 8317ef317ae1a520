// Package mysql is flashgate's room for MySQL, the source of truth: it opens
// the database, versions its schema (migrations/, applied with goose) and
// holds every SQL statement the product runs, behind methods named for what
// they decide (ConfirmBatch, GuardSold, ReturnUnits, SaleLedger, …). Callers
// never write SQL; they choose the transaction boundaries (Begin, Tx) and the
// store runs the statements inside them. See docs/storage.md.
package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	driver "github.com/go-sql-driver/mysql"
)

// OpenDB opens MySQL the way every flashgate process does: times are parsed into
// time.Time in UTC, and parameters are interpolated client-side (one round trip
// per statement instead of prepare + execute + close).
func OpenDB(dsn string) (*sql.DB, error) {
	cfg, err := driver.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("mysql dsn: %w", err)
	}
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	cfg.InterpolateParams = true
	conn, err := driver.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("mysql %s: %w", cfg.Addr, err)
	}
	return sql.OpenDB(conn), nil
}

// Store runs the product's statements on a pool.
type Store struct {
	db *sql.DB
}

// New wraps an open pool (OpenDB).
func New(db *sql.DB) *Store { return &Store{db: db} }

// DB is the pool, for what is not a statement: pool settings, Ping, Close.
func (s *Store) DB() *sql.DB { return s.db }

// Tx is one transaction the caller decided on; the store's methods on it run
// inside it, in the order the caller calls them (so the caller keeps the row
// lock order).
type Tx struct {
	tx *sql.Tx
}

// Begin starts a read-committed transaction: the writer's and the order life
// cycle's isolation (their guards re-read rows under lock anyway).
func (s *Store) Begin(ctx context.Context) (*Tx, error) {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, err
	}
	return &Tx{tx: tx}, nil
}

// BeginDefault starts a transaction at the server's default isolation.
func (s *Store) BeginDefault(ctx context.Context) (*Tx, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return &Tx{tx: tx}, nil
}

// BeginSnapshot starts a read-only repeatable-read transaction: one consistent
// view of several tables.
func (s *Store) BeginSnapshot(ctx context.Context) (*Tx, error) {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return nil, err
	}
	return &Tx{tx: tx}, nil
}

// Commit commits the transaction.
func (t *Tx) Commit() error { return t.tx.Commit() }

// Rollback abandons the transaction (harmless after Commit).
func (t *Tx) Rollback() error { return t.tx.Rollback() }

// queryer is what the reads that run either on the pool or in a transaction
// need.
type queryer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}
