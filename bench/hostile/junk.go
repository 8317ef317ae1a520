package main

// The junk-command attack (docs/hostile.md, "Junk commands"). Unlike the other attacks it needs
// credentials, a buyer's: a few hundred accounts cancel order ids they made up, 2,000 a second,
// while the shop's payment service pays real orders beside them, 50 a second. What is measured
// is the payments: their p99 and their success. Before the command path was hardened every
// made-up id went over NATS to a backend, which locked the sale's row to find no order, and the
// payments queued behind the junk.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/orderid"
)

// junkPrep is what the junk attack readies before its baseline: the orders the payment service
// will pay, each confirmed, and the secrets it signs with.
type junkPrep struct {
	orders   []paidOrder
	price    int64
	junkToks []string
	paySecs  []string
	runID    string
	seen     map[string]int64
}

// paidOrder is one real order the attack pays.
type paidOrder struct {
	id   string
	user string
	tok  string
}

var junkPrepared = map[string]*junkPrep{}

// junkClient is an HTTP client whose connections come from src: each account of the attack
// has an address of its own, as a bot farm's would.
func junkClient(src net.IP, timeout time.Duration) *http.Client {
	d := &net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: src}}
	return &http.Client{Timeout: timeout, Transport: &http.Transport{
		DialContext: d.DialContext, MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second,
	}}
}

// payerSrc is the i-th address of the buyers whose orders are paid (127.11.0.0/16), and
// payServiceSrc the payment service's.
func payerSrc(i int) net.IP { i %= 250 * 250; return net.IPv4(127, 11, byte(i/250), byte(i%250+1)) }

var payServiceSrc = net.IPv4(127, 12, 0, 1)

// call sends one request and answers its status, its body and how long it took.
func call(c *http.Client, method, url string, hdr map[string]string, body []byte) (int, []byte, time.Duration, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return 0, nil, 0, err
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	start := time.Now()
	res, err := c.Do(req)
	if err != nil {
		return 0, nil, time.Since(start), err
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	return res.StatusCode, b, time.Since(start), err
}

// junkSetup mints the tokens, buys the orders the payments will pay (one per buyer: the suite's
// sale has a per-user limit of 1) and waits until MySQL confirmed them.
func junkSetup(t target) error {
	cfg, err := config.Load(set.config)
	if err != nil {
		return fmt.Errorf("junk_commands: %w (it needs the stack's secrets: . var/secrets.env)", err)
	}
	secret, kid, err := auth.SigningSecret(cfg.Auth)
	if err != nil {
		return fmt.Errorf("junk_commands: %w", err)
	}
	if len(cfg.Payments.Secret) == 0 {
		return errors.New("junk_commands: no payments secret (FLASHGATE_PAYMENTS_SECRET)")
	}
	p := &junkPrep{paySecs: cfg.Payments.Secret, runID: strconv.FormatInt(time.Now().UnixMilli()%1e9, 36) + t.Name[:1],
		seen: map[string]int64{}}
	base := "http://" + t.Addr
	// The price, from the public sale, once it is open (scripts/hostile.sh opens it a little
	// after it is created).
	var info struct {
		Price int64  `json:"price_cents"`
		State string `json:"state"`
	}
	for wait := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		st, b, _, err := call(junkClient(payerSrc(0), 5*time.Second), "GET", base+"/v1/sales/"+set.sale, nil, nil)
		if err != nil || st != 200 {
			return fmt.Errorf("junk_commands: GET the sale: %d %v", st, err)
		}
		if err := json.Unmarshal(b, &info); err != nil {
			return fmt.Errorf("junk_commands: the sale: %w", err)
		}
		if info.State == "active" {
			break
		}
		if time.Now().After(wait) {
			return fmt.Errorf("junk_commands: the sale is %s, not active", info.State)
		}
	}
	p.price = info.Price
	for i := range set.junkUsers {
		tok, err := auth.MintHS256(secret, "junk-"+p.runID+"-"+strconv.Itoa(i), auth.MintOptions{Kid: kid})
		if err != nil {
			return err
		}
		p.junkToks = append(p.junkToks, tok)
	}
	// Enough orders for the attack's payments, and a tenth more.
	n := int(float64(set.payRate)*set.duration.Seconds()*1.1) + 10
	logf("junk_commands on %s: buying %d orders to pay", t.Name, n)
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for w := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				user := "payer-" + p.runID + "-" + strconv.Itoa(i)
				tok, err := auth.MintHS256(secret, user, auth.MintOptions{Kid: kid})
				if err != nil {
					continue
				}
				c := junkClient(payerSrc(w*50+i%50), 5*time.Second)
				st, b, _, err := call(c, "POST", base+"/v1/sales/"+set.sale+"/orders",
					map[string]string{"Authorization": "Bearer " + tok, "Content-Type": "application/json"}, []byte(`{"quantity":1}`))
				c.CloseIdleConnections()
				if err != nil || st != 202 {
					mu.Lock()
					p.seen["setup_buy_"+strconv.Itoa(st)]++
					mu.Unlock()
					continue
				}
				var r struct {
					OrderID string `json:"order_id"`
				}
				if json.Unmarshal(b, &r) != nil {
					continue
				}
				mu.Lock()
				p.orders = append(p.orders, paidOrder{id: r.OrderID, user: user, tok: tok})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	// Confirmed: a payment of a pending order is a 409 to retry, not what is measured.
	pending := p.orders
	deadline := time.Now().Add(60 * time.Second)
	for len(pending) > 0 && time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
		var still []paidOrder
		c := junkClient(payerSrc(9999), 5*time.Second)
		for _, o := range pending {
			st, b, _, err := call(c, "GET", base+"/v1/sales/"+set.sale+"/orders/"+o.id, map[string]string{"Authorization": "Bearer " + o.tok}, nil)
			if err != nil || st != 200 || !bytes.Contains(b, []byte(`"status":"confirmed"`)) {
				still = append(still, o)
			}
		}
		c.CloseIdleConnections()
		pending = still
	}
	confirmed := p.orders[:0]
	gone := map[string]bool{}
	for _, o := range pending {
		gone[o.id] = true
	}
	for _, o := range p.orders {
		if !gone[o.id] {
			confirmed = append(confirmed, o)
		}
	}
	p.orders = confirmed
	p.seen["setup_orders_confirmed"] = int64(len(p.orders))
	if len(p.orders) == 0 {
		return errors.New("junk_commands: no order to pay was confirmed")
	}
	logf("junk_commands on %s: %d orders confirmed", t.Name, len(p.orders))
	junkPrepared[t.Name] = p
	return nil
}

// madeUpID is an order id no one was given: a moment of the last minute, a node a gateway
// could hold, any sequence (docs/design.md §6: 41 bits of milliseconds, 10 of node, 12 of
// sequence). It passes every check of its form; only the buyer's own records can tell.
func madeUpID() uint64 {
	ms := uint64(time.Since(orderid.Epoch).Milliseconds()) - rand.Uint64N(60_000)
	return ms<<22 | rand.Uint64N(orderid.LeasedNodes)<<12 | rand.Uint64N(4096)
}

// junkCommands runs the attack: the junk cancels open-loop at --junk-rate from --junk-users
// accounts (an address each), and the payments open-loop at --pay-rate.
func junkCommands(ctx context.Context, t target) map[string]int64 {
	tl := newTally()
	p := junkPrepared[t.Name]
	if p == nil {
		tl.add("setup_failed", 1)
		<-ctx.Done()
		return tl.snapshot()
	}
	for k, v := range p.seen {
		tl.add(k, v)
	}
	base := "http://" + t.Addr
	clients := make([]*http.Client, len(p.junkToks))
	for i := range clients {
		clients[i] = junkClient(attackerSrc(i), 3*time.Second)
	}
	payer := junkClient(payServiceSrc, 5*time.Second)
	var inflight sync.WaitGroup
	var junkIn atomic.Int64
	const maxJunkInflight = 4000
	var lmu sync.Mutex
	var lat []time.Duration

	var loops sync.WaitGroup
	loops.Add(2)
	go func() { // the junk
		defer loops.Done()
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		start, sent := time.Now(), 0
		for ctx.Err() == nil {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			due := int(time.Since(start).Seconds() * float64(set.junkRate))
			for ; sent < due; sent++ {
				if junkIn.Load() >= maxJunkInflight {
					tl.add("junk_skipped_inflight", 1)
					continue
				}
				u := sent % len(clients)
				junkIn.Add(1)
				inflight.Add(1)
				go func() {
					defer inflight.Done()
					defer junkIn.Add(-1)
					url := base + "/v1/sales/" + set.sale + "/orders/" + strconv.FormatUint(madeUpID(), 10) + "/cancel"
					st, _, _, err := call(clients[u], "POST", url, map[string]string{"Authorization": "Bearer " + p.junkToks[u]}, nil)
					if err != nil {
						tl.add("junk_failed_"+errClass(err), 1)
						return
					}
					tl.add("junk_"+strconv.Itoa(st), 1)
				}()
			}
		}
	}()
	go func() { // the payments
		defer loops.Done()
		every := time.Second / time.Duration(set.payRate)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for i := 0; ctx.Err() == nil; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if i >= len(p.orders) {
				tl.add("pay_out_of_orders", 1)
				continue
			}
			o := p.orders[i]
			inflight.Add(1)
			go func() {
				defer inflight.Done()
				body := []byte(`{"order_id":"` + o.id + `","sale_id":"` + set.sale + `","payment_id":"pay-` + o.id +
					`","amount_cents":` + strconv.FormatInt(p.price, 10) + `}`)
				sig := auth.PaymentSignature(p.paySecs, time.Now(), body)
				st, b, d, err := call(payer, "POST", base+"/v1/payments",
					map[string]string{auth.PaymentHeader: sig, "Content-Type": "application/json"}, body)
				tl.add("pay_sent", 1)
				switch {
				case err != nil:
					tl.add("pay_failed_"+errClass(err), 1)
				case st != 200 || !bytes.Contains(b, []byte(`"status":"paid"`)):
					tl.add("pay_"+strconv.Itoa(st), 1)
				default:
					tl.add("pay_ok", 1)
				}
				lmu.Lock()
				lat = append(lat, d) // a failure counts at the time it took: it is in the p99
				lmu.Unlock()
			}()
		}
	}()
	loops.Wait()
	inflight.Wait()
	for _, c := range append(clients, payer) {
		c.CloseIdleConnections()
	}
	tl.add("pay_p50_ms", quantile(lat, 0.50).Milliseconds())
	tl.add("pay_p99_ms", ceilMS(quantile(lat, 0.99)))
	tl.add("pay_max_ms", ceilMS(quantile(lat, 1)))
	return tl.snapshot()
}

func ceilMS(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

// junkGoals are the junk attack's targets, per port it ran on: every payment paid, and their
// p99 under goalPayP99.
func junkGoals(r *results) []goal {
	var gs []goal
	for _, x := range r.Runs {
		if x.Attack != "junk_commands" {
			continue
		}
		sent, ok := x.Seen["pay_sent"], x.Seen["pay_ok"]
		var fails []string
		for k, v := range x.Seen {
			if strings.HasPrefix(k, "pay_") && k != "pay_sent" && k != "pay_ok" && !strings.HasSuffix(k, "_ms") {
				fails = append(fails, fmt.Sprintf("%s=%d", k, v))
			}
		}
		fig := fmt.Sprintf("%d of %d paid", ok, sent)
		if len(fails) > 0 {
			slices.Sort(fails)
			fig += " (" + strings.Join(fails, " ") + ")"
		}
		gs = append(gs,
			goal{"junk_pay_success_" + x.Port, fig, "100% of the payments beside 2,000 junk cancels/s", sent > 0 && ok == sent},
			goal{"junk_pay_p99_" + x.Port, fmt.Sprintf("%d ms (p50 %d ms, max %d ms)", x.Seen["pay_p99_ms"], x.Seen["pay_p50_ms"], x.Seen["pay_max_ms"]),
				fmt.Sprintf("< %d ms", goalPayP99.Milliseconds()), sent > 0 && time.Duration(x.Seen["pay_p99_ms"])*time.Millisecond < goalPayP99})
	}
	return gs
}

// goalPayP99 is the payments' p99 the junk attack must leave.
const goalPayP99 = 500 * time.Millisecond
