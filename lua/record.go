package lua

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/flashgate/flashgate"
)

// Redis keeps an order as one string of fields joined by '|', in the sale's
// orders hash under the order id (docs/orders.md):
//
//	status|reason|user|qty|region|created|expires|idem|charges
//	confirmed||user_42|2|bj|1767225600000|1767226500000|K-1|0/sale/2/user_42
//
// and, while its units are reserved, in the resv hash without status and
// reason (what admit.lua writes). Times are Unix milliseconds. No field can
// hold a '|': ids, regions and charges are validated to other characters, and
// reasons are the flashgate.Reason words. The scripts read these fields by
// position, so the layout is the scripts' as much as Go's.

// EncodeRecord is o as the orders hash holds it.
func EncodeRecord(o *flashgate.Order) string {
	return string(o.Status) + "|" + o.Reason + "|" + EncodeResv(o)
}

// EncodeResv is o as the resv hash holds it.
func EncodeResv(o *flashgate.Order) string {
	return o.UserID + "|" + strconv.FormatInt(o.Quantity, 10) + "|" + o.Region + "|" +
		strconv.FormatInt(unixMilli(o.CreatedAt), 10) + "|" + strconv.FormatInt(unixMilli(o.ExpiresAt), 10) + "|" +
		o.IdemKey + "|" + o.Charges
}

// DecodeRecord parses a value of sale's orders hash under id (a record
// written before charges existed has one field fewer). The facts are not in
// the record: FactsFromCharges brings them back.
func DecodeRecord(sale string, id uint64, v string) (flashgate.Order, error) {
	f := strings.Split(v, "|")
	if len(f) != 8 && len(f) != 9 {
		return flashgate.Order{}, fmt.Errorf("order record %q: %d fields", v, len(f))
	}
	o := flashgate.Order{ID: id, SaleID: sale, Status: flashgate.OrderStatus(f[0]), Reason: f[1], UserID: f[2], Region: f[4], IdemKey: f[7]}
	if len(f) == 9 {
		o.Charges = f[8]
	}
	qty, e1 := strconv.ParseInt(f[3], 10, 64)
	created, e2 := strconv.ParseInt(f[5], 10, 64)
	expires, e3 := strconv.ParseInt(f[6], 10, 64)
	if err := errors.Join(e1, e2, e3); err != nil {
		return flashgate.Order{}, fmt.Errorf("order record %q: %w", v, err)
	}
	o.Quantity, o.CreatedAt, o.ExpiresAt = qty, time.UnixMilli(created).UTC(), time.UnixMilli(expires).UTC()
	return o, nil
}

// DecodeResv parses a value of sale's resv hash under id: a pending order.
func DecodeResv(sale string, id uint64, v string) (flashgate.Order, error) {
	return DecodeRecord(sale, id, string(flashgate.OrderPending)+"||"+v)
}

// unixMilli writes the zero time (an order built without one) as 0 ms.
func unixMilli(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}
