package bus

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/config"
)

// The dead-letter stream keeps the order messages the backends gave up on
// (docs/design.md §7): poison orders that failed every delivery, and bodies that can
// never be parsed. Its subjects, <order_subject>_dlq.<kind>.<sale>, lie outside
// the orders stream's <order_subject>.>, so the work-queue consumer never sees
// them. Operators read it with `nats stream view`; nothing consumes it.

// Dead-letter kinds: the second token of a dead-letter subject.
const (
	DeadPoison      = "poison"      // decoded, failed MaxDeliver times
	DeadUnparseable = "unparseable" // can never be decoded
)

// Headers of a dead-lettered copy. Nats-Msg-Id is "dlq-<order id>" (poison) or
// "dlq-seq-<stream sequence>" (unparseable), so a backend that dies between
// dead-lettering and terminating the original does not store it twice.
const (
	HdrDeadKind       = "Flashgate-Dead-Kind"       // poison | unparseable
	HdrDeadError      = "Flashgate-Dead-Error"      // the last error
	HdrDeadSubject    = "Flashgate-Dead-Subject"    // the original subject
	HdrDeadSequence   = "Flashgate-Dead-Sequence"   // its sequence in the orders stream
	HdrDeadDeliveries = "Flashgate-Dead-Deliveries" // deliveries it had
	HdrDeadOrder      = "Flashgate-Dead-Order"      // the order id (poison only)
	HdrDeadAt         = "Flashgate-Dead-At"         // RFC 3339 time it was dead-lettered
	HdrDeadConsumer   = "Flashgate-Dead-Consumer"   // the durable consumer that gave up
)

const (
	deadLetterMaxAge  = 30 * 24 * time.Hour // a month to look at it
	deadLetterSubjSfx = "_dlq"
)

// DeadLetterStream is the name of the dead-letter stream beside cfg.Stream.
func DeadLetterStream(cfg config.NATS) string { return cfg.Stream + "_DLQ" }

// DeadLetterSubject is where a dead-lettered message of sale goes. A sale that
// is not a valid id (an unparseable message's subject may carry anything) is
// filed under "_".
func DeadLetterSubject(cfg config.NATS, kind, sale string) string {
	if !flashgate.ValidID(sale) {
		sale = "_"
	}
	return cfg.OrderSubject + deadLetterSubjSfx + "." + kind + "." + sale
}

// SaleOfSubject is the sale token of an orders-stream subject ("" if the
// subject is not <order_subject>.<sale>).
func SaleOfSubject(cfg config.NATS, subject string) string {
	sale, ok := strings.CutPrefix(subject, cfg.OrderSubject+".")
	if !ok || strings.Contains(sale, ".") {
		return ""
	}
	return sale
}

// EnsureDeadLetterStream creates or updates the dead-letter stream: file
// storage, limits retention (kept a month, nobody acks it), the orders stream's
// replicas and duplicate window.
func EnsureDeadLetterStream(ctx context.Context, js jetstream.JetStream, cfg config.NATS) (jetstream.Stream, error) {
	name := DeadLetterStream(cfg)
	s, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        name,
		Description: "flashgate order messages given up on (poison, unparseable)",
		Subjects:    []string{cfg.OrderSubject + deadLetterSubjSfx + ".>"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      deadLetterMaxAge,
		Duplicates:  cfg.DedupWindow,
		Replicas:    cfg.Replicas,
		MaxMsgSize:  orNone32(cfg.MaxMsgSize),
		MaxBytes:    orNone(cfg.MaxBytes),
	})
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	return s, nil
}
