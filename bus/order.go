package bus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/internal/clip"
)

// The orders stream carries one JSON object per admitted order, keyed short:
//
//	{"id":"7345119871795200001","sale":"sale-1","user":"user_42","qty":2,"region":"bj",
//	 "created":1767225600000,"expires":1767226500000,"idem":"K-1","charges":"0/sale/1/+8613800000001",
//	 "phone":"+8613800000001","device":"d-1","ip":"10.0.0.1","addr":"0123456789abcdef"}
//
// The id is a string (JavaScript readers lose precision past 2^53); created
// and expires are Unix milliseconds; idem, charges and the facts (phone,
// device, ip, addr) are left out when empty. An order on the stream is pending
// by definition, so it carries no status or reason. docs/orders.md.
type orderWire struct {
	ID      uint64 `json:"id,string"`
	Sale    string `json:"sale"`
	User    string `json:"user"`
	Qty     int64  `json:"qty"`
	Region  string `json:"region"`
	Created int64  `json:"created"`
	Expires int64  `json:"expires"`
	Idem    string `json:"idem,omitempty"`
	Charges string `json:"charges,omitempty"`
	Phone   string `json:"phone,omitempty"`
	Device  string `json:"device,omitempty"`
	IP      string `json:"ip,omitempty"`
	Addr    string `json:"addr,omitempty"`
}

// EncodeOrder is o as the orders stream carries it.
func EncodeOrder(o *flashgate.Order) []byte { return AppendOrder(make([]byte, 0, 192), o) }

// PublishOrder stores order o in the order stream on subject (OrderSubject of
// its sale) with Nats-Msg-Id = the order id, so that publishing the same order
// again (a replay, a republish by reconcile) is a duplicate JetStream drops
// within its dedup window. It returns once the stream has stored it; buf's
// room is reused for the encoding.
func PublishOrder(ctx context.Context, js jetstream.JetStream, subject string, o *flashgate.Order, buf []byte) (*jetstream.PubAck, error) {
	return js.Publish(ctx, subject, AppendOrder(buf[:0], o), jetstream.WithMsgID(strconv.FormatUint(o.ID, 10)))
}

// HeaderRequestID is the message header that carries the id of the HTTP
// request an order came from (nginx's $request_id, or the gateway's own), so
// that the backend's log line for the order names it.
const HeaderRequestID = "X-Request-Id"

// SendOrder is PublishOrder for the gateway's hot path, for an order that
// came from the HTTP request requestID (its id travels in the
// HeaderRequestID header; "" sends none): the same
// JetStream publish (a request on the stream's subject, answered by the
// stream once it has stored the message, Nats-Msg-Id for deduplication), made
// as a core NATS request with both headers in one map, whose answer is only
// checked for an error: the gateway needs no sequence number, and decoding the
// whole PubAck was seven of a purchase's allocations. Returns nil once the
// stream has stored the order (or already had it: a duplicate).
func SendOrder(ctx context.Context, nc *nats.Conn, subject string, o *flashgate.Order, buf []byte, requestID string) error {
	return sendOrder(ctx, nc, subject, o, buf, requestID, false)
}

// ErrDuplicate is SendNewOrder's answer when the stream already held a
// message with the order's id (Nats-Msg-Id) within its dedup window: the id
// was used by another order (two generators on one node id: a broken id
// source), and this order is NOT in the stream.
var ErrDuplicate = errors.New("order id already in the stream")

// SendNewOrder is SendOrder for an order's first publish (the gateway's,
// right after its admission): a duplicate answer cannot be this order's own
// earlier copy, so it is ErrDuplicate, not success. (A replay and a republish
// send an order again: for them a duplicate is the copy already stored, and
// they use SendOrder.)
func SendNewOrder(ctx context.Context, nc *nats.Conn, subject string, o *flashgate.Order, buf []byte, requestID string) error {
	return sendOrder(ctx, nc, subject, o, buf, requestID, true)
}

func sendOrder(ctx context.Context, nc *nats.Conn, subject string, o *flashgate.Order, buf []byte, requestID string, first bool) error {
	var idb [20]byte
	h := nats.Header{jetstream.MsgIDHeader: []string{string(strconv.AppendUint(idb[:0], o.ID, 10))}}
	if requestID != "" {
		h[HeaderRequestID] = []string{requestID}
	}
	m := nats.Msg{Subject: subject, Data: AppendOrder(buf[:0], o), Header: h}
	for {
		resp, err := nc.RequestMsgWithContext(ctx, &m)
		if err == nil {
			if err := pubAckError(resp.Data); err != nil {
				return err
			}
			if first && isDuplicate(resp.Data) {
				return fmt.Errorf("publish %s: order %d: %w", subject, o.ID, ErrDuplicate)
			}
			return nil
		}
		if !errors.Is(err, nats.ErrNoResponders) {
			return fmt.Errorf("publish %s: %w", subject, err)
		}
		// No stream answered: in a cluster, its leader may be moving. Ask
		// again while the budget lasts, as the jetstream client does (the
		// same Nats-Msg-Id makes a second store a duplicate; for a first
		// publish that would be ErrDuplicate, a refusal: the safe side, as
		// no stream answers only when none took the message).
		select {
		case <-ctx.Done():
			return fmt.Errorf("publish %s: %w", subject, jetstream.ErrNoStreamResponse)
		case <-time.After(noStreamRetry):
		}
	}
}

// noStreamRetry is the pause before a publish that no stream answered is sent
// again.
const noStreamRetry = 50 * time.Millisecond

// isDuplicate reports whether a JetStream publish ack says the stream had the
// message's id already ({"stream":…,"seq":…,"duplicate":true}).
// (nats-server writes `"duplicate": true`, with a space; either is read.)
func isDuplicate(b []byte) bool {
	return bytes.Contains(b, []byte(`"duplicate": true`)) || bytes.Contains(b, []byte(`"duplicate":true`))
}

// pubAckError is the error a JetStream publish answer carries, nil for an ack.
func pubAckError(b []byte) error {
	if !bytes.Contains(b, []byte(`"error"`)) {
		if bytes.HasPrefix(b, []byte(`{"stream":`)) {
			return nil
		}
		return fmt.Errorf("publish: unexpected answer %s", clip.Quote(b))
	}
	var a struct {
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(b, &a); err != nil || a.Error == nil {
		return fmt.Errorf("publish: unexpected answer %s", clip.Quote(b))
	}
	return a.Error
}

// AppendOrder encodes o onto b without reflection (the gateway's hot path).
// Every string field is already validated (ids to [A-Za-z0-9_-], charges and
// facts to normalised subjects of digits, letters and ".:+/_-"), so none needs
// escaping.
func AppendOrder(b []byte, o *flashgate.Order) []byte {
	b = append(b, `{"id":"`...)
	b = strconv.AppendUint(b, o.ID, 10)
	b = append(b, `","sale":"`...)
	b = append(b, o.SaleID...)
	b = append(b, `","user":"`...)
	b = append(b, o.UserID...)
	b = append(b, `","qty":`...)
	b = strconv.AppendInt(b, o.Quantity, 10)
	b = append(b, `,"region":"`...)
	b = append(b, o.Region...)
	b = append(b, `","created":`...)
	b = strconv.AppendInt(b, unixMilli(o.CreatedAt), 10)
	b = append(b, `,"expires":`...)
	b = strconv.AppendInt(b, unixMilli(o.ExpiresAt), 10)
	b = appendField(b, `,"idem":"`, o.IdemKey)
	b = appendField(b, `,"charges":"`, o.Charges)
	b = appendField(b, `,"phone":"`, o.Phone)
	b = appendField(b, `,"device":"`, o.Device)
	b = appendField(b, `,"ip":"`, o.IP)
	b = appendField(b, `,"addr":"`, o.Address)
	return append(b, '}')
}

// unixMilli writes the zero time (an order built without one) as 0 ms.
func unixMilli(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// fromMilli reads a time off the wire, in UTC. 0 ms is 1970, as it always
// was to the backend (an Order at the Unix epoch is the one that does not
// come back as it went).
func fromMilli(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

func appendField(b []byte, key, v string) []byte {
	if v == "" {
		return b
	}
	b = append(b, key...)
	b = append(b, v...)
	return append(b, '"')
}

// ErrBadMsg marks a message that can never be processed.
var ErrBadMsg = errors.New("bad order message")

// DecodeOrder parses and checks a message body; the order is pending.
func DecodeOrder(b []byte) (flashgate.Order, error) {
	var m orderWire
	if err := json.Unmarshal(b, &m); err != nil {
		return flashgate.Order{}, fmt.Errorf("%w: %v", ErrBadMsg, err)
	}
	o := flashgate.Order{ID: m.ID, SaleID: m.Sale, UserID: m.User, Quantity: m.Qty, Region: m.Region,
		Status: flashgate.OrderPending, IdemKey: m.Idem, Charges: m.Charges,
		Phone: m.Phone, Device: m.Device, IP: m.IP, Address: m.Addr,
		CreatedAt: fromMilli(m.Created), ExpiresAt: fromMilli(m.Expires)}
	if m.ID == 0 || !flashgate.ValidID(m.Sale) || !flashgate.ValidID(m.User) || m.Qty < 1 || m.Qty > flashgate.MaxSaleUnits ||
		(m.Region != "" && !flashgate.ValidRegion(m.Region)) || (m.Idem != "" && !flashgate.ValidID(m.Idem)) {
		return o, fmt.Errorf("%w: %s", ErrBadMsg, clip.Quote(b))
	}
	if _, err := flashgate.ParseCharges(m.Charges); err != nil {
		return o, fmt.Errorf("%w: %v", ErrBadMsg, err)
	}
	for _, f := range [...]string{m.Phone, m.Device, m.IP, m.Addr} {
		if f != "" && !flashgate.ValidSubject(f) {
			return o, fmt.Errorf("%w: subject %s", ErrBadMsg, clip.Quote(f))
		}
	}
	return o, nil
}
