package e2e

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/loadgen"
	"github.com/flashgate/flashgate/mysql"
)

// Purchase limits and regional stock through the gateway and the backend
// (seeds 001 and 004).

type buyer struct {
	user, phone, device, ip string
}

// buyWith sends one purchase as b with body, from b.ip (X-Forwarded-For: the
// test's loopback address is a trusted proxy).
func buyWith(t *testing.T, cfg config.Config, addr, sale string, b buyer, body string) answerMsg {
	t.Helper()
	tok, err := auth.MintHS256(cfg.Auth.JWTSecret, b.user, auth.MintOptions{Phone: b.phone, Device: b.device})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/sales/"+sale+"/orders", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tok)
	if b.ip != "" {
		req.Header.Set("X-Forwarded-For", b.ip)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	a := answerMsg{status: res.StatusCode, raw: string(raw)}
	_ = json.Unmarshal(raw, &a)
	return a
}

type answerMsg struct {
	status  int
	raw     string
	Code    string `json:"code"`
	Message string `json:"message"`
	Order   string `json:"order_id"`
	// Dimension is the limit a 403 limit_reached names (user, phone, …).
	Dimension string `json:"dimension"`
}

// TestLimitsThroughTheGateway: a sale with five limits; each refusal names its
// dimension, a request without what a limit needs names it too, and what
// passed is in MySQL with its usage.
func TestLimitsThroughTheGateway(t *testing.T) {
	cfg := e2eConfig(t)
	be := startBackend(t, cfg)
	gw := startGateway(t, cfg)
	s := newSale(100, 4)
	s.PerOrderMax = 2
	s.TimeZone = "Asia/Shanghai"
	s.Limits = []flashgate.Limit{
		{Dimension: flashgate.DimPhone, Max: 1, Of: flashgate.OfOrders, Per: flashgate.PerDay},
		{Dimension: flashgate.DimDevice, Max: 2},
		{Dimension: flashgate.DimIP, Max: 3, Per: flashgate.PerMonth},
		{Dimension: flashgate.DimAddress, Max: 1, Of: flashgate.OfOrders},
		{Dimension: flashgate.DimUser, Max: 3, Per: flashgate.PerDay},
	}
	createSale(t, cfg, be.AdminAddr(), s)
	awaitSale(t, gw, s.ID)
	buy := func(b buyer, body string) answerMsg { return buyWith(t, cfg, gw.Addr(), s.ID, b, body) }
	addr := func(a string) string { return fmt.Sprintf(`{"quantity":1,"address":%q}`, a) }

	// The public sale shows its limits.
	res, err := http.Get("http://" + gw.Addr() + "/v1/sales/" + s.ID)
	if err != nil {
		t.Fatal(err)
	}
	var pub struct {
		Limits   []flashgate.Limit `json:"limits"`
		TimeZone string            `json:"time_zone"`
	}
	_ = json.NewDecoder(res.Body).Decode(&pub)
	res.Body.Close()
	if len(pub.Limits) != 5 || pub.Limits[0].Per != "day" || pub.TimeZone != "Asia/Shanghai" {
		t.Fatalf("public sale: %+v", pub)
	}

	var accepted []string
	want := func(what string, a answerMsg, status int, code, mention string) {
		t.Helper()
		if a.status != status || a.Code != code || !strings.Contains(a.Message, mention) {
			t.Fatalf("%s: %d %s, want %d %s mentioning %q", what, a.status, a.raw, status, code, mention)
		}
		if status == 202 {
			accepted = append(accepted, a.Order)
		}
		if code == "limit_reached" {
			// The dimension is a field of its own, the first word of the mention.
			if dim, _, _ := strings.Cut(mention, " "); a.Dimension != dim {
				t.Fatalf("%s: %s names dimension %q, want %q", what, a.raw, a.Dimension, dim)
			}
		}
	}
	a := buyer{user: "ua", phone: "+86 138-0000-0001", device: "dev-a", ip: "198.18.1.1"}
	// What a limit needs and the request lacks.
	want("no phone claim", buy(buyer{user: "ux", device: "d", ip: "198.18.1.9"}, addr("x")), 400, "invalid_request", "phone")
	want("no device claim", buy(buyer{user: "ux", phone: "+8613800000099", ip: "198.18.1.9"}, addr("x")), 400, "invalid_request", "device")
	want("no address", buy(a, `{"quantity":1}`), 400, "invalid_request", "address")
	want("bad phone", buy(buyer{user: "ux", phone: "call me", device: "d", ip: "198.18.1.9"}, addr("x")), 400, "invalid_request", "phone")
	want("blank address", buy(a, addr(" ，。 ")), 400, "invalid_request", "address")

	want("first", buy(a, `{"quantity":2,"address":"北京市朝阳区 建国路88号"}`), 202, "accepted", "")
	// The same phone written differently, another user, device, address, address.
	want("phone", buy(buyer{user: "ub", phone: "+8613800000001", device: "dev-b", ip: "198.18.1.2"}, addr("b")), 403, "limit_reached", "phone")
	// The same address written differently (full-width digits, no space).
	want("address", buy(buyer{user: "uc", phone: "+8613800000003", device: "dev-c", ip: "198.18.1.3"},
		addr("北京市朝阳区建国路８８号")), 403, "limit_reached", "address")
	want("device", buy(buyer{user: "ud", phone: "+8613800000004", device: "dev-a", ip: "198.18.1.4"}, addr("d")), 403, "limit_reached", "device")
	// Two more units from a's address: 2 + 1 = 3 is allowed, the 4th is not.
	want("ip ok", buy(buyer{user: "ue", phone: "+8613800000005", device: "dev-e", ip: "198.18.1.1"}, addr("e")), 202, "accepted", "")
	want("ip", buy(buyer{user: "uf", phone: "+8613800000006", device: "dev-f", ip: "198.18.1.1"}, addr("f")), 403, "limit_reached", "ip")
	// The user's own daily limit (3 units) across phones, devices, addresses;
	// per_user_limit (4) is not what refuses the 4th.
	for i := range 4 {
		b := buyer{user: "ug", phone: fmt.Sprintf("+861380000010%d", i), device: fmt.Sprintf("dev-g%d", i), ip: fmt.Sprintf("198.18.2.%d", i)}
		r := buy(b, addr(fmt.Sprintf("g%d", i)))
		if i < 3 {
			want("user", r, 202, "accepted", "")
		} else {
			want("user per day", r, 403, "limit_reached", "user limit reached: at most 3 units per user per day")
		}
	}

	ids := make([]uint64, len(accepted))
	for i, id := range accepted {
		fmt.Sscan(id, &ids[i])
	}
	rep := drain(t, cfg, s.ID, ids)
	assertInvariants(t, rep)
	if len(accepted) != 5 || rep.Orders != 5 || rep.OverLimitSubjects != 0 || rep.LiveUnits != 6 {
		t.Fatalf("audit: %+v (accepted %d)", rep, len(accepted))
	}
	db, err := mysql.OpenDB(cfg.MySQL.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var rows, used int64
	if err := db.QueryRow(`SELECT COUNT(*), SUM(used) FROM limit_usage WHERE sale_id = ? AND used > 0`, s.ID).Scan(&rows, &used); err != nil {
		t.Fatal(err)
	}
	// 5 orders of 6 units: phone and address count orders (5 each), device, ip
	// and user units (6 each).
	if rows == 0 || used != 5+6+6+5+6 {
		t.Fatalf("limit_usage: %d rows, %d used", rows, used)
	}
}

// TestSeed001Scenario is seed 001's experiment: 4 units, at most 2 per order,
// 15 concurrent requests for 2 units each: exactly 2 succeed, stock ends 0.
func TestSeed001Scenario(t *testing.T) {
	cfg := e2eConfig(t)
	be := startBackend(t, cfg)
	gw := startGateway(t, cfg)
	s := newSale(4, 2)
	s.PerOrderMax = 2
	createSale(t, cfg, be.AdminAddr(), s)
	awaitSale(t, gw, s.ID)
	res, err := loadgen.Run(context.Background(), loadgen.Config{
		Target: "http://" + gw.Addr(), Sale: s.ID, Tokens: tokens(t, cfg, "seed001-", 15),
		Concurrency: 15, Requests: 15, Quantity: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	rep := drain(t, cfg, s.ID, res.Accepted)
	assertInvariants(t, rep)
	if len(res.Accepted) != 2 || res.ByStatus[202] != 2 || res.ByStatus[409] != 13 {
		t.Fatalf("statuses %v, accepted %d: want 2 accepted, 13 sold out", res.ByStatus, len(res.Accepted))
	}
	if rep.Sold != 4 || rep.LiveUnits != 4 || rep.RedisRemaining != 0 || rep.Orders != 2 {
		t.Fatalf("audit: %+v", rep)
	}
}

// TestRegionsSellOutIndependently: three regions flooded at once; each sells
// exactly its own units, a sold-out region answers 409 while the others sell,
// and MySQL's region rows agree.
func TestRegionsSellOutIndependently(t *testing.T) {
	cfg := e2eConfig(t)
	be := startBackend(t, cfg)
	gw := startGateway(t, cfg)
	s := newSale(60, 1)
	s.Regions = map[string]int64{"bj": 30, "sh": 10, "gz": 20}
	createSale(t, cfg, be.AdminAddr(), s)
	awaitSale(t, gw, s.ID)

	// sh first, alone, until sold out: the others keep their stock.
	sh, err := loadgen.Run(context.Background(), loadgen.Config{Target: "http://" + gw.Addr(), Sale: s.ID,
		Tokens: tokens(t, cfg, "sh-first-", 200), Concurrency: 64, Requests: 200, Region: "sh"})
	if err != nil {
		t.Fatal(err)
	}
	if len(sh.Accepted) != 10 || sh.ByStatus[409] != 190 {
		t.Fatalf("sh: %v", sh.ByStatus)
	}
	if a := buyWith(t, cfg, gw.Addr(), s.ID, buyer{user: "late-bj"}, `{"region":"bj"}`); a.status != 202 {
		t.Fatalf("bj after sh sold out: %d %s", a.status, a.raw)
	}
	if a := buyWith(t, cfg, gw.Addr(), s.ID, buyer{user: "late-sh"}, `{"region":"sh"}`); a.status != 409 || a.Code != "sold_out" {
		t.Fatalf("sh sold out: %d %s", a.status, a.raw)
	}

	// Then all three at once.
	var mu sync.Mutex
	var wg sync.WaitGroup
	accepted := append([]uint64(nil), sh.Accepted...)
	byRegion := map[string]int{}
	for _, region := range []string{"bj", "sh", "gz"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := loadgen.Run(context.Background(), loadgen.Config{Target: "http://" + gw.Addr(), Sale: s.ID,
				Tokens: tokens(t, cfg, "flood-"+region+"-", 400), Concurrency: 64, Requests: 400, Region: region})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			accepted = append(accepted, r.Accepted...)
			byRegion[region] = len(r.Accepted)
		}()
	}
	wg.Wait()
	if byRegion["bj"] != 29 || byRegion["sh"] != 0 || byRegion["gz"] != 20 {
		t.Fatalf("accepted by region %v, want bj 29 (one sold before), sh 0, gz 20", byRegion)
	}
	rep := drain(t, cfg, s.ID, append(accepted, lateID(t, cfg, s.ID, "late-bj")))
	assertInvariants(t, rep)
	db, err := mysql.OpenDB(cfg.MySQL.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for region, total := range s.Regions {
		if sold := regionSold(t, db, s.ID, region); sold != total {
			t.Errorf("region %s sold %d, want %d", region, sold, total)
		}
	}
}

func regionSold(t *testing.T, db *sql.DB, sale, region string) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow(`SELECT sold FROM sale_regions WHERE sale_id = ? AND region = ?`, sale, region).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// lateID is the order id of the one order user placed (read from MySQL once
// it is there), so the audit counts it among the accepted.
func lateID(t *testing.T, cfg config.Config, sale, user string) uint64 {
	t.Helper()
	db, err := mysql.OpenDB(cfg.MySQL.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var id uint64
	for range 200 {
		if err := db.QueryRow(`SELECT id FROM orders WHERE sale_id = ? AND user_id = ?`, sale, user).Scan(&id); err == nil {
			return id
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("order of %s never reached MySQL", user)
	return 0
}
