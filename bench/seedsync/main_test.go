package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/internal/testenv"
)

const testSecret = "seedsync-test-secret"

// seeds is a seeds server on a loopback port, on the stack's MariaDB
// (FLASHGATE_MYSQL_DSN's server), database flashgate_seedsync.
type seeds struct {
	db   *sql.DB
	url  string
	sale string
	hc   *http.Client
}

func start(t *testing.T, stock int64) *seeds {
	t.Helper()
	cfg, err := mysql.ParseDSN(testenv.MySQLDSN())
	if err != nil {
		t.Fatalf("mysql dsn: %v", err)
	}
	cfg.DBName = DefaultDB
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	db, err := Open(ctx, cfg.FormatDSN(), 16)
	if err != nil {
		t.Fatalf("%v (is the stack up? `make infra-up`)", err)
	}
	s := &seeds{db: db, sale: testenv.ID("seedsync-t-")}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := DeleteSale(ctx, db, s.sale); err != nil {
			t.Errorf("delete sale %s: %v", s.sale, err)
		}
		db.Close()
	})
	if err := ResetSale(ctx, db, s.sale, stock); err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(db, testSecret, 1000)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.HTTP.Serve(ln) }()
	t.Cleanup(func() { _ = srv.HTTP.Shutdown() })
	s.url = "http://" + ln.Addr().String() + "/v1/sales/" + s.sale + "/orders"
	s.hc = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	t.Cleanup(s.hc.CloseIdleConnections)
	return s
}

type answer struct {
	status  int
	Code    string `json:"code"`
	OrderID string `json:"order_id"`
	Status  string `json:"status"`
}

func (s *seeds) post(t *testing.T, url, authz, body string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return answer{}
	}
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		t.Error(err)
		return answer{}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Error(err)
	}
	a := answer{status: resp.StatusCode}
	if err := json.Unmarshal(b, &a); err != nil {
		t.Errorf("answer %d %q: %v", resp.StatusCode, b, err)
	}
	return a
}

func token(t *testing.T, user string) string {
	t.Helper()
	tok, err := auth.MintHS256(testSecret, user, auth.MintOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return "Bearer " + tok
}

func (s *seeds) report(t *testing.T) Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := ReportSale(ctx, s.db, s.sale)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// N buyers at once on K units: exactly K orders, stock 0, no user twice, and
// every 202's order id is a row.
func TestConcurrentBuyersSellExactlyTheStock(t *testing.T) {
	const buyers, stock = 300, 40
	s := start(t, stock)
	tokens := make([]string, buyers)
	for i := range tokens {
		tokens[i] = token(t, "u"+strconv.Itoa(i))
	}
	answers := make([]answer, buyers)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range buyers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			answers[i] = s.post(t, s.url, tokens[i], `{"quantity":1}`)
		}()
	}
	close(gate)
	wg.Wait()

	byStatus := map[int]int{}
	var ids []string
	for i, a := range answers {
		byStatus[a.status]++
		switch a.status {
		case http.StatusAccepted:
			if a.Code != "accepted" || a.Status != "confirmed" || a.OrderID == "" {
				t.Errorf("buyer %d: 202 %+v", i, a)
			}
			ids = append(ids, a.OrderID)
		case http.StatusConflict:
			if a.Code != "sold_out" {
				t.Errorf("buyer %d: 409 %+v", i, a)
			}
		default:
			t.Errorf("buyer %d: %d %+v", i, a.status, a)
		}
	}
	if byStatus[http.StatusAccepted] != stock || byStatus[http.StatusConflict] != buyers-stock {
		t.Errorf("answers %v, want %d×202 and %d×409", byStatus, stock, buyers-stock)
	}
	r := s.report(t)
	if r.StockLeft != 0 || r.Orders != stock || r.Units != stock || r.Buyers != stock {
		t.Errorf("MySQL: %+v, want stock 0, %d orders of %d distinct users", r, stock, stock)
	}

	rows, err := s.db.Query("SELECT id FROM seckill_orders WHERE sale_id = ? ORDER BY id", s.sale)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var inDB []string
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		inDB = append(inDB, strconv.FormatInt(id, 10))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(ids)
	slices.Sort(inDB)
	if !slices.Equal(ids, inDB) {
		t.Errorf("order ids answered %v, in MySQL %v", ids, inDB)
	}

	// Sold out now, for anyone.
	if a := s.post(t, s.url, token(t, "late"), ""); a.status != http.StatusConflict || a.Code != "sold_out" {
		t.Errorf("after the sell-out: %d %+v, want 409 sold_out", a.status, a)
	}
}

// One user racing itself gets one order; the others are 403 limit_reached.
func TestOneOrderPerUserUnderConcurrency(t *testing.T) {
	const tries, stock = 20, 100
	s := start(t, stock)
	tok := token(t, "greedy")
	answers := make([]answer, tries)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range tries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			answers[i] = s.post(t, s.url, tok, `{"quantity":1}`)
		}()
	}
	close(gate)
	wg.Wait()
	byStatus := map[int]int{}
	for _, a := range answers {
		byStatus[a.status]++
		if a.status == http.StatusForbidden && a.Code != "limit_reached" {
			t.Errorf("403 %+v", a)
		}
	}
	if byStatus[http.StatusAccepted] != 1 || byStatus[http.StatusForbidden] != tries-1 {
		t.Errorf("answers %v, want one 202 and %d×403", byStatus, tries-1)
	}
	if r := s.report(t); r.StockLeft != stock-1 || r.Orders != 1 || r.Buyers != 1 {
		t.Errorf("MySQL: %+v, want stock %d and one order", r, stock-1)
	}
}

// Refusals carry the product's statuses and codes, and reserve nothing.
func TestRefusals(t *testing.T) {
	s := start(t, 5)
	good := token(t, "someone")
	base := strings.TrimSuffix(s.url, "/v1/sales/"+s.sale+"/orders")
	bad, err := auth.MintHS256("another-secret", "someone", auth.MintOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, url, authz, body string
		status                 int
		code                   string
	}{
		{"no token", s.url, "", "", 401, "unauthorized"},
		{"wrong secret", s.url, "Bearer " + bad, "", 401, "unauthorized"},
		{"not bearer", s.url, strings.TrimPrefix(good, "Bearer "), "", 401, "unauthorized"},
		{"unknown field", s.url, good, `{"qty":1}`, 400, "invalid_request"},
		{"quantity 2", s.url, good, `{"quantity":2}`, 400, "invalid_request"},
		{"region", s.url, good, `{"region":"bj"}`, 400, "invalid_request"},
		{"not json", s.url, good, `quantity=1`, 400, "invalid_request"},
		{"no such sale", base + "/v1/sales/" + s.sale + "x/orders", good, "", 404, "sale_not_found"},
		{"no such route", base + "/v1/sales/" + s.sale, good, "", 404, "invalid_request"},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := s.post(t, c.url, c.authz, c.body)
			if a.status != c.status || a.Code != c.code {
				t.Errorf("%d %+v, want %d %s", a.status, a, c.status, c.code)
			}
		})
	}
	if r := s.report(t); r.StockLeft != 5 || r.Orders != 0 {
		t.Errorf("MySQL after refusals: %+v, want stock 5 and no order", r)
	}
	// And then the same user may buy, once.
	for i, want := range []int{202, 403} {
		if a := s.post(t, s.url, good, `{"quantity":1}`); a.status != want {
			t.Errorf("purchase %d: %d %+v, want %d", i+1, a.status, a, want)
		}
	}
}

// A database that is gone is a 503 unavailable, never a sale or a refusal.
func TestDatabaseDownIsUnavailable(t *testing.T) {
	s := start(t, 5)
	// A pool pointed at a closed port: every purchase fails at BEGIN.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.DBName = "root", "tcp", addr, DefaultDB
	cfg.Timeout = time.Second
	dead, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	srv, err := NewServer(dead, testSecret, 0)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.HTTP.Serve(l2) }()
	defer func() { _ = srv.HTTP.Shutdown() }()
	url := fmt.Sprintf("http://%s/v1/sales/%s/orders", l2.Addr(), s.sale)
	if a := s.post(t, url, token(t, "someone"), ""); a.status != http.StatusServiceUnavailable || a.Code != "unavailable" {
		t.Errorf("%d %+v, want 503 unavailable", a.status, a)
	}
}
