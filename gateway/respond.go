package gateway

import (
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/flashgate/flashgate"
)

var (
	ctJSON        = []byte("application/json")
	hdrRetryAfter = []byte("Retry-After")
	one           = []byte("1")
	// X-Accel-Expires lets nginx keep a sold-out 409 and answer the sale's
	// next purchases itself (nginx/nginx.conf, the orders location;
	// docs/edge.md). nginx takes the header off before the client sees it.
	hdrAccelExpires = []byte("X-Accel-Expires")
)

// soldOut answers 409 sold_out for a sale (or region) marked sold out. Once
// the whole sale is (every region of it), it is the one answer an nginx in
// front may repeat without asking: nginx keys its copy by the sale's path
// alone, never by the body that names a region. X-Accel-Expires
// "@<unix second>" keeps nginx's copy until the end of the current second
// (nginx's cache counts whole seconds: a relative "1" would let a copy live up
// to two), so a copy is less than a second old when a restock clears the mark.
// Every other answer is left uncacheable.
func soldOut(ctx *fasthttp.RequestCtx, s *sale, now time.Time) {
	fail(ctx, fasthttp.StatusConflict, flashgate.CodeSoldOut, "sold out")
	if !s.allSoldOut() {
		return
	}
	var buf [24]byte
	b := append(buf[:0], '@')
	ctx.Response.Header.SetBytesKV(hdrAccelExpires, strconv.AppendInt(b, now.Unix(), 10))
}

// fail writes a docs/design.md §3 error body. Every message is ours (ASCII), but
// it is escaped anyway so the body stays valid JSON whatever a caller passes.
func fail(ctx *fasthttp.RequestCtx, status int, code flashgate.Code, msg string) {
	ctx.SetStatusCode(status)
	ctx.SetContentTypeBytes(ctJSON)
	r := &ctx.Response
	r.ResetBody()
	r.AppendBodyString(`{"code":"`)
	r.AppendBodyString(string(code))
	r.AppendBodyString(`","message":`)
	var buf [256]byte
	r.AppendBody(appendJSONString(buf[:0], msg))
	r.AppendBodyString("}")
}

// failRetry is fail with a Retry-After of exactly secs seconds (at least 1):
// for an answer whose wait is a fact, like the seconds left before a start.
func failRetry(ctx *fasthttp.RequestCtx, status int, code flashgate.Code, msg string, secs int64) {
	fail(ctx, status, code, msg)
	if secs <= 1 {
		ctx.Response.Header.SetBytesKV(hdrRetryAfter, one)
		return
	}
	var buf [20]byte
	ctx.Response.Header.SetBytesKV(hdrRetryAfter, strconv.AppendInt(buf[:0], secs, 10))
}

// pausedWait is the wait behind a paused sale's Retry-After (retryAfter
// jitters it to 10-21 s): a pause is an operator's and lasts minutes, and
// buyers refused together should not come back together.
const pausedWait = 10 * time.Second

// paused answers a purchase of a paused sale: 503 paused, nothing reserved.
func paused(ctx *fasthttp.RequestCtx) {
	refuseRetry(ctx, fasthttp.StatusServiceUnavailable, flashgate.CodePaused, "the sale is paused; try again later", pausedWait)
}

// The bounds of a jittered Retry-After, in seconds.
const (
	minRetryAfter = 1
	maxRetryAfter = 30
)

// retryAfter is the Retry-After of a refusal caused by something that lasts
// about wait (a rate limiter's advised wait, a breaker's remaining open time;
// 0 when nothing is known): never less than wait rounded up to whole seconds,
// and a random number of seconds up to as much again plus one more, all within
// 1-30 s. Buyers refused in the same instant come back spread over that span,
// not together at the next second to be refused together again. math/rand/v2's
// top-level functions use a per-thread source: no lock, no allocation.
func retryAfter(wait time.Duration) int64 {
	lo := min(max(ceilSeconds(wait.Milliseconds()), minRetryAfter), maxRetryAfter)
	hi := min(2*lo+1, maxRetryAfter)
	return lo + rand.Int64N(hi-lo+1)
}

// refuseRetry is fail with a jittered Retry-After derived from wait
// (retryAfter): the 429s and 503s.
func refuseRetry(ctx *fasthttp.RequestCtx, status int, code flashgate.Code, msg string, wait time.Duration) {
	failRetry(ctx, status, code, msg, retryAfter(wait))
}

// unavailable answers 503 for a dependency that is away for an unknown time.
func unavailable(ctx *fasthttp.RequestCtx, msg string) {
	refuseRetry(ctx, fasthttp.StatusServiceUnavailable, flashgate.CodeUnavailable, msg, 0)
}

// unavailableFor answers 503 for an outage expected to last about wait (an
// open breaker's remaining time).
func unavailableFor(ctx *fasthttp.RequestCtx, msg string, wait time.Duration) {
	refuseRetry(ctx, fasthttp.StatusServiceUnavailable, flashgate.CodeUnavailable, msg, wait)
}

// limitBody is the 403 limit_reached body of one purchase limit: the limit's
// dimension (user, phone, device, ip, address) as a field of its own, so a
// client need not read it out of the message. Built once for each limit of a
// sale (newSale): the refusal then copies bytes and allocates nothing.
func limitBody(dim flashgate.Dimension, msg string) []byte {
	b := append([]byte(`{"code":"`), flashgate.CodeLimitReached...)
	b = append(b, `","message":`...)
	b = appendJSONString(b, msg)
	b = append(b, `,"dimension":`...)
	b = appendJSONString(b, string(dim))
	return append(b, '}')
}

// limitReached answers 403 with a body limitBody built.
func limitReached(ctx *fasthttp.RequestCtx, body []byte) {
	ctx.SetStatusCode(fasthttp.StatusForbidden)
	ctx.SetContentTypeBytes(ctJSON)
	ctx.Response.ResetBody()
	ctx.Response.AppendBody(body)
}

func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// accepted writes the 202 of a purchase.
func accepted(ctx *fasthttp.RequestCtx, id uint64, status flashgate.OrderStatus) {
	ctx.SetStatusCode(fasthttp.StatusAccepted)
	ctx.SetContentTypeBytes(ctJSON)
	r := &ctx.Response
	r.ResetBody()
	r.AppendBodyString(`{"code":"accepted","order_id":"`)
	var buf [20]byte
	r.AppendBody(strconv.AppendUint(buf[:0], id, 10))
	r.AppendBodyString(`","status":"`)
	r.AppendBodyString(string(status))
	r.AppendBodyString(`"}`)
}

// statusTooEarly is 425 Too Early, the status of not_started.
const statusTooEarly = 425

func ceilSeconds(ms int64) int64 { return (ms + 999) / 1000 }
