package backend

import (
	"context"
	"database/sql"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/mysql"
)

var (
	errSaleNotFound = mysql.ErrSaleNotFound
	errSaleExists   = mysql.ErrSaleExists
)

// MySQL error numbers the backend tells apart.
const (
	erDupEntry        = mysql.ErDupEntry
	erLockWaitTimeout = mysql.ErLockWaitTimeout
	erLockDeadlock    = mysql.ErLockDeadlock
)

func mysqlErrno(err error) uint16 { return mysql.Errno(err) }

// saleRow is a sale as MySQL holds it: the spec and its counters.
type saleRow = mysql.SaleRow

// queryer is a *sql.DB or a *sql.Tx: what the store's reads run on.
type queryer = mysql.Querier

// insertSale writes a new sale and its regions in one transaction.
func insertSale(ctx context.Context, db *sql.DB, s *flashgate.Sale, now time.Time) error {
	return mysql.InsertSale(ctx, db, s, now)
}

// loadSale reads a sale, its regions and its counters (no locks).
func loadSale(ctx context.Context, q queryer, id string) (*saleRow, error) {
	return mysql.LoadSale(ctx, q, id)
}

// closeSaleRow marks a sale closed: from now on the guard refuses its orders.
func closeSaleRow(ctx context.Context, db *sql.DB, id string, now time.Time) error {
	return mysql.CloseSale(ctx, db, id, now)
}

// statusCount is the orders and units of one status.
type statusCount = mysql.StatusCount
