package backend

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/mysql"
)

// Orders on the admin API: one order, a sale's orders page by page (of one
// buyer, or all), an operator's cancel with a reason, and a sale's export,
// streamed from MySQL row by row (docs/api.md, docs/runbook.md).

// adminOrder is an order as the admin API shows it: MySQL's row, its status
// as MySQL has it.
type adminOrder struct {
	OrderID   string    `json:"order_id"`
	SaleID    string    `json:"sale_id"`
	UserID    string    `json:"user_id"`
	Quantity  int64     `json:"quantity"`
	Region    string    `json:"region,omitempty"`
	Status    string    `json:"status"`
	Reason    string    `json:"reason,omitempty"`
	IdemKey   string    `json:"idempotency_key,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

func adminOrderOf(o *flashgate.Order) adminOrder {
	return adminOrder{OrderID: strconv.FormatUint(o.ID, 10), SaleID: o.SaleID, UserID: o.UserID, Quantity: o.Quantity,
		Region: o.Region, Status: string(o.Status), Reason: o.Reason, IdemKey: o.IdemKey,
		CreatedAt: o.CreatedAt.UTC(), ExpiresAt: o.ExpiresAt.UTC()}
}

// orderOr404 reads the order of the path's {order}, or answers.
func (a *adminAPI) orderOr404(w http.ResponseWriter, r *http.Request) (flashgate.Order, bool) {
	id, err := strconv.ParseUint(r.PathValue("order"), 10, 64)
	if err != nil || id == 0 {
		writeError(w, http.StatusNotFound, flashgate.CodeOrderNotFound, "no order "+r.PathValue("order"))
		return flashgate.Order{}, false
	}
	o, err := mysql.OrderByID(r.Context(), a.db, id)
	switch {
	case errors.Is(err, mysql.ErrNoOrder):
		writeError(w, http.StatusNotFound, flashgate.CodeOrderNotFound, "no order "+r.PathValue("order"))
		return o, false
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, "MySQL: "+err.Error())
		return o, false
	}
	return o, true
}

// showOrder is GET /admin/v1/orders/{order}.
func (a *adminAPI) showOrder(w http.ResponseWriter, r *http.Request) {
	if o, ok := a.orderOr404(w, r); ok {
		writeJSON(w, http.StatusOK, adminOrderOf(&o))
	}
}

// maxOrderPage bounds a page of GET /admin/v1/orders.
const maxOrderPage = 1000

// listOrders is GET /admin/v1/orders?sale=S[&user=U][&after=ID][&limit=N]:
// a page of the sale's orders in id order; "next", when present, is the
// after of the next page.
func (a *adminAPI) listOrders(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	sale, user := q.Get("sale"), q.Get("user")
	if sale == "" {
		writeError(w, http.StatusBadRequest, flashgate.CodeInvalidRequest, "sale: required")
		return
	}
	limit, after := 100, uint64(0)
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxOrderPage {
			writeError(w, http.StatusBadRequest, flashgate.CodeInvalidRequest, "limit: 1 to "+strconv.Itoa(maxOrderPage))
			return
		}
		limit = n
	}
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, flashgate.CodeInvalidRequest, "after: an order id")
			return
		}
		after = n
	}
	if _, ok := a.saleOr404(w, r, sale); !ok {
		return
	}
	orders, err := mysql.ListOrders(r.Context(), a.db, sale, user, after, limit)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, "MySQL: "+err.Error())
		return
	}
	out := struct {
		Orders []adminOrder `json:"orders"`
		Next   string       `json:"next,omitempty"`
	}{Orders: make([]adminOrder, 0, len(orders))}
	for i := range orders {
		out.Orders = append(out.Orders, adminOrderOf(&orders[i]))
	}
	if len(orders) == limit {
		out.Next = out.Orders[len(out.Orders)-1].OrderID
	}
	writeJSON(w, http.StatusOK, out)
}

// maxCancelReason bounds an admin cancel's reason.
const maxCancelReason = 500

// cancelOrder is POST /admin/v1/orders/{order}/cancel {"reason": "..."}: an
// operator cancels a confirmed order for its buyer. It is the buyer's cancel
// (lifecycle.cancel: the same transaction under the sale row lock, the units
// back to MySQL's counters and then to Redis, the gateways told), run for the
// order's owner; the reason, who gave it and the order before and after are
// the audit log's entry. A paid, failed or expired order is 409
// order_closed; one not yet written (still in the stream) 409 conflict.
func (a *adminAPI) cancelOrder(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Reason string `json:"reason"`
	}
	if err := decodeStrict(w, r, &body); err != nil {
		writeError(w, http.StatusBadRequest, flashgate.CodeInvalidRequest, "body: "+err.Error())
		return
	}
	if body.Reason == "" || len(body.Reason) > maxCancelReason || !utf8.ValidString(body.Reason) {
		writeError(w, http.StatusBadRequest, flashgate.CodeInvalidRequest, "reason: 1 to "+strconv.Itoa(maxCancelReason)+" bytes of UTF-8, required")
		return
	}
	before, ok := a.orderOr404(w, r)
	if !ok {
		return
	}
	rep, err := a.cancel(r.Context(), bus.OrderCommand{Op: bus.CmdCancel, SaleID: before.SaleID, OrderID: before.ID, UserID: before.UserID}, time.Now())
	if err != nil {
		a.log.Error("admin cancel", "sale", before.SaleID, "order", before.ID, "err", err)
		writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, err.Error())
		return
	}
	switch rep.Code {
	case bus.ReplyOK:
	case string(flashgate.CodeOrderClosed), string(flashgate.CodeConflict):
		writeError(w, http.StatusConflict, flashgate.Code(rep.Code), rep.Message)
		return
	case string(flashgate.CodeOrderNotFound):
		writeError(w, http.StatusNotFound, flashgate.CodeOrderNotFound, rep.Message)
		return
	default:
		writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, rep.Message)
		return
	}
	after, err := mysql.OrderByID(r.Context(), a.db, before.ID)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, "MySQL: "+err.Error())
		return
	}
	if before.Status != after.Status { // canceled now, not before
		type canceled struct {
			adminOrder
			CancelReason string `json:"cancel_reason"`
		}
		a.record(r, change{action: "cancel", sale: before.SaleID, target: strconv.FormatUint(before.ID, 10),
			before: adminOrderOf(&before), after: canceled{adminOrderOf(&after), body.Reason}})
	}
	a.log.Info("order canceled by an operator", "sale", before.SaleID, "order", before.ID, "reason", body.Reason)
	writeJSON(w, http.StatusOK, adminOrderOf(&after))
}

// csvHeader is the first line of a CSV export.
var csvHeader = []string{"order_id", "sale_id", "user_id", "quantity", "region", "status", "reason", "idempotency_key", "created_at", "expires_at"}

// exportSale is GET /admin/v1/sales/{sale}/export?format=csv|json: every
// order of the sale, streamed from MySQL's rows as they come (nothing holds
// the whole list). JSON is one array. An error after the first byte cannot
// change the status any more: the connection is cut, so that a client never
// takes a cut export for a whole one (curl says "transfer closed", the CLI
// fails).
func (a *adminAPI) exportSale(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("sale")
	format := r.URL.Query().Get("format")
	if format == "" {
		format = "csv"
	}
	if format != "csv" && format != "json" {
		writeError(w, http.StatusBadRequest, flashgate.CodeInvalidRequest, "format: csv or json")
		return
	}
	if _, ok := a.saleOr404(w, r, id); !ok {
		return
	}
	// A big sale takes longer than the server's write timeout.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Disposition", `attachment; filename="`+id+`.`+format+`"`)
	var each func(flashgate.Order) error
	var end func() error
	if format == "csv" {
		w.Header().Set("Content-Type", "text/csv; charset=utf-8")
		w.WriteHeader(http.StatusOK)
		cw := csv.NewWriter(w)
		_ = cw.Write(csvHeader)
		each = func(o flashgate.Order) error {
			v := adminOrderOf(&o)
			return cw.Write([]string{v.OrderID, v.SaleID, v.UserID, strconv.FormatInt(v.Quantity, 10), v.Region, v.Status, v.Reason,
				v.IdemKey, v.CreatedAt.Format(time.RFC3339Nano), v.ExpiresAt.Format(time.RFC3339Nano)})
		}
		end = func() error { cw.Flush(); return cw.Error() }
	} else {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		first := true
		_, _ = w.Write([]byte("["))
		each = func(o flashgate.Order) error {
			b, err := json.Marshal(adminOrderOf(&o))
			if err != nil {
				return err
			}
			if !first {
				b = append([]byte(",\n"), b...)
			}
			first = false
			_, err = w.Write(b)
			return err
		}
		end = func() error { _, err := w.Write([]byte("]\n")); return err }
	}
	err := mysql.EachOrder(r.Context(), a.db, id, each)
	if err == nil {
		err = end()
	}
	if err != nil {
		a.log.Error("export cut short", "sale", id, "err", err)
		panic(http.ErrAbortHandler)
	}
}

// cancelFunc is lifecycle.cancel.
type cancelFunc func(ctx context.Context, cmd bus.OrderCommand, now time.Time) (bus.OrderReply, error)
