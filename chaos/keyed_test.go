package chaos

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/mysql"
)

// The scenarios where each buyer's own answers matter, not only the totals:
// a retry with an Idempotency-Key after Redis lost its data must answer the
// key's first order, and a 503 must never turn into an order (nor a 202 into
// none) when JetStream's acks come after the publish timeout.
func init() {
	scenarios = append(scenarios,
		scenario{"redis data lost, buyers retry", redisLostBuyersRetry},
		scenario{"nats paused past publish timeout", natsPausedPastPublishTimeout},
	)
}

// answer is one purchase as its buyer saw it.
type answer struct {
	status int
	order  uint64
	code   string
}

// buyer is one person of a keyed flood: a token, an Idempotency-Key (maybe
// none), and every answer they got, in order.
type buyer struct {
	user, tok, key string
	answers        []answer
}

// accepted is the order id of the buyer's first 202, 0 if none.
func (b *buyer) accepted() uint64 {
	for _, a := range b.answers {
		if a.status == 202 {
			return a.order
		}
	}
	return 0
}

func (st *stack) buyers(n int, keyed bool) [][]*buyer {
	st.t.Helper()
	st.floods++
	out := make([][]*buyer, len(st.gateways))
	for i := range st.gateways {
		for j := range n / len(st.gateways) {
			user := "f" + strconv.Itoa(st.floods) + "g" + strconv.Itoa(i) + "u" + strconv.Itoa(j)
			tok, err := auth.MintHS256(st.cfg.Auth.JWTSecret, user, auth.MintOptions{})
			if err != nil {
				st.t.Fatal(err)
			}
			b := &buyer{user: user, tok: tok}
			if keyed {
				b.key = "k-" + user
			}
			out[i] = append(out[i], b)
		}
	}
	return out
}

var buyClient = &http.Client{Timeout: 30 * time.Second,
	Transport: &http.Transport{MaxIdleConnsPerHost: 64, MaxConnsPerHost: 64}}

func buy(addr, sale string, b *buyer) answer {
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/sales/"+sale+"/orders", strings.NewReader(`{"quantity":1}`))
	req.Header.Set("Authorization", "Bearer "+b.tok)
	if b.key != "" {
		req.Header.Set("Idempotency-Key", b.key)
	}
	res, err := buyClient.Do(req)
	if err != nil {
		return answer{}
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	var body struct {
		Code    string `json:"code"`
		OrderID string `json:"order_id"`
	}
	_ = json.Unmarshal(raw, &body)
	id, _ := strconv.ParseUint(body.OrderID, 10, 64)
	return answer{status: res.StatusCode, order: id, code: body.Code}
}

// keyedFlood runs each gateway's buyers through it, 32 at a time: each buyer
// asks until an answer other than 503 (or a transport error), at most tries
// times, then stops. fault runs once the flood is under way.
func (st *stack) keyedFlood(sale string, groups [][]*buyer, tries int, fault func()) int64 {
	st.t.Helper()
	var sent atomic.Int64
	var wg sync.WaitGroup
	for i, g := range st.gateways {
		var next atomic.Int64
		for range 32 {
			wg.Go(func() {
				for {
					j := next.Add(1) - 1
					if j >= int64(len(groups[i])) {
						return
					}
					b := groups[i][j]
					for range tries {
						a := st.buy(g.addr, sale, b)
						sent.Add(1)
						b.answers = append(b.answers, a)
						if a.status != 503 && a.status != 0 {
							break
						}
						time.Sleep(100 * time.Millisecond)
					}
				}
			})
		}
	}
	if fault != nil {
		time.Sleep(300 * time.Millisecond)
		fault()
		if st.faultEnd.IsZero() {
			st.faultEnd = time.Now()
		}
	}
	wg.Wait()
	return sent.Load()
}

func acceptedOf(groups [][]*buyer) []uint64 {
	var out []uint64
	for _, g := range groups {
		for _, b := range g {
			for _, a := range b.answers {
				if a.status == 202 {
					out = append(out, a.order)
				}
			}
		}
	}
	return out
}

// ordersByUser is each user's orders of sale in MySQL by status.
func (st *stack) ordersByUser(sale string) map[string]map[string]int {
	st.t.Helper()
	db, err := mysql.OpenDB(st.cfg.MySQL.DSN)
	if err != nil {
		st.t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.QueryContext(context.Background(), `SELECT user_id, status, COUNT(*) FROM orders WHERE sale_id = ? GROUP BY user_id, status`, sale)
	if err != nil {
		st.t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]map[string]int{}
	for rows.Next() {
		var user, status string
		var n int
		if err := rows.Scan(&user, &status, &n); err != nil {
			st.t.Fatal(err)
		}
		if out[user] == nil {
			out[user] = map[string]int{}
		}
		out[user][status] = n
	}
	return out
}

func live(byStatus map[string]int) int { return byStatus["confirmed"] + byStatus["paid"] }

// redisLostBuyersRetry: Redis loses everything (FLUSHALL) mid-flood; buyers
// whose purchase failed retry with the same Idempotency-Key, and every buyer
// who got a 202 asks again with it afterwards. Each key answers one order id
// every time it is answered 202, and MySQL holds one live order per key (the
// per-user limit of 2 would let a second through: only idempotency stops it).
func redisLostBuyersRetry(t *testing.T) {
	st := newStack(t)
	s := st.createSale(2000, 2)
	groups := st.buyers(3000, true)
	rc := testenv.Redis(t, st.cfg.Redis.Addrs)
	requests := st.keyedFlood(s.ID, groups, 50, func() {
		if err := st.flushRedis(rc); err != nil {
			t.Errorf("FLUSHALL: %v", err)
		}
	})
	// Every buyer asks once more, with the key, after the loss: a replay.
	requests += st.replayAccepted(s.ID, groups)
	accepted := acceptedOf(groups)
	rep, rec := st.settle(s.ID, accepted)
	byUser := st.ordersByUser(s.ID)
	var second, wrongReplay, keys int
	for _, g := range groups {
		for _, b := range g {
			first := b.accepted()
			if first == 0 {
				continue
			}
			keys++
			for _, a := range b.answers {
				if a.status == 202 && a.order != first {
					wrongReplay++
					t.Logf("%s: key %s answered %d, then %d", b.user, b.key, first, a.order)
				}
			}
			last := b.answers[len(b.answers)-1]
			if last.status != 202 {
				t.Errorf("%s: the replay after the loss answered %d %s", b.user, last.status, last.code)
			}
			if n := live(byUser[b.user]); n != 1 {
				second++
				t.Logf("%s: %d live orders for one key (%v)", b.user, n, byUser[b.user])
			}
		}
	}
	if wrongReplay > 0 || second > 0 {
		t.Errorf("of %d keys answered 202: %d 202s named another order than the key's first, %d keys do not hold exactly one live order",
			keys, wrongReplay, second)
	}
	record(t, "redis data lost, buyers retry", requests, accepted, rep, rec)
}

// natsPausedPastPublishTimeout: NATS is stopped (SIGSTOP) for three publish
// timeouts mid-flood, then continued: the publishes the gateways gave up on
// reach the stream late. Each buyer asks once; every buyer answered 503 ends
// with no order row at all, every buyer answered 202 with exactly one, live.
func natsPausedPastPublishTimeout(t *testing.T) {
	short := []string{"FLASHGATE_GATEWAY_PUBLISH_TIMEOUT=1s"}
	st := newStack(t, everyGateway(short)...)
	s := st.createSale(4000, 1)
	groups := st.buyers(4000, false)
	// On a cluster: the node leading the orders stream (3 s is less than
	// its peers wait before they elect another).
	requests := st.keyedFlood(s.ID, groups, 1, func() {
		n := st.natsOf()
		n.Pause()
		time.Sleep(3 * time.Second)
		n.Resume()
	})
	accepted := acceptedOf(groups)
	rep, rec := st.settle(s.ID, accepted)
	byUser := st.ordersByUser(s.ID)
	var n503, n202, bad503, bad202 int
	for _, g := range groups {
		for _, b := range g {
			a := b.answers[0]
			rows := 0
			for _, n := range byUser[b.user] {
				rows += n
			}
			switch a.status {
			case 503:
				n503++
				if rows != 0 {
					bad503++
					t.Logf("%s: 503, yet orders %v", b.user, byUser[b.user])
				}
			case 202:
				n202++
				if rows != 1 || live(byUser[b.user]) != 1 {
					bad202++
					t.Logf("%s: 202 (order %d), orders %v", b.user, a.order, byUser[b.user])
				}
			}
		}
	}
	t.Logf("%d answered 503, %d answered 202", n503, n202)
	if n503 == 0 {
		t.Errorf("no 503 while NATS was stopped: the fault did not reach the publishes")
	}
	if bad503 > 0 || bad202 > 0 {
		t.Errorf("%d buyers answered 503 have an order; %d answered 202 do not have exactly one live order", bad503, bad202)
	}
	record(t, "nats paused past publish timeout", requests, accepted, rep, rec)
}
