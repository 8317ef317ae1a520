package gateway

import (
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

// soldOut answers 409 sold_out for a sale (or region) marked sold out: the
// one answer an nginx in front may repeat without asking. X-Accel-Expires
// "@<unix second>" keeps nginx's copy until the end of the current second
// (nginx's cache counts whole seconds: a relative "1" would let a copy live up
// to two), so a copy is less than a second old when a restock clears the mark.
// Every other answer is left uncacheable.
func soldOut(ctx *fasthttp.RequestCtx, now time.Time) {
	fail(ctx, fasthttp.StatusConflict, flashgate.CodeSoldOut, "sold out")
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

// failRetry is fail with a Retry-After of secs seconds.
func failRetry(ctx *fasthttp.RequestCtx, status int, code flashgate.Code, msg string, secs int64) {
	fail(ctx, status, code, msg)
	if secs <= 1 {
		ctx.Response.Header.SetBytesKV(hdrRetryAfter, one)
		return
	}
	var buf [20]byte
	ctx.Response.Header.SetBytesKV(hdrRetryAfter, strconv.AppendInt(buf[:0], secs, 10))
}

// pausedRetry is the Retry-After of a paused sale's purchases: a pause is an
// operator's and lasts minutes, not milliseconds.
const pausedRetry = 30

// paused answers a purchase of a paused sale: 503 paused, nothing reserved.
func paused(ctx *fasthttp.RequestCtx) {
	failRetry(ctx, fasthttp.StatusServiceUnavailable, flashgate.CodePaused, "the sale is paused; try again later", pausedRetry)
}

func unavailable(ctx *fasthttp.RequestCtx, msg string) {
	failRetry(ctx, fasthttp.StatusServiceUnavailable, flashgate.CodeUnavailable, msg, 1)
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
