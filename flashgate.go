// Package flashgate defines the domain of a flash sale: sales, orders, the
// outcome codes of a purchase and the rules that validate them. It imports no
// Redis, NATS, MySQL or HTTP code; the packages named for those adapt them to
// these types (see docs/design.md §1 for the funnel they form).
package flashgate

import (
	"errors"
	"fmt"
	"sort"
	"time"
)

// Code is a machine-readable outcome of a request, as listed in docs/design.md §3.
type Code string

// Codes of docs/design.md §3 (binding: clients switch on them).
const (
	CodeAccepted       Code = "accepted"
	CodeInvalidRequest Code = "invalid_request"
	CodeUnauthorized   Code = "unauthorized"
	CodeLimitReached   Code = "limit_reached"
	CodeSaleNotFound   Code = "sale_not_found"
	CodeOrderNotFound  Code = "order_not_found"
	CodeSoldOut        Code = "sold_out"
	CodeEnded          Code = "ended"
	CodeBodyTooLarge   Code = "body_too_large"
	CodeNotStarted     Code = "not_started"
	CodeRateLimited    Code = "rate_limited"
	CodeUnavailable    Code = "unavailable"
	CodeConflict       Code = "conflict"
	CodeOrderClosed    Code = "order_closed"
	CodeInternal       Code = "internal"

	// The payment callback's (docs/design.md §3 "Payments", docs/payments.md).
	// CodeForbidden: a buyer asked to mark an order paid; only the shop's
	// payment service can (POST /v1/payments).
	CodeForbidden Code = "forbidden"
	// CodeBadSignature: the Flashgate-Signature header is missing, malformed,
	// outside the replay window, or matches no payments secret.
	CodeBadSignature Code = "bad_signature"
	// CodeAmountMismatch: the amount paid is not the order's price × quantity.
	CodeAmountMismatch Code = "amount_mismatch"
	// CodeAlreadyPaid: the order is paid already, by another payment_id.
	CodeAlreadyPaid Code = "already_paid"
	// CodePaymentIDUsed: the payment_id has paid another order.
	CodePaymentIDUsed Code = "payment_id_used"
	// CodePaused: the sale is paused by an operator (sale pause); nothing was reserved.
	CodePaused Code = "paused"
)

// SaleState is the public state of a sale as GET /v1/sales/{sale} reports it.
type SaleState string

const (
	SaleUpcoming SaleState = "upcoming"
	SaleActive   SaleState = "active"
	SaleSoldOut  SaleState = "sold_out"
	SaleEnded    SaleState = "ended"
)

// Sale is one flash sale: a number of units of one item sold in a time window.
type Sale struct {
	ID           string           `json:"id"`
	Title        string           `json:"title"`
	PriceCents   int64            `json:"price_cents"`
	Total        int64            `json:"total"`
	StartsAt     time.Time        `json:"starts_at"`
	EndsAt       time.Time        `json:"ends_at"`
	PerUserLimit int64            `json:"per_user_limit"`
	PerOrderMax  int64            `json:"per_order_max"`
	Regions      map[string]int64 `json:"regions,omitempty"`
	// Limits beyond per_user_limit (limits.go); TimeZone (IANA, default UTC)
	// is where their day and month windows begin.
	Limits   []Limit `json:"limits,omitempty"`
	TimeZone string  `json:"time_zone,omitempty"`
	Closed   bool    `json:"closed,omitempty"`
	// Paused: purchases answer 503 paused until the sale resumes (docs/runbook.md);
	// nothing is reserved meanwhile. A pause does not move the window.
	Paused bool `json:"paused,omitempty"`
	// Degrade is what purchases meet while the sale's Redis shard is
	// unreachable (degrade.go): DegradeClosed ("" too) answers 503,
	// DegradeMySQL decides them in MySQL, at most DegradeRate at once per
	// gateway.
	Degrade     string `json:"degrade,omitempty"`
	DegradeRate int64  `json:"degrade_rate,omitempty"`
	// Buckets splits the stock over that many Redis hash tags (1..MaxBuckets;
	// 0 means 1: docs/buckets.md); BucketTags are their tags' suffixes, chosen
	// from the cluster's slot map when the sale is created (lua.ChooseBucketTags).
	Buckets    int      `json:"buckets,omitempty"`
	BucketTags []string `json:"bucket_tags,omitempty"`
}

// MaxBuckets is the most stock buckets a sale may have.
const MaxBuckets = 64

// BucketCount is the number of stock buckets of the sale (1 when not split).
func (s *Sale) BucketCount() int { return max(1, s.Buckets) }

// Limits on sale specs; they keep Redis and MySQL integer maths far from overflow.
const (
	MaxSaleUnits  = 1 << 40
	MaxTitleBytes = 200
	maxRegions    = 64
)

// ErrInvalid marks a request or spec that breaks a rule; errors.Is(err, ErrInvalid).
var ErrInvalid = errors.New("invalid")

func invalidf(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, a...)...)
}

// Validate checks a sale spec as the admin API receives it, and fills the
// defaults of its limits and time zone.
func (s *Sale) Validate() error {
	switch {
	case !ValidID(s.ID):
		return invalidf("id must be 1-64 characters of [A-Za-z0-9_-]")
	case s.Title == "" || len(s.Title) > MaxTitleBytes:
		return invalidf("title must be 1-%d bytes", MaxTitleBytes)
	case s.PriceCents < 0:
		return invalidf("price_cents must not be negative")
	case s.Total < 1 || s.Total > MaxSaleUnits:
		return invalidf("total must be between 1 and %d", int64(MaxSaleUnits))
	case s.StartsAt.IsZero() || s.EndsAt.IsZero():
		return invalidf("starts_at and ends_at are required (RFC 3339)")
	case !s.EndsAt.After(s.StartsAt):
		return invalidf("ends_at must be after starts_at")
	case s.PerUserLimit < 1 || s.PerUserLimit > s.Total:
		return invalidf("per_user_limit must be between 1 and total")
	case s.PerOrderMax < 1 || s.PerOrderMax > s.PerUserLimit:
		return invalidf("per_order_max must be between 1 and per_user_limit")
	}
	switch {
	case s.Buckets < 0 || s.Buckets > MaxBuckets:
		return invalidf("buckets must be between 1 and %d", MaxBuckets)
	case len(s.BucketTags) > 0 && len(s.BucketTags) != s.Buckets:
		return invalidf("bucket_tags must name one tag per bucket")
	case int64(s.BucketCount()) > s.Total:
		return invalidf("buckets must not exceed total")
	}
	if len(s.Regions) > 0 {
		if len(s.Regions) > maxRegions {
			return invalidf("at most %d regions", maxRegions)
		}
		var sum int64
		for r, n := range s.Regions {
			if !ValidRegion(r) {
				return invalidf("region %q must be 1-16 characters of [a-z0-9_-]", r)
			}
			if n < 0 || n > s.Total {
				return invalidf("region %q units must be between 0 and total", r)
			}
			sum += n
		}
		if sum != s.Total {
			return invalidf("regions add up to %d, total is %d", sum, s.Total)
		}
	}
	if err := s.validateDegrade(); err != nil {
		return err
	}
	if err := s.validateLimits(); err != nil {
		return err
	}
	// A split sale may have limits of every dimension: each subject's
	// counter lives in one bucket, which every buyer sharing it meets at
	// (docs/buckets.md).
	return nil
}

// RegionNames returns the sale's regions in a stable order.
func (s *Sale) RegionNames() []string {
	names := make([]string, 0, len(s.Regions))
	for r := range s.Regions {
		names = append(names, r)
	}
	sort.Strings(names)
	return names
}

// StateAt is the public state at time now, given whether stock is left.
func (s *Sale) StateAt(now time.Time, remaining int64) SaleState {
	switch {
	case s.Closed || !now.Before(s.EndsAt):
		return SaleEnded
	case now.Before(s.StartsAt):
		return SaleUpcoming
	case remaining <= 0:
		return SaleSoldOut
	default:
		return SaleActive
	}
}

// ValidID reports whether id is 1-64 characters of [A-Za-z0-9_-]: the rule for
// sale ids, user ids (JWT sub) and idempotency keys.
func ValidID(id string) bool { return validChars(id, 64, true) }

// ValidIDBytes is ValidID for a byte slice, for the allocation-free hot path.
func ValidIDBytes(id []byte) bool { return validChars(id, 64, true) }

// ValidRegion reports whether r is 1-16 characters of [a-z0-9_-].
func ValidRegion(r string) bool { return validChars(r, 16, false) }

func validChars[T string | []byte](s T, max int, upper bool) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '_', c == '-':
		case upper && c >= 'A' && c <= 'Z':
		default:
			return false
		}
	}
	return true
}
