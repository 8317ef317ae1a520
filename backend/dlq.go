package backend

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/mysql"
)

// The dead-letter stream on the admin API (docs/runbook.md,
// FlashgateDeadLetters): list its messages, and redrive a poison order once
// what made it fail is fixed.

// deadLetter is one message of the dead-letter stream as GET /admin/v1/dlq
// shows it.
type deadLetter struct {
	Seq        uint64    `json:"seq"`
	At         time.Time `json:"at"`
	Kind       string    `json:"kind"`
	SaleID     string    `json:"sale_id,omitempty"`
	OrderID    string    `json:"order_id,omitempty"`
	UserID     string    `json:"user_id,omitempty"`
	Quantity   int64     `json:"quantity,omitempty"`
	Error      string    `json:"error,omitempty"`
	Deliveries string    `json:"deliveries,omitempty"`
	Subject    string    `json:"subject"`
}

func deadLetterOf(m *jetstream.RawStreamMsg) deadLetter {
	d := deadLetter{Seq: m.Sequence, At: m.Time.UTC(), Kind: m.Header.Get(bus.HdrDeadKind), Error: m.Header.Get(bus.HdrDeadError),
		Deliveries: m.Header.Get(bus.HdrDeadDeliveries), OrderID: m.Header.Get(bus.HdrDeadOrder), Subject: m.Subject}
	if o, err := bus.DecodeOrder(m.Data); err == nil {
		d.SaleID, d.UserID, d.Quantity = o.SaleID, o.UserID, o.Quantity
		d.OrderID = strconv.FormatUint(o.ID, 10)
	}
	return d
}

func (a *adminAPI) dlqStream(ctx context.Context) (jetstream.Stream, error) {
	return a.js.Stream(ctx, bus.DeadLetterStream(a.natsCfg))
}

// maxDLQPage bounds a page of GET /admin/v1/dlq.
const maxDLQPage = 1000

// listDLQ is GET /admin/v1/dlq[?sale=S][&after=SEQ][&limit=N]: the dead
// letters in stream order (of a sale MySQL knows, with ?sale); "next" is the
// after of the next page.
func (a *adminAPI) listDLQ(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, after := 100, uint64(0)
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxDLQPage {
			writeError(w, http.StatusBadRequest, flashgate.CodeInvalidRequest, "limit: 1 to "+strconv.Itoa(maxDLQPage))
			return
		}
		limit = n
	}
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, flashgate.CodeInvalidRequest, "after: a sequence")
			return
		}
		after = n
	}
	subject := bus.DeadLetterSubject(a.natsCfg, "*", "*")
	if sale := q.Get("sale"); sale != "" {
		if _, ok := a.saleOr404(w, r, sale); !ok {
			return
		}
		subject = bus.DeadLetterSubject(a.natsCfg, "*", sale)
	}
	out := struct {
		DeadLetters []deadLetter `json:"dead_letters"`
		Next        string       `json:"next,omitempty"`
	}{DeadLetters: []deadLetter{}}
	s, err := a.dlqStream(r.Context())
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		writeJSON(w, http.StatusOK, out) // no backend dead-lettered anything yet
		return
	}
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, "NATS: "+err.Error())
		return
	}
	for seq := after + 1; len(out.DeadLetters) < limit; {
		m, err := s.GetMsg(r.Context(), seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, "NATS: "+err.Error())
			return
		}
		out.DeadLetters = append(out.DeadLetters, deadLetterOf(m))
		seq = m.Sequence + 1
	}
	if len(out.DeadLetters) == limit {
		out.Next = strconv.FormatUint(out.DeadLetters[limit-1].Seq, 10)
	}
	writeJSON(w, http.StatusOK, out)
}

// redriveLockWait bounds the wait for another redrive of the same order.
const redriveLockWait = 10 * time.Second

// redriveDLQ is POST /admin/v1/dlq/{seq}/redrive: a poison order goes back
// into the orders stream, to be written as if for the first time, once what
// made it fail is fixed. One redrive of an order at a time (a MySQL named
// lock on its id):
//
//  1. Under the sale row lock, the order's failed (dead_letter) row is
//     removed: the writer then meets the order as new. An order MySQL holds
//     otherwise (a redrive before this one went through) is only taken out
//     of the dead-letter stream.
//  2. The order's message is published to the orders stream with its order
//     id as Nats-Msg-Id, as the gateway first did. If the stream still holds
//     that id in its duplicate window (nats.dedup_window), nothing was added:
//     the failed row is put back and the answer is 409 conflict (redrive
//     again later).
//  3. Acked: the dead letter is deleted, and the sale's Redis is rebuilt from
//     MySQL and the stream (the one rebuild): the order, which its dead
//     letter had released in Redis, is reserved again if it is still in the
//     stream, or counted sold if it was written already.
//
// The writer then decides it like any order: it may still fail (sold out by
// now, or poison again: then it is dead-lettered again).
func (a *adminAPI) redriveDLQ(w http.ResponseWriter, r *http.Request) {
	seq, err := strconv.ParseUint(r.PathValue("seq"), 10, 64)
	if err != nil || seq == 0 {
		writeError(w, http.StatusNotFound, codeNotFound, "no dead letter "+r.PathValue("seq"))
		return
	}
	ctx := r.Context()
	s, err := a.dlqStream(ctx)
	var m *jetstream.RawStreamMsg
	if err == nil {
		m, err = s.GetMsg(ctx, seq)
	}
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrMsgNotFound):
		writeError(w, http.StatusNotFound, codeNotFound, "no dead letter "+r.PathValue("seq"))
		return
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, "NATS: "+err.Error())
		return
	}
	o, err := bus.DecodeOrder(m.Data)
	if err != nil || m.Header.Get(bus.HdrDeadKind) != bus.DeadPoison {
		writeError(w, http.StatusConflict, flashgate.CodeConflict, "dead letter "+r.PathValue("seq")+" is not an order that can be redriven (kind "+
			m.Header.Get(bus.HdrDeadKind)+"): read it with `flashgate dlq list`")
		return
	}
	lock, err := mysql.LockOrderID(ctx, a.db, o.ID, redriveLockWait)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, "MySQL: "+err.Error())
		return
	}
	defer lock.Release()
	before := deadLetterOf(m)
	removed, state, eventSeq, err := a.unfail(ctx, o)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, "MySQL: "+err.Error())
		return
	}
	view := struct {
		deadLetter
		Redriven bool   `json:"redriven"`
		Status   string `json:"status,omitempty"`
		Reason   string `json:"reason,omitempty"`
	}{deadLetter: before}
	if state != nil {
		// MySQL has the order already (not as a dead letter's failure): an
		// earlier redrive went through. The dead letter has done its job.
		if err := s.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, "NATS: "+err.Error())
			return
		}
		view.Status, view.Reason = string(state.Status), state.Reason
		writeJSON(w, http.StatusOK, view)
		return
	}
	msg := &nats.Msg{Subject: bus.OrderSubject(a.natsCfg, o.SaleID), Data: m.Data, Header: nats.Header{}}
	ack, err := a.js.PublishMsg(ctx, msg, jetstream.WithMsgID(strconv.FormatUint(o.ID, 10)))
	if err == nil && ack.Duplicate {
		err = errDuplicateWindow
	}
	if err != nil {
		// Nothing went into the stream: the order's failed row goes back, as
		// it was (a redrive again later finds it).
		if removed {
			if rerr := a.refail(context.WithoutCancel(ctx), o, eventSeq); rerr != nil {
				a.log.Error("redrive: putting the failed row back", "sale", o.SaleID, "order", o.ID, "err", rerr)
			}
		}
		if errors.Is(err, errDuplicateWindow) {
			writeError(w, http.StatusConflict, flashgate.CodeConflict, fmt.Sprintf(
				"the orders stream still remembers order %d (nats.dedup_window): redrive it again later", o.ID))
			return
		}
		writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, "NATS: "+err.Error())
		return
	}
	if err := s.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		// The order is in the stream; a repeated redrive finds it in MySQL
		// (or the stream's duplicate window) and only deletes the dead letter.
		a.log.Warn("redrive: the dead letter stays in its stream", "seq", seq, "order", o.ID, "err", err)
	}
	if _, err := a.warmer.rebuild(context.WithoutCancel(ctx), o.SaleID, nil); err != nil {
		// Redis's books are off by the order's units until reconcile (or
		// the leader's next rebuild) repairs them.
		a.log.Error("redrive: rebuilding the sale's Redis", "sale", o.SaleID, "order", o.ID, "err", err)
	}
	view.Redriven = true
	a.record(r, change{action: "redrive", sale: o.SaleID, target: strconv.FormatUint(o.ID, 10), before: before,
		after: map[string]any{"stream": a.natsCfg.Stream, "seq": ack.Sequence}})
	a.log.Info("dead letter redriven", "seq", seq, "sale", o.SaleID, "order", o.ID)
	writeJSON(w, http.StatusOK, view)
}

var errDuplicateWindow = errors.New("duplicate window")

// unfail removes o's failed (dead_letter) row under the sale row lock. It
// answers whether it removed one (with its event sequence, for a put-back),
// or MySQL's state of the order when MySQL holds it otherwise (nil: the order
// has no row now).
func (a *adminAPI) unfail(ctx context.Context, o flashgate.Order) (bool, *mysql.OrderState, int64, error) {
	tx, err := mysql.Begin(ctx, a.db)
	if err != nil {
		return false, nil, 0, err
	}
	defer tx.Rollback()
	if _, err := mysql.LockSale(ctx, tx, o.SaleID); err != nil {
		return false, nil, 0, err
	}
	st, err := mysql.OrderStateOf(ctx, tx, o.SaleID, o.ID)
	switch {
	case errors.Is(err, mysql.ErrNoOrder):
		return false, nil, 0, nil
	case err != nil:
		return false, nil, 0, err
	case st.Status != flashgate.OrderFailed || st.Reason != ReasonDeadLetter:
		return false, &st, 0, nil
	}
	seq, err := mysql.EventSeqOf(ctx, tx, o.ID)
	if err != nil {
		return false, nil, 0, err
	}
	removed, err := mysql.DeleteDeadLettered(ctx, tx, o.ID, ReasonDeadLetter)
	if err != nil {
		return false, nil, 0, err
	}
	return removed, nil, seq, tx.Commit()
}

// refail puts back the failed row unfail removed, as it was (a put-back is
// no change of status: no order event).
func (a *adminAPI) refail(ctx context.Context, o flashgate.Order, seq int64) error {
	row := o
	row.Status, row.Reason = flashgate.OrderFailed, ReasonDeadLetter
	row.CreatedAt, row.ExpiresAt = rowTime(o.CreatedAt.UnixMilli()), rowTime(o.ExpiresAt.UnixMilli())
	return mysql.RestoreDeadLettered(ctx, a.db, row, seq, time.Now().UTC())
}

// codeNotFound is the admin API's code for a thing that is neither a sale
// nor an order (a route, a dead letter).
const codeNotFound flashgate.Code = "not_found"
