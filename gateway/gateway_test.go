package gateway

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/auth"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

type env struct {
	t   testing.TB
	cfg config.Config
	g   *Gateway
	rc  rueidis.Client
	url string
}

func start(t testing.TB, mut ...func(*config.Config)) *env {
	t.Helper()
	cfg := testenv.Config(t)
	for _, m := range mut {
		m(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g, clients, err := dialAndStart(ctx, cfg)
	if err != nil {
		t.Fatalf("start gateway: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := g.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		clients.Close()
	})
	return &env{t: t, cfg: cfg, g: g, rc: testenv.Redis(t, cfg.Redis.Addrs), url: "http://" + g.Addr()}
}

// sale warms a sale in Redis and puts it in the gateway's cache.
func (e *env) sale(mut func(*flashgate.Sale)) *flashgate.Sale {
	e.t.Helper()
	now := time.Now()
	s := &flashgate.Sale{ID: testenv.ID("gw"), Title: "t", PriceCents: 100, Total: 10,
		StartsAt: now.Add(-time.Minute), EndsAt: now.Add(time.Hour), PerUserLimit: 2, PerOrderMax: 2}
	if mut != nil {
		mut(s)
	}
	if err := s.Validate(); err != nil {
		e.t.Fatalf("sale: %v", err)
	}
	rem := map[string]int64{"": s.Total}
	if len(s.Regions) > 0 {
		rem = s.Regions
	}
	if _, err := lua.Load().Warm(context.Background(), e.rc, s, rem); err != nil {
		e.t.Fatalf("warm: %v", err)
	}
	e.g.sales.put(s)
	return s
}

func (e *env) token(user string) string {
	e.t.Helper()
	tok, err := auth.MintHS256(e.cfg.Auth.JWTSecret, user, auth.MintOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return tok
}

type reply struct {
	Status     int
	Code       string `json:"code"`
	Message    string `json:"message"`
	OrderID    string `json:"order_id"`
	State      string `json:"status"`
	RetryAfter string
	Raw        []byte
}

func (e *env) do(method, path, token string, body []byte, hdr map[string]string) reply {
	e.t.Helper()
	req, _ := http.NewRequest(method, e.url+path, bytes.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	r := reply{Status: res.StatusCode, RetryAfter: res.Header.Get("Retry-After"), Raw: raw}
	if err := json.Unmarshal(raw, &r); err != nil {
		e.t.Fatalf("%s %s: body %q is not JSON: %v", method, path, raw, err)
	}
	return r
}

func (e *env) buy(s *flashgate.Sale, token, body string, hdr map[string]string) reply {
	return e.do("POST", "/v1/sales/"+s.ID+"/orders", token, []byte(body), hdr)
}

// stock is the sale's remaining units and open reservations in Redis.
func (e *env) stock(s *flashgate.Sale) (int64, int) {
	e.t.Helper()
	k := lua.KeysFor(s.ID, s.RegionNames())
	rem, err := lua.Remaining(context.Background(), e.rc, k)
	if err != nil {
		e.t.Fatal(err)
	}
	resv, err := lua.Reservations(context.Background(), e.rc, k)
	if err != nil {
		e.t.Fatal(err)
	}
	var n int64
	for _, v := range rem {
		n += v
	}
	return n, len(resv)
}

func rawToken(header, claims map[string]any, secret string) string {
	enc := func(v any) string {
		b, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	if secret == "" {
		return enc(header) + "." + enc(claims) + "."
	}
	tok := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims(claims))
	s, _ := tok.SignedString([]byte(secret))
	return s
}

func TestPurchaseRefusalsReserveNothing(t *testing.T) {
	e := start(t)
	s := e.sale(nil)
	regional := e.sale(func(s *flashgate.Sale) { s.Regions = map[string]int64{"bj": 6, "sh": 4} })
	good := e.token("alice")
	exp := time.Now().Add(time.Hour).Unix()
	expired, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "alice", "exp": time.Now().Add(-time.Hour).Unix()}).SignedString([]byte(e.cfg.Auth.JWTSecret))
	noneTok := rawToken(map[string]any{"alg": "none", "typ": "JWT"}, map[string]any{"sub": "alice", "exp": exp}, "")
	hs512, _ := jwt.NewWithClaims(jwt.SigningMethodHS512, jwt.MapClaims{"sub": "alice", "exp": exp}).SignedString([]byte(e.cfg.Auth.JWTSecret))
	wrongKey := rawToken(map[string]any{"alg": "HS256"}, map[string]any{"sub": "alice", "exp": exp}, "not-the-secret")
	badSub := rawToken(map[string]any{"alg": "HS256"}, map[string]any{"sub": "a b", "exp": exp}, e.cfg.Auth.JWTSecret)
	noExp := rawToken(map[string]any{"alg": "HS256"}, map[string]any{"sub": "alice"}, e.cfg.Auth.JWTSecret)
	nowS := time.Now().Unix()
	tooLong := rawToken(map[string]any{"alg": "HS256"}, map[string]any{"sub": "alice", "iat": nowS, "exp": nowS + 48*3600}, e.cfg.Auth.JWTSecret)
	fromFuture := rawToken(map[string]any{"alg": "HS256"}, map[string]any{"sub": "alice", "iat": nowS + 120, "exp": exp}, e.cfg.Auth.JWTSecret)
	unknownKid, _ := auth.MintHS256(e.cfg.Auth.JWTSecret, "alice", auth.MintOptions{Kid: "nope"})

	cases := []struct {
		name   string
		sale   *flashgate.Sale
		path   string
		token  string
		body   string
		hdr    map[string]string
		status int
		code   flashgate.Code
	}{
		{"bad json", s, "", good, `{"quantity":`, nil, 400, flashgate.CodeInvalidRequest},
		{"not an object", s, "", good, `[1]`, nil, 400, flashgate.CodeInvalidRequest},
		{"unknown field", s, "", good, `{"quantity":1,"price":0}`, nil, 400, flashgate.CodeInvalidRequest},
		{"duplicate field", s, "", good, `{"quantity":1,"quantity":1}`, nil, 400, flashgate.CodeInvalidRequest},
		{"quantity 0", s, "", good, `{"quantity":0}`, nil, 400, flashgate.CodeInvalidRequest},
		{"quantity -1", s, "", good, `{"quantity":-1}`, nil, 400, flashgate.CodeInvalidRequest},
		{"quantity 10^12", s, "", good, `{"quantity":1000000000000}`, nil, 400, flashgate.CodeInvalidRequest},
		{"quantity 10^30", s, "", good, `{"quantity":1000000000000000000000000000000}`, nil, 400, flashgate.CodeInvalidRequest},
		{"quantity over per_order_max", s, "", good, `{"quantity":3}`, nil, 400, flashgate.CodeInvalidRequest},
		{"quantity fraction", s, "", good, `{"quantity":1.5}`, nil, 400, flashgate.CodeInvalidRequest},
		{"quantity string", s, "", good, `{"quantity":"1"}`, nil, 400, flashgate.CodeInvalidRequest},
		{"trailing garbage", s, "", good, `{"quantity":1} x`, nil, 400, flashgate.CodeInvalidRequest},
		{"region on a sale without regions", s, "", good, `{"region":"bj"}`, nil, 400, flashgate.CodeInvalidRequest},
		{"unknown region", regional, "", good, `{"region":"gz"}`, nil, 400, flashgate.CodeInvalidRequest},
		{"missing region", regional, "", good, `{}`, nil, 400, flashgate.CodeInvalidRequest},
		{"region not UTF-8", regional, "", good, "{\"region\":\"\x80\"}", nil, 400, flashgate.CodeInvalidRequest},
		{"address not UTF-8", s, "", good, "{\"address\":\"\xff 1 Main St\"}", nil, 400, flashgate.CodeInvalidRequest},
		{"escaped address not UTF-8", s, "", good, "{\"address\":\"\\t\xc3\"}", nil, 400, flashgate.CodeInvalidRequest},
		{"huge body", s, "", good, `{"quantity":1,"region":"` + strings.Repeat("x", 1<<20) + `"}`, nil, 413, flashgate.CodeBodyTooLarge},
		{"no token", s, "", "", `{}`, nil, 401, flashgate.CodeUnauthorized},
		{"malformed token", s, "", "abc.def", `{}`, nil, 401, flashgate.CodeUnauthorized},
		{"bad signature", s, "", wrongKey, `{}`, nil, 401, flashgate.CodeUnauthorized},
		{"expired token", s, "", expired, `{}`, nil, 401, flashgate.CodeUnauthorized},
		{"alg none", s, "", noneTok, `{}`, nil, 401, flashgate.CodeUnauthorized},
		{"alg HS512", s, "", hs512, `{}`, nil, 401, flashgate.CodeUnauthorized},
		{"bad sub", s, "", badSub, `{}`, nil, 401, flashgate.CodeUnauthorized},
		{"no exp", s, "", noExp, `{}`, nil, 401, flashgate.CodeUnauthorized},
		{"lifetime over 24h", s, "", tooLong, `{}`, nil, 401, flashgate.CodeUnauthorized},
		{"issued 2 min ahead", s, "", fromFuture, `{}`, nil, 401, flashgate.CodeUnauthorized},
		{"unknown kid", s, "", unknownKid, `{}`, nil, 401, flashgate.CodeUnauthorized},
		{"unknown sale", s, "/v1/sales/nosuchsale/orders", good, `{}`, nil, 404, flashgate.CodeSaleNotFound},
		{"idempotency key too long", s, "", good, `{}`, map[string]string{"Idempotency-Key": strings.Repeat("k", 65)}, 400, flashgate.CodeInvalidRequest},
		{"idempotency key bad chars", s, "", good, `{}`, map[string]string{"Idempotency-Key": "a/b"}, 400, flashgate.CodeInvalidRequest},
		{"idempotency key not ASCII", s, "", good, `{}`, map[string]string{"Idempotency-Key": "k\xc3\xa9"}, 400, flashgate.CodeInvalidRequest},
		{"idempotency key not UTF-8", s, "", good, `{}`, map[string]string{"Idempotency-Key": "k\xff"}, 400, flashgate.CodeInvalidRequest},
		{"idempotency key empty", s, "", good, `{}`, map[string]string{"Idempotency-Key": ""}, 400, flashgate.CodeInvalidRequest},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before, _ := e.stock(c.sale)
			path := c.path
			if path == "" {
				path = "/v1/sales/" + c.sale.ID + "/orders"
			}
			hdr := c.hdr
			if c.name == "huge body" {
				// Only the headers, declaring the body: the gateway answers before
				// reading it and closes; a client still sending 1 MiB could see its
				// write reset before it reads the 413.
				raw := "POST " + path + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + good +
					"\r\nContent-Type: application/json\r\nContent-Length: 1048576\r\n\r\n"
				res, err := http.ReadResponse(bufioReader(t, e.g.Addr(), raw), nil)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(res.Body)
				res.Body.Close()
				var r reply
				_ = json.Unmarshal(body, &r)
				if res.StatusCode != c.status || r.Code != string(c.code) || r.Message == "" {
					t.Fatalf("got %d %s, want %d %q", res.StatusCode, body, c.status, c.code)
				}
			} else if c.name == "idempotency key empty" {
				// net/http drops empty headers; send it raw.
				r := rawPost(t, e.g.Addr(), path, good, "Idempotency-Key: \r\n")
				if r.Status != c.status || r.Code != string(c.code) {
					t.Fatalf("got %d %q, want %d %q", r.Status, r.Code, c.status, c.code)
				}
			} else {
				r := e.do("POST", path, c.token, []byte(c.body), hdr)
				if r.Status != c.status || r.Code != string(c.code) || r.Message == "" {
					t.Fatalf("got %d %q %q, want %d %q", r.Status, r.Code, r.Message, c.status, c.code)
				}
			}
			after, resv := e.stock(c.sale)
			if after != before || resv != 0 {
				t.Fatalf("stock %d -> %d, %d reservations: a refusal reserved something", before, after, resv)
			}
		})
	}
}

func rawPost(t *testing.T, addr, path, token, extra string) reply {
	t.Helper()
	req := "POST " + path + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token + "\r\n" + extra + "Content-Length: 2\r\nConnection: close\r\n\r\n{}"
	res, err := http.ReadResponse(bufioReader(t, addr, req), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	r := reply{Status: res.StatusCode}
	_ = json.Unmarshal(raw, &r)
	return r
}

func TestPurchaseAcceptedAndOrderLookup(t *testing.T) {
	e := start(t)
	s := e.sale(nil)
	// Rebuilt before the purchases, as a backend's warm does: the buyers'
	// records decide newer ids (orderids.go); older ones are MySQL's.
	rebuilt := time.Now().Add(-40 * time.Second)
	e.stampRebuilt(s, rebuilt)
	id123 := strconv.FormatUint(mkID(rebuilt.Add(-10*time.Second), 7, 123), 10)
	id124 := strconv.FormatUint(mkID(rebuilt.Add(-10*time.Second), 7, 124), 10)
	alice, bob := e.token("alice"), e.token("bob")

	r := e.buy(s, alice, `{"quantity":2}`, nil)
	if r.Status != 202 || r.Code != "accepted" || r.State != "pending" || r.OrderID == "" {
		t.Fatalf("purchase: %d %s", r.Status, r.Raw)
	}
	if rem, resv := e.stock(s); rem != 8 || resv != 1 {
		t.Fatalf("after purchase: remaining %d reservations %d, want 8 and 1", rem, resv)
	}
	// The order is in JetStream, with its id as Nats-Msg-Id.
	msg := e.fetchOne(s)
	if got := msg.Headers().Get("Nats-Msg-Id"); got != r.OrderID {
		t.Fatalf("Nats-Msg-Id %q, want %q", got, r.OrderID)
	}
	var m struct {
		ID   string `json:"id"`
		User string `json:"user"`
		Qty  int64  `json:"qty"`
	}
	if err := json.Unmarshal(msg.Data(), &m); err != nil || m.ID != r.OrderID || m.User != "alice" || m.Qty != 2 {
		t.Fatalf("message %s (%v)", msg.Data(), err)
	}

	path := "/v1/sales/" + s.ID + "/orders/" + r.OrderID
	got := e.do("GET", path, alice, nil, nil)
	var view orderView
	_ = json.Unmarshal(got.Raw, &view)
	if got.Status != 200 || view.OrderID != r.OrderID || view.UserID != "alice" || view.Quantity != 2 || view.Status != "pending" ||
		view.ExpiresAt.Sub(view.CreatedAt) != e.cfg.Orders.PaymentTimeout {
		t.Fatalf("owner GET: %d %s", got.Status, got.Raw)
	}
	if got := e.do("GET", path, bob, nil, nil); got.Status != 404 {
		t.Fatalf("other user GET: %d %s, want 404", got.Status, got.Raw)
	}
	if got := e.do("GET", path, "", nil, nil); got.Status != 401 {
		t.Fatalf("anonymous GET: %d, want 401", got.Status)
	}
	// An order Redis does not know is MySQL's to answer (Redis may have lost
	// it): no backend answering is 503, never a guess; a backend's "no such
	// order" is 404, its order is 200.
	if got := e.do("GET", "/v1/sales/"+s.ID+"/orders/"+id123, alice, nil, nil); got.Status != 503 {
		t.Fatalf("missing order, no backend: %d, want 503", got.Status)
	}
	stub := testenv.NATS(t)
	sub, err := bus.ServeCommands(stub, e.cfg.NATS, func(cmd bus.OrderCommand) bus.OrderReply {
		if cmd.Op == bus.CmdGet && strconv.FormatUint(cmd.OrderID, 10) == id124 && cmd.UserID == "alice" {
			return bus.OrderReply{Code: bus.ReplyOK, Status: "confirmed", Quantity: 1}
		}
		return bus.OrderReply{Code: string(flashgate.CodeOrderNotFound)}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := stub.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := e.do("GET", "/v1/sales/"+s.ID+"/orders/"+id123, alice, nil, nil); got.Status != 404 {
		t.Fatalf("missing order: %d, want 404", got.Status)
	}
	if got := e.do("GET", "/v1/sales/"+s.ID+"/orders/"+id124, alice, nil, nil); got.Status != 200 || got.State != "confirmed" {
		t.Fatalf("order only MySQL holds: %d %s, want 200 confirmed", got.Status, got.Raw)
	}

	// Limit: alice holds 2 of 2.
	if r := e.buy(s, alice, `{}`, nil); r.Status != 403 || r.Code != "limit_reached" {
		t.Fatalf("over limit: %d %s", r.Status, r.Raw)
	}
	// The public sale view.
	info := e.do("GET", "/v1/sales/"+s.ID, "", nil, nil)
	if info.Status != 200 || !bytes.Contains(info.Raw, []byte(`"state":"active"`)) {
		t.Fatalf("sale info: %d %s", info.Status, info.Raw)
	}
}

// fetchOne reads the next order message of the sale from the test's stream.
func (e *env) fetchOne(s *flashgate.Sale) jetstream.Msg {
	e.t.Helper()
	js, _ := jetstream.New(testenv.NATS(e.t))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cons, err := js.CreateOrUpdateConsumer(ctx, e.cfg.NATS.Stream, jetstream.ConsumerConfig{
		Durable: "peek", FilterSubject: e.cfg.NATS.OrderSubject + "." + s.ID, AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		e.t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(3*time.Second))
	if err != nil {
		e.t.Fatal(err)
	}
	for m := range batch.Messages() {
		return m
	}
	e.t.Fatalf("no message in the stream: %v", batch.Error())
	return nil
}

func TestSoldOutAndWindow(t *testing.T) {
	e := start(t)
	s := e.sale(func(s *flashgate.Sale) { s.Total, s.PerUserLimit, s.PerOrderMax = 2, 1, 1 })
	for i, want := range []int{202, 202, 409, 409} {
		r := e.buy(s, e.token("u"+strconv.Itoa(i)), `{}`, nil)
		if r.Status != want {
			t.Fatalf("buyer %d: %d %s, want %d", i, r.Status, r.Raw, want)
		}
	}
	if rem, _ := e.stock(s); rem != 0 {
		t.Fatalf("remaining %d, want 0", rem)
	}

	later := e.sale(func(s *flashgate.Sale) {
		s.StartsAt, s.EndsAt = time.Now().Add(90*time.Second), time.Now().Add(time.Hour)
	})
	r := e.buy(later, e.token("u"), `{}`, nil)
	if r.Status != 425 || r.Code != "not_started" || r.RetryAfter == "" {
		t.Fatalf("before start: %d %s Retry-After %q", r.Status, r.Raw, r.RetryAfter)
	}
	if secs, _ := strconv.Atoi(r.RetryAfter); secs < 85 || secs > 91 {
		t.Fatalf("Retry-After %q, want about 90", r.RetryAfter)
	}
	ended := e.sale(func(s *flashgate.Sale) {
		s.StartsAt, s.EndsAt = time.Now().Add(-time.Hour), time.Now().Add(-time.Second)
	})
	if r := e.buy(ended, e.token("u"), `{}`, nil); r.Status != 410 || r.Code != "ended" {
		t.Fatalf("after end: %d %s", r.Status, r.Raw)
	}
	// Closed by an operator (Redis says so even before the event arrives).
	closed := e.sale(nil)
	if err := lua.Close(context.Background(), e.rc, lua.KeysFor(closed.ID, nil)); err != nil {
		t.Fatal(err)
	}
	if r := e.buy(closed, e.token("u"), `{}`, nil); r.Status != 410 || r.Code != "ended" {
		t.Fatalf("closed: %d %s", r.Status, r.Raw)
	}
}

func TestNotWarmedIsUnavailableNeverSoldOut(t *testing.T) {
	e := start(t)
	s := e.sale(nil)
	k := lua.KeysFor(s.ID, nil)
	if err := e.rc.Do(context.Background(), e.rc.B().Del().Key(k.Meta).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	r := e.buy(s, e.token("u"), `{}`, nil)
	if r.Status != 503 || r.Code != "unavailable" || r.RetryAfter == "" {
		t.Fatalf("not warmed: %d %s", r.Status, r.Raw)
	}
	if rem, resv := e.stock(s); rem != s.Total || resv != 0 {
		t.Fatalf("not warmed reserved something: remaining %d, %d reservations", rem, resv)
	}
}

func TestIdempotencyKeyReplays(t *testing.T) {
	e := start(t)
	s := e.sale(func(s *flashgate.Sale) { s.PerUserLimit, s.PerOrderMax = 5, 1 })
	alice := e.token("alice")
	hdr := map[string]string{"Idempotency-Key": "key-1"}

	const n = 20
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := e.buy(s, alice, `{}`, hdr)
			if r.Status != 202 {
				t.Errorf("replay %d: %d %s", i, r.Status, r.Raw)
			}
			ids[i] = r.OrderID
		}()
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] {
			t.Fatalf("concurrent replays answered different ids: %v", ids)
		}
	}
	if rem, resv := e.stock(s); rem != s.Total-1 || resv != 1 {
		t.Fatalf("remaining %d reservations %d: a replay reserved again", rem, resv)
	}
	// Another user's identical key is a different purchase.
	if r := e.buy(s, e.token("bob"), `{}`, hdr); r.Status != 202 || r.OrderID == ids[0] {
		t.Fatalf("bob with alice's key: %d %s", r.Status, r.Raw)
	}
	// A new key is a new purchase.
	if r := e.buy(s, alice, `{}`, map[string]string{"Idempotency-Key": "key-2"}); r.Status != 202 || r.OrderID == ids[0] {
		t.Fatalf("new key: %d %s", r.Status, r.Raw)
	}
}

func TestFailedPublishReleasesAndAnswers503(t *testing.T) {
	e := start(t)
	s := e.sale(nil)
	// Take the stream away: JetStream has no responder for the subject.
	js, _ := jetstream.New(testenv.NATS(t))
	if err := js.DeleteStream(context.Background(), e.cfg.NATS.Stream); err != nil {
		t.Fatal(err)
	}
	hdr := map[string]string{"Idempotency-Key": "retry-me"}
	r := e.buy(s, e.token("alice"), `{}`, hdr)
	if r.Status != 503 || r.Code != "unavailable" || r.RetryAfter == "" {
		t.Fatalf("publish without a stream: %d %s", r.Status, r.Raw)
	}
	if rem, resv := e.stock(s); rem != s.Total || resv != 0 {
		t.Fatalf("failed publish kept a reservation: remaining %d, %d reservations", rem, resv)
	}
	users, err := e.rc.Do(context.Background(), e.rc.B().Hlen().Key(lua.KeysFor(s.ID, nil).Users).Build()).AsInt64()
	if err != nil || users != 0 {
		t.Fatalf("user counter kept after release: %d %v", users, err)
	}
	// With the stream back, the same key is a fresh purchase that succeeds.
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: e.cfg.NATS.Stream,
		Subjects: []string{e.cfg.NATS.OrderSubject + ".>"}, Retention: jetstream.WorkQueuePolicy, Duplicates: 2 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	if r := e.buy(s, e.token("alice"), `{}`, hdr); r.Status != 202 {
		t.Fatalf("retry after the stream is back: %d %s", r.Status, r.Raw)
	}
}

func TestShutdownDrainsInFlight(t *testing.T) {
	e := start(t)
	s := e.sale(func(s *flashgate.Sale) { s.Total, s.PerUserLimit, s.PerOrderMax = 1000, 1, 1 })
	var wg sync.WaitGroup
	results := make(chan int, 200)
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("POST", e.url+"/v1/sales/"+s.ID+"/orders", strings.NewReader(`{}`))
			req.Header.Set("Authorization", "Bearer "+e.token("u"+strconv.Itoa(i)))
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				results <- 0 // refused after the listener closed: never admitted
				return
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			results <- res.StatusCode
		}()
	}
	time.Sleep(20 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.g.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	wg.Wait()
	close(results)
	var ok int64
	for st := range results {
		if st == 202 {
			ok++
		} else if st != 0 && st != 503 {
			t.Errorf("status %d during shutdown", st)
		}
	}
	rem, resv := e.stock(s)
	// Every 202 is a reservation, and every reservation got its 202.
	if s.Total-rem != ok || int64(resv) != ok {
		t.Fatalf("%d accepted, but stock moved by %d with %d reservations", ok, s.Total-rem, resv)
	}
}

// TestTimedOutAdmissionReservesNothing stalls Redis (DEBUG SLEEP) so that the
// gateway gives up on an admission Redis runs later: the 503 must leave no
// reservation behind.
func TestTimedOutAdmissionReservesNothing(t *testing.T) {
	e := start(t, func(c *config.Config) { c.Gateway.AdmitTimeout = 100 * time.Millisecond })
	s := e.sale(nil)
	other := testenv.Redis(t, e.cfg.Redis.Addrs)
	stalled := make(chan error, 1)
	go func() {
		stalled <- other.Do(context.Background(), other.B().Arbitrary("DEBUG", "SLEEP").Args("0.5").Build()).Error()
	}()
	time.Sleep(50 * time.Millisecond) // let the sleep reach Redis first
	r := e.buy(s, e.token("alice"), `{}`, nil)
	if err := <-stalled; err != nil {
		t.Fatalf("DEBUG SLEEP: %v (the stack runs Redis with enable-debug-command local)", err)
	}
	if r.Status != 503 || r.Code != "unavailable" {
		t.Fatalf("stalled Redis: %d %s, want 503", r.Status, r.Raw)
	}
	// The undo runs behind the 503; wait (for liveness, not speed) until it has.
	deadline := time.Now().Add(10 * time.Second)
	for {
		rem, resv := e.stock(s)
		if rem == s.Total && resv == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a timed-out admission kept stock: remaining %d, %d reservations", rem, resv)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
