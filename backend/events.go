package backend

import (
	"log/slog"

	"github.com/nats-io/nats.go"

	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/config"
)

// saleEvents publishes sale events (created, closed, restocked) for the
// gateways. The admin API, the lifecycle and reconcile share it.
type saleEvents struct {
	nc  *nats.Conn
	cfg config.NATS
	log *slog.Logger
}

// publish sends a sale event; a lost event heals (gateways refresh), so a
// failure is only logged.
func (e *saleEvents) publish(ev bus.SaleEvent) {
	if err := bus.PublishEvent(e.nc, e.cfg, ev); err != nil {
		e.log.Warn("publish sale event", "sale", ev.SaleID, "type", ev.Type, "err", err)
	}
}
