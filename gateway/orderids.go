package gateway

// Which order ids a buyer's GET or cancel may send on (docs/gateway.md, "Order
// ids the gateway answers itself"). An order id says when and where it was
// made (package orderid: 41 bits of milliseconds, 10 of node, 12 of
// sequence), and the buyer's home tag in Redis holds the record of every
// order admitted there since its last rebuild. So the gateway answers 404
// itself, with no backend asked, for an id that cannot be the caller's: made
// outside the sale's window or in the future, by a node that makes no order
// of this sale, or newer than the tag's last rebuild and absent from the
// buyer's records. Someone else's order and an order that does not exist
// take the same path at the same cost, so the answer tells nothing about
// other buyers' orders (no existence oracle).

import (
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/orderid"
)

// idMargin is how far an id's time may lie outside the sale's window, past
// now, or short of the tag's last rebuild and still be looked for. Ids are
// stamped by the clock of the gateway (or, on the degraded lane, the
// backend) that made them, the window and the rebuild by Redis's: the margin
// covers their skew (alerted past 1 s) with room.
const idMargin = 5 * time.Second

// possibleID reports whether id can name an order of sale s at all, from
// the id alone: made by a gateway's node (or a lane node, for a sale with a
// degraded lane), within the sale's window and not after now.
func possibleID(s *sale, id uint64, now time.Time) bool {
	if orderid.NodeOf(id) >= orderid.LeasedNodes && s.spec.Degrade != flashgate.DegradeMySQL {
		return false
	}
	at, m := orderid.Time(id).UnixMilli(), idMargin.Milliseconds()
	return at >= s.startsMS-m && at <= min(s.endsMS, now.UnixMilli())+m
}

// recordsDecide reports whether the buyer's home tag, rebuilt at rebuilt,
// holds the record of order id if it exists: the tag is warm, the id was made
// by a gateway (the degraded lane writes orders Redis does not hold until
// the next rebuild), and after the rebuild.
func recordsDecide(id uint64, rebuilt time.Time) bool {
	return !rebuilt.IsZero() && orderid.NodeOf(id) < orderid.LeasedNodes &&
		orderid.Time(id).After(rebuilt.Add(idMargin))
}

// ownRecord sorts what the buyer's home tag answered about id for user:
// mine is the buyer's order to show or act on; gone is an answer of 404 the
// gateway gives itself (the buyer's own released order, or, when the records
// decide, anything but the buyer's order); neither means a backend must be
// asked (MySQL holds what Redis cannot tell).
func ownRecord(rec *flashgate.Order, known bool, user string, id uint64, rebuilt time.Time) (mine, gone bool) {
	if known && rec.UserID == user {
		if rec.Status == lua.StatusReleased {
			return false, true
		}
		return true, false
	}
	return false, recordsDecide(id, rebuilt)
}
