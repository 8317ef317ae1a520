// Command seedsync is the seeds' synchronous design, kept as a yardstick for
// `make bench` (flashgate issue 6) and never part of the product: nothing
// outside bench/ imports it.
//
// It serves only POST /v1/sales/{sale}/orders, and serves it the way the seed
// articles' first solution does (the flash-sale write-ups flashgate started from): per request,
// in one MySQL transaction,
//
//	SELECT stock FROM seckill_stock WHERE id = ?                  -- sold out? 409
//	SELECT COUNT(*) FROM seckill_orders WHERE sale_id = ? AND user_id = ?  -- one per user: 403
//	UPDATE seckill_stock SET stock = stock - 1 WHERE id = ? AND stock > 0  -- 0 rows: 409
//	INSERT INTO seckill_orders (sale_id, user_id, quantity, created_at) …  -- duplicate: 403
//	COMMIT                                                        -- 202 with the new row's id
//
// so every purchase waits on MySQL, and all purchases of one sale queue on its
// stock row's lock. Around the database it does what the gateway does per
// request (fasthttp, the same bearer JWT check with the product's auth package,
// a strict body parse) and answers with the product's codes and bodies
// (docs/design.md §3), so that `flashgate bench --no-check --target …` drives it
// unchanged. A 202 here means the order row is committed ("confirmed").
//
// Its tables live in their own database (flashgate_seedsync by default), which
// it creates at start; --sale/--stock reset one sale; --report prints a sale's
// stock and orders as JSON and exits; --delete removes a sale and exits.
package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	driver "github.com/go-sql-driver/mysql"
	"github.com/valyala/fasthttp"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/mysql"
)

// DefaultDB is the database the seeds' tables live in.
const DefaultDB = "flashgate_seedsync"

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(os.Stderr, "seedsync: %v\n", err)
		}
		os.Exit(1)
	}
}

// defaultDSN is FLASHGATE_MYSQL_DSN's server (the local stack's MariaDB if
// unset) with the database DefaultDB.
func defaultDSN() string {
	dsn := os.Getenv("FLASHGATE_MYSQL_DSN")
	if dsn == "" {
		dsn = config.Default().MySQL.DSN
	}
	cfg, err := driver.ParseDSN(dsn)
	if err != nil {
		return "root@tcp(127.0.0.1:13306)/" + DefaultDB
	}
	cfg.DBName = DefaultDB
	return cfg.FormatDSN()
}

func run(args []string, stdout, stderr io.Writer) error {
	def := config.Default()
	fs := flag.NewFlagSet("seedsync", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:18095", "`address` to serve on")
	dsn := fs.String("dsn", defaultDSN(), "MySQL `DSN`; its database is created if missing")
	sale := fs.String("sale", "", "sale `id` to reset at start (with --stock) or to --report")
	stock := fs.Int64("stock", -1, "with --sale: set the sale's stock to `N` and delete its orders")
	maxOpen := fs.Int("max-open-conns", def.MySQL.MaxOpenConns, "MySQL connection pool size (the product's driver.max_open_conns by default)")
	tokenCache := fs.Int("token-cache", def.Gateway.TokenCacheSize, "verified JWTs remembered, as the gateway's gateway.token_cache_size")
	report := fs.Bool("report", false, "print the --sale's stock and orders as one JSON line and exit")
	del := fs.Bool("delete", false, "delete the --sale's stock row and orders and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	case *sale != "" && !flashgate.ValidID(*sale):
		return errors.New("--sale must be 1-64 characters of [A-Za-z0-9_-]")
	case (*report || *del) && *sale == "":
		return errors.New("--report and --delete need --sale")
	case *report && *del:
		return errors.New("--report or --delete, not both")
	case !*report && !*del && *sale != "" && *stock < 0:
		return errors.New("--sale needs --stock N (N >= 0)")
	case *stock >= 0 && *sale == "":
		return errors.New("--stock needs --sale")
	case *maxOpen < 1:
		return errors.New("--max-open-conns must be at least 1")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := Open(ctx, *dsn, *maxOpen)
	if err != nil {
		return err
	}
	defer db.Close()
	if *report {
		r, err := ReportSale(ctx, db, *sale)
		if err != nil {
			return err
		}
		return json.NewEncoder(stdout).Encode(r)
	}
	if *del {
		return DeleteSale(ctx, db, *sale)
	}
	if *sale != "" {
		if err := ResetSale(ctx, db, *sale, *stock); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "seedsync: sale %s: stock %d, no orders\n", *sale, *stock)
	}

	secret := os.Getenv("FLASHGATE_JWT_SECRET")
	if secret == "" {
		return errors.New("set FLASHGATE_JWT_SECRET (the gateway's HS256 secret)")
	}
	srv, err := NewServer(db, secret, *tokenCache)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "seedsync: serving POST /v1/sales/{sale}/orders on %s (MySQL pool %d)\n", ln.Addr(), *maxOpen)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.HTTP.Serve(ln) }()
	select {
	case err := <-serveErr:
		return err
	case s := <-sig:
		fmt.Fprintf(stderr, "seedsync: %v: shutting down\n", s)
	}
	signal.Stop(sig)
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	return srv.HTTP.ShutdownWithContext(sctx)
}

// Open connects to dsn the way flashgate's processes do (mysql.OpenDB), after
// creating its database and the seeds' tables if they are missing.
func Open(ctx context.Context, dsn string, maxOpen int) (*sql.DB, error) {
	cfg, err := driver.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("mysql dsn: %w", err)
	}
	if cfg.DBName == "" {
		return nil, errors.New("mysql dsn: name a database")
	}
	admin := cfg.Clone()
	admin.DBName = ""
	adb, err := sql.Open("mysql", admin.FormatDSN())
	if err != nil {
		return nil, fmt.Errorf("mysql %s: %w", cfg.Addr, err)
	}
	_, err = adb.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS `"+cfg.DBName+"` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")
	adb.Close()
	if err != nil {
		return nil, fmt.Errorf("mysql %s: create database %s: %w", cfg.Addr, cfg.DBName, err)
	}
	db, err := mysql.OpenDB(cfg.FormatDSN())
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(maxOpen)
	db.SetMaxIdleConns(maxOpen)
	for _, ddl := range schema {
		if _, err := db.ExecContext(ctx, ddl); err != nil {
			db.Close()
			return nil, fmt.Errorf("mysql %s/%s: schema: %w", cfg.Addr, cfg.DBName, err)
		}
	}
	return db, nil
}

var schema = []string{
	`CREATE TABLE IF NOT EXISTS seckill_stock (
		id VARCHAR(64) NOT NULL PRIMARY KEY,
		stock BIGINT NOT NULL
	) ENGINE=InnoDB`,
	`CREATE TABLE IF NOT EXISTS seckill_orders (
		id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
		sale_id VARCHAR(64) NOT NULL,
		user_id VARCHAR(64) NOT NULL,
		quantity BIGINT NOT NULL,
		created_at DATETIME(3) NOT NULL,
		UNIQUE KEY uq_sale_user (sale_id, user_id)
	) ENGINE=InnoDB`,
}

// ResetSale sets sale's stock to stock and deletes its orders.
func ResetSale(ctx context.Context, db *sql.DB, sale string, stock int64) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if _, err := tx.ExecContext(ctx, "DELETE FROM seckill_orders WHERE sale_id = ?", sale); err != nil {
		return fmt.Errorf("reset %s: %w", sale, err)
	}
	if _, err := tx.ExecContext(ctx,
		"INSERT INTO seckill_stock (id, stock) VALUES (?, ?) ON DUPLICATE KEY UPDATE stock = VALUES(stock)", sale, stock); err != nil {
		return fmt.Errorf("reset %s: %w", sale, err)
	}
	return tx.Commit()
}

// DeleteSale removes a sale and its orders.
func DeleteSale(ctx context.Context, db *sql.DB, sale string) error {
	if _, err := db.ExecContext(ctx, "DELETE FROM seckill_orders WHERE sale_id = ?", sale); err != nil {
		return err
	}
	_, err := db.ExecContext(ctx, "DELETE FROM seckill_stock WHERE id = ?", sale)
	return err
}

// Report is a sale's state in MySQL.
type Report struct {
	Sale      string `json:"sale"`
	StockLeft int64  `json:"stock_left"`
	Orders    int64  `json:"orders"`
	Units     int64  `json:"units"`
	Buyers    int64  `json:"distinct_users"`
}

// ReportSale reads sale's stock and orders.
func ReportSale(ctx context.Context, db *sql.DB, sale string) (Report, error) {
	r := Report{Sale: sale}
	err := db.QueryRowContext(ctx, "SELECT stock FROM seckill_stock WHERE id = ?", sale).Scan(&r.StockLeft)
	if errors.Is(err, sql.ErrNoRows) {
		return r, fmt.Errorf("sale %s: not found", sale)
	}
	if err != nil {
		return r, err
	}
	err = db.QueryRowContext(ctx,
		"SELECT COUNT(*), COALESCE(SUM(quantity), 0), COUNT(DISTINCT user_id) FROM seckill_orders WHERE sale_id = ?", sale).
		Scan(&r.Orders, &r.Units, &r.Buyers)
	return r, err
}

// Server is the seeds' purchase handler.
type Server struct {
	DB   *sql.DB
	Auth *auth.Cache
	HTTP *fasthttp.Server
	now  func() time.Time

	errors atomic.Int64 // purchases that failed on a database error
}

// NewServer verifies tokens as the gateway does (HS256 with secret, cached).
func NewServer(db *sql.DB, secret string, tokenCache int) (*Server, error) {
	v, err := auth.NewVerifier(config.Auth{JWTSecret: secret})
	if err != nil {
		return nil, err
	}
	def := config.Default().Gateway
	s := &Server{DB: db, Auth: auth.NewCache(v, tokenCache), now: time.Now}
	s.HTTP = &fasthttp.Server{
		Handler:               s.Handle,
		Name:                  "seedsync",
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
		ReadTimeout:           def.ReadTimeout,
		WriteTimeout:          def.WriteTimeout,
		IdleTimeout:           def.IdleTimeout,
		MaxRequestBodySize:    def.MaxBodyBytes,
		ReadBufferSize:        def.MaxHeaderBytes,
		CloseOnShutdown:       true,
	}
	return s, nil
}

// requestTimeout bounds one purchase's time in MySQL. It is longer than the
// load tool's 10 s: a buyer queued on the stock row's lock waits as long as the
// seeds' design makes it wait (up to innodb_lock_wait_timeout), and what the
// client gives up on shows as a transport error, not as our refusal.
const requestTimeout = 60 * time.Second

var (
	pathPrefix   = []byte("/v1/sales/")
	pathSuffix   = []byte("/orders")
	bearerPrefix = []byte("Bearer ")
)

// Handle routes POST /v1/sales/{sale}/orders; everything else is a 404.
func (s *Server) Handle(ctx *fasthttp.RequestCtx) {
	p := ctx.Path()
	if !bytes.HasPrefix(p, pathPrefix) || !bytes.HasSuffix(p, pathSuffix) || len(p) <= len(pathPrefix)+len(pathSuffix) {
		fail(ctx, fasthttp.StatusNotFound, flashgate.CodeInvalidRequest, "no such route")
		return
	}
	sale := p[len(pathPrefix) : len(p)-len(pathSuffix)]
	if !flashgate.ValidIDBytes(sale) {
		fail(ctx, fasthttp.StatusNotFound, flashgate.CodeInvalidRequest, "no such route")
		return
	}
	if !ctx.IsPost() {
		ctx.Response.Header.Set(fasthttp.HeaderAllow, fasthttp.MethodPost)
		fail(ctx, fasthttp.StatusMethodNotAllowed, flashgate.CodeInvalidRequest, "method not allowed")
		return
	}
	s.purchase(ctx, string(sale))
}

func (s *Server) purchase(ctx *fasthttp.RequestCtx, sale string) {
	h := ctx.Request.Header.Peek(fasthttp.HeaderAuthorization)
	if !bytes.HasPrefix(h, bearerPrefix) {
		fail(ctx, fasthttp.StatusUnauthorized, flashgate.CodeUnauthorized, "missing bearer token")
		return
	}
	claims, err := s.Auth.Verify(h[len(bearerPrefix):], s.now())
	if err != nil {
		fail(ctx, fasthttp.StatusUnauthorized, flashgate.CodeUnauthorized, "invalid token")
		return
	}
	if msg := checkBody(ctx.PostBody()); msg != "" {
		fail(ctx, fasthttp.StatusBadRequest, flashgate.CodeInvalidRequest, msg)
		return
	}
	// Not ctx itself: a fasthttp.RequestCtx is recycled when the handler returns,
	// and the driver may still watch it.
	bctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	id, outcome, err := Buy(bctx, s.DB, sale, claims.Subject, s.now())
	cancel()
	switch outcome {
	case Bought:
		ctx.SetStatusCode(fasthttp.StatusAccepted)
		ctx.SetContentType("application/json")
		r := &ctx.Response
		r.ResetBody()
		r.AppendBodyString(`{"code":"accepted","order_id":"`)
		var buf [20]byte
		r.AppendBody(strconv.AppendInt(buf[:0], id, 10))
		r.AppendBodyString(`","status":"confirmed"}`)
	case SoldOut:
		fail(ctx, fasthttp.StatusConflict, flashgate.CodeSoldOut, "sold out")
	case AlreadyBought:
		fail(ctx, fasthttp.StatusForbidden, flashgate.CodeLimitReached, "you already hold an order of this sale")
	case NoSale:
		fail(ctx, fasthttp.StatusNotFound, flashgate.CodeSaleNotFound, "no such sale")
	default:
		s.logError(err)
		ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, "1")
		msg := "database unavailable"
		if err != nil {
			msg += ": " + err.Error()
		}
		fail(ctx, fasthttp.StatusServiceUnavailable, flashgate.CodeUnavailable, msg)
	}
}

// logError reports the first database errors, then every 1000th.
func (s *Server) logError(err error) {
	if n := s.errors.Add(1); n <= 10 || n%1000 == 0 {
		fmt.Fprintf(os.Stderr, "seedsync: purchase failed (%d so far): %v\n", n, err)
	}
}

// checkBody parses {"quantity":1,"region":"…"} strictly; the seeds sell one
// unit per order and know no regions. It returns "" if the body is fine.
func checkBody(b []byte) string {
	if len(bytes.TrimSpace(b)) == 0 {
		return ""
	}
	var body struct {
		Quantity *int64  `json:"quantity"`
		Region   *string `json:"region"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		return `body must be a JSON object like {"quantity":1}`
	}
	if dec.More() {
		return "trailing data after the body"
	}
	if body.Quantity != nil && *body.Quantity != 1 {
		return "quantity must be 1"
	}
	if body.Region != nil && *body.Region != "" {
		return "unknown region: this sale has no regions"
	}
	return ""
}

// Outcome is what one purchase came to.
type Outcome int

// Outcomes of Buy.
const (
	Failed        Outcome = iota // a database error: nothing was committed
	Bought                       // the order row is committed
	SoldOut                      // no stock left
	AlreadyBought                // the user has an order of this sale
	NoSale                       // no such sale
)

// MySQL error numbers a purchase can meet.
const (
	errDuplicateKey = 1062
)

// Buy is the seeds' first solution: stock check, one-order-per-user check, the
// guarded decrement and the insert, in one transaction. It returns the new
// order's id when Bought.
func Buy(ctx context.Context, db *sql.DB, sale, user string, now time.Time) (int64, Outcome, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, Failed, err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit

	// 1. The seckill row: is there stock?
	var stock int64
	err = tx.QueryRowContext(ctx, "SELECT stock FROM seckill_stock WHERE id = ?", sale).Scan(&stock)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return 0, NoSale, nil
	case err != nil:
		return 0, Failed, err
	case stock < 1:
		return 0, SoldOut, nil
	}
	// 2. One order per user.
	var n int64
	if err := tx.QueryRowContext(ctx,
		"SELECT COUNT(*) FROM seckill_orders WHERE sale_id = ? AND user_id = ?", sale, user).Scan(&n); err != nil {
		return 0, Failed, err
	}
	if n > 0 {
		return 0, AlreadyBought, nil
	}
	// 3. The guarded decrement: the row lock serialises every buyer of the sale.
	res, err := tx.ExecContext(ctx, "UPDATE seckill_stock SET stock = stock - 1 WHERE id = ? AND stock > 0", sale)
	if err != nil {
		return 0, Failed, err
	}
	if rows, err := res.RowsAffected(); err != nil {
		return 0, Failed, err
	} else if rows == 0 {
		return 0, SoldOut, nil
	}
	// 4. The order. The unique key catches the same user racing itself past step 2.
	res, err = tx.ExecContext(ctx,
		"INSERT INTO seckill_orders (sale_id, user_id, quantity, created_at) VALUES (?, ?, 1, ?)", sale, user, now.UTC())
	if err != nil {
		var me *driver.MySQLError
		if errors.As(err, &me) && me.Number == errDuplicateKey {
			return 0, AlreadyBought, nil
		}
		return 0, Failed, err
	}
	id, err := res.LastInsertId()
	if err != nil {
		return 0, Failed, err
	}
	if err := tx.Commit(); err != nil {
		return 0, Failed, err
	}
	return id, Bought, nil
}

// fail writes a docs/design.md §3 error body.
func fail(ctx *fasthttp.RequestCtx, status int, code flashgate.Code, msg string) {
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	b, _ := json.Marshal(struct {
		Code    flashgate.Code `json:"code"`
		Message string         `json:"message"`
	}{code, msg})
	ctx.SetBody(b)
}
