package gateway

import (
	"bytes"

	"github.com/valyala/fasthttp"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/metrics"
)

var (
	proto11 = []byte("HTTP/1.1")
	proto10 = []byte("HTTP/1.0")
	hdrTE   = []byte("transfer-encoding")
	hdrCL   = []byte("content-length")
	chunked = []byte("chunked")
	cr      = []byte("\r")
)

// checkFraming holds a request's head to RFC 9112 where fasthttp is lenient,
// and returns the status to refuse it with (0: none). fasthttp trims a space
// before the colon, lets Transfer-Encoding win over Content-Length and takes
// two Transfer-Encoding headers: each is how one hop frames a body differently
// from the next, and the bytes one takes for the body the other runs as a
// second request (request smuggling). The raw header block is read, since the
// parsed one no longer shows these. It does not allocate.
func checkFraming(h *fasthttp.RequestHeader) (int, string) {
	proto := h.Protocol()
	http10 := bytes.Equal(proto, proto10)
	if !http10 && !bytes.Equal(proto, proto11) {
		return fasthttp.StatusHTTPVersionNotSupported, "only HTTP/1.1 and HTTP/1.0 are served"
	}
	te, cl := 0, 0
	unknownTE, conflictCL := false, false
	var firstCL []byte
	raw := h.RawHeaders()
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		line = bytes.TrimSuffix(line, cr)
		if len(line) == 0 {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			return fasthttp.StatusBadRequest, "obsolete line folding in a header"
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 {
			return fasthttp.StatusBadRequest, "malformed header line"
		}
		name := line[:colon]
		if bytes.IndexByte(name, ' ') >= 0 || bytes.IndexByte(name, '\t') >= 0 {
			return fasthttp.StatusBadRequest, "whitespace in a header name"
		}
		// Only two names matter below; comparing lengths first keeps the
		// case-insensitive comparisons off most lines.
		if len(name) != len(hdrTE) && len(name) != len(hdrCL) {
			continue
		}
		value := bytes.TrimSpace(line[colon+1:])
		switch {
		case bytes.EqualFold(name, hdrTE):
			te++
			unknownTE = unknownTE || !bytes.EqualFold(value, chunked)
		case bytes.EqualFold(name, hdrCL):
			if cl++; cl > 1 && !bytes.Equal(value, firstCL) {
				conflictCL = true
			}
			firstCL = value
		}
	}
	// Every line is read before answering: a malformed one is a 400 even
	// after an unknown coding, which alone is a 501.
	switch {
	case conflictCL:
		return fasthttp.StatusBadRequest, "conflicting Content-Length headers"
	case te > 1:
		return fasthttp.StatusBadRequest, "more than one Transfer-Encoding header"
	case te > 0 && cl > 0:
		return fasthttp.StatusBadRequest, "both Transfer-Encoding and Content-Length"
	case te > 0 && http10:
		return fasthttp.StatusBadRequest, "Transfer-Encoding in an HTTP/1.0 request"
	case unknownTE:
		return fasthttp.StatusNotImplemented, "the only transfer coding served is chunked"
	}
	return 0, ""
}

// headerReceived runs once a request's head is in, before its body is read.
// A chunked body whose framing is in doubt (Transfer-Encoding with
// Content-Length, ...) is not read at all: the parsed head is set to an empty
// body, so serve runs at once and refuses it from the raw head, which keeps
// what the client sent (else a body framed the attacker's other way could hold
// the connection until read_timeout). Other requests pay one comparison.
func headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	if h.ContentLength() == -1 { // chunked
		if st, _ := checkFraming(h); st != 0 {
			h.SetContentLength(0)
		}
	}
	return fasthttp.RequestConfig{}
}

// serve is the public port's handler: the framing check, then the API.
func (g *Gateway) serve(ctx *fasthttp.RequestCtx) {
	if status, msg := checkFraming(&ctx.Request.Header); status != 0 {
		g.refuseFraming(ctx, status, msg)
		return
	}
	g.handle(ctx)
}

// refuseFraming answers a request whose framing is in doubt and closes its
// connection: whatever follows on it cannot be told apart from a body, so
// nothing more is read as a request.
func (g *Gateway) refuseFraming(ctx *fasthttp.RequestCtx, status int, msg string) {
	fail(ctx, status, flashgate.CodeInvalidRequest, msg)
	ctx.SetConnectionClose()
	lingerOnClose(ctx)
	g.metrics.Request(metrics.RouteOther, flashgate.CodeInvalidRequest)
}
