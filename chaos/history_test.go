package chaos

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/audit"
	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/history"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/loadgen"
	"github.com/flashgate/flashgate/mysql"
)

// Every scenario's history: what its clients saw (every purchase, cancel,
// pay and read, with its answer), recorded as the floods go, and checked by
// package history against what the system ended with each time the scenario
// settles a sale (docs/history.md). The report's history line sums the last
// check of every sale.

// epoch is the origin of the recorded calls' times: one monotonic clock for
// every recorder of the test binary.
var epoch = time.Now()

func nanos(t time.Time) int64 { return t.Sub(epoch).Nanoseconds() }

// recorder is one stack's history, by sale.
type recorder struct {
	mu    sync.Mutex
	ops   map[string][]history.Op
	specs map[string]*history.Sale
}

// sale notes a sale's spec as created: its limits from the start.
func (r *recorder) sale(s *flashgate.Sale) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.specs == nil {
		r.specs = map[string]*history.Sale{}
	}
	r.specs[s.ID] = &history.Sale{ID: s.ID, Total: s.Total, Regions: s.Regions,
		Limits: []history.Limits{{PerUserLimit: s.PerUserLimit, Limits: s.Limits}}}
}

// limitsChanged notes a PATCH of the sale's limits: asked at from, answered
// at until.
func (r *recorder) limitsChanged(sale string, from, until time.Time, perUser int64, limits []flashgate.Limit) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.specs[sale]
	if limits == nil {
		limits = s.Limits[len(s.Limits)-1].Limits
	}
	s.Limits = append(s.Limits, history.Limits{From: from, Until: until, PerUserLimit: perUser, Limits: limits})
}

// totalChanged notes a PATCH of the sale's total.
func (r *recorder) totalChanged(sale string, total int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.specs[sale].Total = total
}

func (r *recorder) add(sale string, ops ...history.Op) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ops == nil {
		r.ops = map[string][]history.Op{}
	}
	r.ops[sale] = append(r.ops[sale], ops...)
}

// calls records a loadgen run's requests: names are the users of its tokens,
// qty and region what each asked.
func (r *recorder) calls(sale string, names []string, qty int64, region string, calls []loadgen.Call) {
	ops := make([]history.Op, len(calls))
	for i, c := range calls {
		ops[i] = history.Op{Kind: history.Purchase, User: names[c.User], Key: c.Key, Quantity: qty, Region: region,
			Order: c.Order, Status: c.Status, Code: c.Code, Call: nanos(c.Sent), Return: nanos(c.Answered)}
	}
	r.add(sale, ops...)
}

// Every sale's last check, for the report's history line.
var (
	historyMu  sync.Mutex
	historyBy  = map[string]history.Result{}
	historyErr int
)

// historyLine is the report's line: operations and orders checked over
// every sale's last check, and the anomalies found.
func historyLine() string {
	historyMu.Lock()
	defer historyMu.Unlock()
	var ops, orders, anomalies int
	for _, r := range historyBy {
		ops, orders, anomalies = ops+r.Operations, orders+r.Orders, anomalies+len(r.Anomalies)
	}
	line := fmt.Sprintf("history: %d operations, %d orders checked, %d anomalies", ops, orders, anomalies)
	if historyErr > 0 {
		line += fmt.Sprintf(" (and %d sales whose state at rest could not be read)", historyErr)
	}
	return line
}

// streamDrain bounds the wait for the orders stream to hold none of the
// sale's messages once the audit holds: the backend acks a message after it
// wrote its batch.
const streamDrain = 30 * time.Second

// checkHistory reads what the system ended with for sale and checks the
// clients' history against it; every anomaly fails the scenario.
func (st *stack) checkHistory(db *sql.DB, rc rueidis.Client, sale string) {
	st.t.Helper()
	st.hist.mu.Lock()
	spec := st.hist.specs[sale]
	ops := append([]history.Op(nil), st.hist.ops[sale]...)
	st.hist.mu.Unlock()
	if spec == nil {
		st.t.Errorf("history: sale %s was never noted (st.hist.sale)", sale)
		return
	}
	final, err := st.finalState(db, rc, sale, spec)
	if err != nil {
		st.t.Errorf("history: reading sale %s at rest: %v", sale, err)
		historyMu.Lock()
		historyErr++
		historyMu.Unlock()
		return
	}
	res := history.Check(*spec, ops, final, st.allow)
	historyMu.Lock()
	historyBy[sale] = res
	historyMu.Unlock()
	st.t.Logf("history: %s (accepted %d, allowed: failed 202s %d, unexplained %d; messages of decided orders still in the stream %d)",
		res.Summary(), res.Accepted, res.FailedAccepted, res.Unexplained, res.InStreamDecided)
	for i, a := range res.Anomalies {
		if i == 20 {
			st.t.Errorf("history: … and %d more anomalies", len(res.Anomalies)-i)
			break
		}
		st.t.Errorf("history: sale %s: %s", sale, a)
	}
}

// finalState reads the sale at rest: MySQL's rows and sold, the Redis
// ledger, and the stream's messages of the sale (awaited, bounded, to be
// none: a message left is reported by the checker).
func (st *stack) finalState(db *sql.DB, rc rueidis.Client, sale string, spec *history.Sale) (history.Final, error) {
	var f history.Final
	in, err := st.streamWait(sale)
	if err != nil {
		return f, fmt.Errorf("the orders stream: %w", err)
	}
	f.InStream = in
	ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
	defer cancel()
	if err := mysql.EachOrder(ctx, db, sale, func(o flashgate.Order) error {
		f.Orders = append(f.Orders, o)
		return nil
	}); err != nil {
		return f, err
	}
	if f.Sold, err = mysql.SaleSold(ctx, db, sale); err != nil {
		return f, err
	}
	regions := make([]string, 0, len(spec.Regions))
	for r := range spec.Regions {
		regions = append(regions, r)
	}
	red, err := audit.RedisLedger(ctx, rc, sale, regions)
	if err != nil {
		return f, err
	}
	f.RedisRemaining, f.RedisReserved = red.Remaining, red.Reserved
	return f, nil
}

// streamWait waits (bounded by streamDrain) until the orders stream holds no
// message of sale, and returns the order ids of those still there then.
func (st *stack) streamWait(sale string) ([]uint64, error) {
	nc, err := nats.Connect(st.cfg.NATS.URL, testenv.NATSOptions(nats.Timeout(3*time.Second))...)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(streamDrain)
	for {
		ids, err := streamOrders(js, st.cfg.NATS.Stream, bus.OrderSubject(st.cfg.NATS, sale), sale)
		if err == nil && len(ids) == 0 {
			return nil, nil
		}
		if time.Now().After(deadline) {
			return ids, err
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// streamOrders reads the ids of sale's order messages in the stream without
// consuming them.
func streamOrders(js jetstream.JetStream, stream, subject, sale string) ([]uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return nil, err
	}
	if info.State.Subjects[subject] == 0 {
		return nil, nil
	}
	var ids []uint64
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return ids, err
		}
		if o, err := bus.DecodeOrder(m.Data); err == nil && o.SaleID == sale {
			ids = append(ids, o.ID)
		}
		seq = m.Sequence + 1
	}
	return ids, nil
}

// buy is one purchase of b through addr, recorded.
func (st *stack) buy(addr, sale string, b *buyer) answer {
	sent := time.Now()
	a := buy(addr, sale, b)
	st.hist.add(sale, history.Op{Kind: history.Purchase, User: b.user, Key: b.key, Quantity: 1, Order: a.order,
		Status: a.status, Code: a.code, Call: nanos(sent), Return: nanos(time.Now())})
	return a
}

// orderCall is a buyer's cancel, pay (op) or read ("") of their order
// through addr, recorded; it returns the answer's status, code and state.
func (st *stack) orderCall(addr, sale, user, tok string, order uint64, op string) (int, string, string) {
	kind, method, path := history.Read, "GET", "/v1/sales/"+sale+"/orders/"+strconv.FormatUint(order, 10)
	switch op {
	case "cancel":
		kind, method, path = history.Cancel, "POST", path+"/cancel"
	case "pay":
		kind, method, path = history.Pay, "POST", path+"/pay"
	}
	req, _ := http.NewRequest(method, "http://"+addr+path, nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	sent := time.Now()
	var status int
	var body struct {
		Code   string `json:"code"`
		Status string `json:"status"`
		Reason string `json:"reason"`
	}
	if res, err := buyClient.Do(req); err == nil {
		raw, _ := io.ReadAll(res.Body)
		res.Body.Close()
		status = res.StatusCode
		_ = json.Unmarshal(raw, &body)
	}
	state := ""
	if status == 200 {
		state = history.State(flashgate.OrderStatus(body.Status), body.Reason)
	}
	st.hist.add(sale, history.Op{Kind: kind, User: user, Order: order, Status: status, Code: body.Code, State: state,
		Call: nanos(sent), Return: nanos(time.Now())})
	return status, body.Code, state
}

// patchSale changes a sale's spec through the admin API, noting limits and
// total it changes in the history; it returns the status and body.
func (st *stack) patchSale(sale string, patch map[string]any) (int, []byte) {
	st.t.Helper()
	from := time.Now()
	code, b := st.admin("PATCH", "/admin/v1/sales/"+sale, patch)
	if code != 200 {
		return code, b
	}
	var got flashgate.Sale
	if err := json.Unmarshal(b, &got); err != nil {
		st.t.Fatalf("PATCH answer %s: %v", b, err)
	}
	// Gateways learn the new spec by an event and their refresh; Redis
	// decides by its own copy, changed before the answer. An order admitted
	// up to a second after the answer may still have met the old limits in
	// a gateway's own checks, and is judged by the looser.
	until := time.Now().Add(time.Second)
	if _, ok := patch["per_user_limit"]; ok || patch["limits"] != nil {
		st.hist.limitsChanged(sale, from, until, got.PerUserLimit, got.Limits)
	}
	if _, ok := patch["total"]; ok {
		st.hist.totalChanged(sale, got.Total)
	}
	return code, b
}

// tokenOf mints user's token.
func (st *stack) tokenOf(user string) string {
	st.t.Helper()
	tok, err := auth.MintHS256(st.cfg.Auth.JWTSecret, user, auth.MintOptions{})
	if err != nil {
		st.t.Fatal(err)
	}
	return tok
}

// historyOK reports whether sale's last check found no anomaly (false if
// it never ran).
func historyOK(sale string) bool {
	historyMu.Lock()
	defer historyMu.Unlock()
	r, ok := historyBy[sale]
	return ok && r.OK()
}
