package gateway

import (
	"encoding/json"
	"errors"
	"unicode/utf8"
)

// purchaseBody is the request body of POST /v1/sales/{sale}/orders:
// {"quantity":1,"region":"bj","address":"…"}, all optional (address is needed
// by a sale that limits purchases per shipping address).
type purchaseBody struct {
	Quantity int64
	Region   []byte // aliases the request body
	Address  []byte // aliases the request body unless it had escapes
}

// Parse errors; their texts are the messages clients see.
var (
	errBodyJSON     = errors.New("body must be a JSON object like {\"quantity\":1,\"region\":\"bj\"}")
	errBodyField    = errors.New("unknown field: only \"quantity\", \"region\" and \"address\" are allowed")
	errBodyDup      = errors.New("duplicate field")
	errBodyQuantity = errors.New("quantity must be a whole number")
	errBodyRegion   = errors.New("region must be a string of UTF-8 text without escapes")
	errBodyAddress  = errors.New("address must be a string of UTF-8 text")
	errBodyTooBig   = errors.New("quantity is out of range")
)

// maxQuantityDigits keeps the parse far from int64 overflow; any quantity that
// long is refused later as out of range anyway.
const maxQuantityDigits = 15

// parsePurchase parses b strictly (unknown, duplicate or mistyped fields are
// errors) without allocating. An empty body means the defaults.
func parsePurchase(b []byte) (purchaseBody, error) {
	p := purchaseBody{Quantity: 1}
	i := skipWS(b, 0)
	if i == len(b) {
		return p, nil
	}
	if b[i] != '{' {
		return p, errBodyJSON
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return p, trailing(b, i+1)
	}
	var seenQ, seenR, seenA bool
	for {
		key, j, ok := str(b, i)
		if !ok {
			return p, errBodyJSON
		}
		i = skipWS(b, j)
		if i == len(b) || b[i] != ':' {
			return p, errBodyJSON
		}
		i = skipWS(b, i+1)
		switch string(key) {
		case "quantity":
			if seenQ {
				return p, errBodyDup
			}
			seenQ = true
			n, j, err := integer(b, i)
			if err != nil {
				return p, err
			}
			p.Quantity, i = n, j
		case "region":
			if seenR {
				return p, errBodyDup
			}
			seenR = true
			v, j, ok := str(b, i)
			if !ok {
				return p, errBodyRegion
			}
			p.Region, i = v, j
		case "address":
			if seenA {
				return p, errBodyDup
			}
			seenA = true
			v, j, ok := jsonString(b, i)
			if !ok {
				return p, errBodyAddress
			}
			p.Address, i = v, j
		default:
			return p, errBodyField
		}
		i = skipWS(b, i)
		if i == len(b) {
			return p, errBodyJSON
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case '}':
			return p, trailing(b, i+1)
		default:
			return p, errBodyJSON
		}
	}
}

func trailing(b []byte, i int) error {
	if skipWS(b, i) != len(b) {
		return errBodyJSON
	}
	return nil
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// str reads a JSON string with no escapes and no control characters (no valid
// key or region needs them; anything else is refused rather than decoded).
// Bytes that are not UTF-8 are refused too: encoding/json would turn them into
// U+FFFD, so what was checked here would not be what is stored and shown.
func str(b []byte, i int) ([]byte, int, bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, i, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			if !utf8.Valid(b[i+1 : j]) {
				return nil, j, false
			}
			return b[i+1 : j], j + 1, true
		case c == '\\' || c < 0x20:
			return nil, j, false
		}
	}
	return nil, len(b), false
}

// jsonString reads any valid JSON string of UTF-8 text: without escapes it
// aliases b, with them it is decoded (a copy). Escapes are ASCII, so checking
// the raw bytes checks the text; a lone surrogate escape decodes to U+FFFD.
func jsonString(b []byte, i int) ([]byte, int, bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, i, false
	}
	escaped := false
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			if !utf8.Valid(b[i+1 : j]) {
				return nil, j, false
			}
			if !escaped {
				return b[i+1 : j], j + 1, true
			}
			var s string
			if err := json.Unmarshal(b[i:j+1], &s); err != nil {
				return nil, j, false
			}
			return []byte(s), j + 1, true
		case c == '\\':
			escaped = true
			j++ // the escaped byte; json.Unmarshal checks the escape itself
		case c < 0x20:
			return nil, j, false
		}
	}
	return nil, len(b), false
}

// integer reads a JSON number that must be a whole number (1, -1, 1e3 is not).
func integer(b []byte, i int) (int64, int, error) {
	j := i
	neg := j < len(b) && b[j] == '-'
	if neg {
		j++
	}
	start := j
	var n int64
	for j < len(b) && b[j] >= '0' && b[j] <= '9' {
		if j-start >= maxQuantityDigits {
			return 0, j, errBodyTooBig
		}
		n = n*10 + int64(b[j]-'0')
		j++
	}
	if j == start || (b[start] == '0' && j-start > 1) {
		return 0, j, errBodyQuantity
	}
	if j < len(b) && (b[j] == '.' || b[j] == 'e' || b[j] == 'E') {
		return 0, j, errBodyQuantity
	}
	if neg {
		n = -n
	}
	return n, j, nil
}

// parseOrderID reads an order id from a URL path: the decimal form the API
// writes, exactly (no sign, no leading zero, no zero, nothing past uint64), so
// each order has one URL.
func parseOrderID(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 || b[0] == '0' {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if n > (^uint64(0)-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}
