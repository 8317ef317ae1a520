package flashgate

// The degraded lane (docs/degrade.md): what a sale's purchases meet while its
// Redis shard is unreachable.
const (
	// DegradeClosed answers 503 at once (the default, also written "").
	DegradeClosed = "closed"
	// DegradeMySQL decides purchases in MySQL, under the sale row lock, with
	// the admission script's checks.
	DegradeMySQL = "mysql"
	// DefaultDegradeRate is a lane's purchases in flight per gateway when
	// degrade_rate is not given.
	DefaultDegradeRate = 32
	// MaxDegradeRate bounds degrade_rate: every lane purchase holds a MySQL
	// connection and waits for the sale row lock.
	MaxDegradeRate = 1024
)

// DegradeMode is the sale's degrade mode, "" read as DegradeClosed.
func (s *Sale) DegradeMode() string {
	if s.Degrade == "" {
		return DegradeClosed
	}
	return s.Degrade
}

// DegradeLimit is the lane's purchases in flight per gateway (0 when the sale
// has no lane).
func (s *Sale) DegradeLimit() int64 {
	if s.DegradeMode() != DegradeMySQL {
		return 0
	}
	if s.DegradeRate == 0 {
		return DefaultDegradeRate
	}
	return s.DegradeRate
}

func (s *Sale) validateDegrade() error {
	switch s.Degrade {
	case DegradeClosed:
		s.Degrade = "" // the default, spelled one way
	case "", DegradeMySQL:
	default:
		return invalidf("degrade %q: must be closed or mysql", s.Degrade)
	}
	if s.DegradeRate < 0 || s.DegradeRate > MaxDegradeRate {
		return invalidf("degrade_rate must be between 1 and %d", MaxDegradeRate)
	}
	if s.DegradeRate > 0 && s.DegradeMode() != DegradeMySQL {
		return invalidf("degrade_rate needs degrade: mysql")
	}
	// The lane's rewarm rebuilds one set of keys; a split sale's buckets live
	// on several masters, and losing one is met bucket by bucket instead
	// (docs/buckets.md, docs/degrade.md).
	if s.DegradeMode() == DegradeMySQL && s.BucketCount() > 1 {
		return invalidf("degrade: mysql is for a sale without buckets")
	}
	return nil
}

// LaneOutcome is what the lane decided, one for each outcome of admit.lua
// that can happen here.
type LaneOutcome string

const (
	LaneAdmitted     LaneOutcome = "ok"
	LaneReplayed     LaneOutcome = "replay"
	LaneNotStarted   LaneOutcome = "not_started"
	LaneEnded        LaneOutcome = "ended"
	LanePaused       LaneOutcome = "paused"
	LaneBadQuantity  LaneOutcome = "bad_quantity"
	LaneLimitReached LaneOutcome = "limit_reached"
	LaneSoldOut      LaneOutcome = "sold_out"
	LaneDuplicateID  LaneOutcome = "duplicate_id"
	// LaneUnknownSale: MySQL has no such sale (the script's not_warmed).
	LaneUnknownSale LaneOutcome = "unknown_sale"
	// LaneBadOrder: a region the sale lacks, or a limit's subject missing —
	// what the gateway refuses before the admission; the lane refuses it too.
	LaneBadOrder LaneOutcome = "bad_order"
	// LaneFresh: Redis answers and holds every order of the sale: the
	// gateway runs the admission there.
	LaneFresh LaneOutcome = "fresh"
)
