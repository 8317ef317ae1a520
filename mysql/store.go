// Package mysql is flashgate's room for MySQL, the source of truth: it opens
// the database, versions its schema (migrations/, applied with goose) and
// holds every SQL statement the product runs, behind functions named for what
// they decide (GuardSold, ChargeBatch, ReturnUnits, InsertOrders, …). Callers
// never write SQL; they choose the transaction boundaries (Begin, then pass
// the *sql.Tx as the Querier) and the store runs the statements inside them.
// See docs/storage.md.
package mysql

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
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

// Querier runs statements: a *sql.DB, a *sql.Tx or a *sql.Conn. The store's
// functions take one, so the caller decides what runs in which transaction
// (one batch = one transaction) and in which order rows are locked.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Begin starts a read-committed transaction: the writer's and the order life
// cycle's isolation (their guards re-read rows under lock anyway).
func Begin(ctx context.Context, db *sql.DB) (*sql.Tx, error) {
	return db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
}

// BeginSnapshot starts a read-only repeatable-read transaction: one
// consistent view of several tables.
func BeginSnapshot(ctx context.Context, db *sql.DB) (*sql.Tx, error) {
	return db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
}

// MySQL error numbers callers tell apart.
const (
	ErDupEntry        = 1062
	ErLockWaitTimeout = 1205
	ErLockDeadlock    = 1213
)

// Errno is the server's error number in err (0: not a server error).
func Errno(err error) uint16 {
	var me *driver.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// changed turns a guard UPDATE's result into "did it pass". Every guard adds
// (or takes) at least one unit, so a matched row is always a changed row.
func changed(r sql.Result, err error) (bool, error) {
	if err != nil {
		return false, err
	}
	n, err := r.RowsAffected()
	return n > 0, err
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?,", n), ",")
}

// rowsOf is "(?,?),(?,?)" for n rows of cols columns.
func rowsOf(n, cols int) string {
	row := "(" + placeholders(cols) + "),"
	return strings.TrimSuffix(strings.Repeat(row, n), ",")
}

// sqlChunk bounds one statement's lists.
const sqlChunk = 1000

// MySQL errors that say the server cannot make this write for now, not that
// the write is wrong: it must wait for the server, whatever it carries.
var stalledErrnos = map[uint16]bool{
	1021: true, // ER_DISK_FULL
	1040: true, // ER_CON_COUNT_ERROR: too many connections
	1053: true, // ER_SERVER_SHUTDOWN
	1114: true, // ER_RECORD_FILE_FULL: the table is full
	1203: true, // ER_TOO_MANY_USER_CONNECTIONS
	1205: true, // ER_LOCK_WAIT_TIMEOUT: a row is locked elsewhere
	1213: true, // ER_LOCK_DEADLOCK
	1226: true, // ER_USER_LIMIT_REACHED
	1290: true, // ER_OPTION_PREVENTS_STATEMENT: --read-only
	1317: true, // ER_QUERY_INTERRUPTED: KILL QUERY
	1637: true, // ER_TOO_MANY_CONCURRENT_TRXS
	1792: true, // ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION
	1836: true, // ER_READ_ONLY_MODE
	1927: true, // ER_CONNECTION_KILLED (MariaDB)
	1969: true, // ER_STATEMENT_TIMEOUT: MariaDB max_statement_time
	3024: true, // ER_QUERY_TIMEOUT: MySQL max_execution_time
	4031: true, // ER_CLIENT_INTERACTION_TIMEOUT: the server dropped the connection
}

// Stalled reports whether err says MySQL (or the way to it) cannot write now
// rather than that the write is wrong: a server error of stalledErrnos, a
// deadline or cancellation, a broken connection.
func Stalled(err error) bool {
	if err == nil {
		return false
	}
	if stalledErrnos[Errno(err)] {
		return true
	}
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.Is(err, sqldriver.ErrBadConn) || errors.Is(err, driver.ErrInvalidConn) || errors.Is(err, sql.ErrConnDone) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne)
}
