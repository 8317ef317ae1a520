package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/lua"
)

// TestPublishOfATakenID: two id generators on one node id made the same id
// for orders of two sales. The other gateway's order is in the stream under
// that id already; this gateway admitted its own order with it and
// publishes it: JetStream answers "duplicate", and this order is not in the
// stream. The gateway must not answer 202 (the order would be lost): it
// releases the reservation and answers 503.
func TestPublishOfATakenID(t *testing.T) {
	e := start(t)
	s := e.sale(nil)
	other := e.sale(nil)
	now := time.Now()
	id := e.g.lease.Load().Next()
	// The other gateway's order, of the other sale, stored first.
	theirs := flashgate.Order{ID: id, SaleID: other.ID, UserID: "bob", Quantity: 1, CreatedAt: now, ExpiresAt: now.Add(time.Minute)}
	if err := bus.SendNewOrder(context.Background(), e.g.nc, bus.OrderSubject(e.cfg.NATS, other.ID), &theirs, nil, ""); err != nil {
		t.Fatalf("the other order's publish: %v", err)
	}
	// This gateway's admission of its own order under the same id.
	k := lua.KeysOf(s)
	a := lua.AdmitArgs{User: "alice", Quantity: 1, OrderID: id, Now: now, PayBy: now.Add(time.Minute)}
	if adm, err := lua.Load().Admit(context.Background(), e.rc, k, a); err != nil || adm.Outcome != lua.Admitted {
		t.Fatalf("admit: %+v %v", adm, err)
	}
	gs := e.g.sales.get([]byte(s.ID))
	var ctx fasthttp.RequestCtx
	e.g.publish(&ctx, gs, &flashgate.Order{ID: id, SaleID: s.ID, UserID: "alice", Quantity: 1, CreatedAt: now, ExpiresAt: now.Add(time.Minute)})
	if code := ctx.Response.StatusCode(); code != 503 {
		t.Fatalf("publish of an order whose id the stream holds for another order: %d %s, want 503", code, ctx.Response.Body())
	}
	if rem, resv := e.stock(s); rem != s.Total || resv != 0 {
		t.Fatalf("after the 503: remaining %d, %d reservations; want %d, 0 (released)", rem, resv, s.Total)
	}
}
