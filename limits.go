package flashgate

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
	"unicode"

	"go.mau.fi/util/confusable"
	"golang.org/x/text/unicode/norm"
)

// Purchase limits beyond per_user_limit (seed 001, "个人维度限制"): a sale may cap
// what one phone, device, client address, shipping address or account buys,
// in units or in orders, over the whole sale or per calendar day or month in
// the sale's time zone. Each limit is enforced by the admission script (one
// counter per subject and window, in the same atomic call as the stock) and
// re-checked by MySQL under a row guard (table limit_usage).

// Dimension is what a limit counts by.
type Dimension string

const (
	DimUser    Dimension = "user"    // the JWT sub
	DimPhone   Dimension = "phone"   // the JWT phone claim, normalised
	DimDevice  Dimension = "device"  // the JWT device claim
	DimIP      Dimension = "ip"      // the client address (an IPv6 client by its /64)
	DimAddress Dimension = "address" // the shipping address of the purchase body, normalised
)

// What a limit counts.
const (
	OfUnits  = "units"
	OfOrders = "orders"
)

// The window a limit counts over.
const (
	PerSale  = "sale"
	PerDay   = "day"
	PerMonth = "month"
)

// Limit is one purchase limit of a sale: at most Max units (or orders) per
// subject of Dimension, per window.
type Limit struct {
	Dimension Dimension `json:"dimension"`
	Max       int64     `json:"max"`
	Of        string    `json:"of,omitempty"`  // "units" (default) or "orders"
	Per       string    `json:"per,omitempty"` // "sale" (default), "day" or "month"
}

// Bounds of the limits of one sale and of the subjects they count.
const (
	MaxLimits         = 8
	MaxAddressBytes   = 512
	maxDeviceBytes    = 64
	minPhoneDigits    = 5
	maxPhoneDigits    = 20
	addressKeyBytes   = 16 // the address subject is this much of its SHA-256, in hex
	windowGraceMillis = int64(time.Hour / time.Millisecond)
)

func (l Limit) String() string {
	s := fmt.Sprintf("at most %d %s per %s", l.Max, l.unitWord(), l.Dimension)
	if l.Per != PerSale {
		s += " per " + l.Per
	}
	return s
}

func (l Limit) unitWord() string {
	w := strings.TrimSuffix(l.Of, "s")
	if l.Max != 1 {
		w += "s"
	}
	return w
}

// normalise fills the defaults and checks the limit.
func (l *Limit) normalise() error {
	if l.Of == "" {
		l.Of = OfUnits
	}
	if l.Per == "" {
		l.Per = PerSale
	}
	switch {
	case !l.Dimension.valid():
		return invalidf("limit dimension %q: must be one of user, phone, device, ip, address", l.Dimension)
	case l.Max < 1 || l.Max > MaxSaleUnits:
		return invalidf("limit max must be between 1 and %d", int64(MaxSaleUnits))
	case l.Of != OfUnits && l.Of != OfOrders:
		return invalidf("limit of %q: must be units or orders", l.Of)
	case l.Per != PerSale && l.Per != PerDay && l.Per != PerMonth:
		return invalidf("limit per %q: must be sale, day or month", l.Per)
	}
	return nil
}

func (d Dimension) valid() bool {
	switch d {
	case DimUser, DimPhone, DimDevice, DimIP, DimAddress:
		return true
	}
	return false
}

// validateLimits normalises the limits and the time zone of s.
func (s *Sale) validateLimits() error {
	if s.TimeZone == "" {
		s.TimeZone = "UTC"
	}
	if _, err := time.LoadLocation(s.TimeZone); err != nil {
		return invalidf("time_zone %q: not an IANA time zone", s.TimeZone)
	}
	if len(s.Limits) > MaxLimits {
		return invalidf("at most %d limits", MaxLimits)
	}
	seen := make(map[Limit]bool, len(s.Limits))
	for i := range s.Limits {
		l := &s.Limits[i]
		if err := l.normalise(); err != nil {
			return err
		}
		k := *l
		k.Max = 0
		if seen[k] {
			return invalidf("two limits of %s in %s per %s", l.Dimension, l.Of, l.Per)
		}
		seen[k] = true
	}
	return nil
}

// Location is the sale's time zone, in which day and month windows begin.
func (s *Sale) Location() (*time.Location, error) {
	if s.TimeZone == "" {
		return time.UTC, nil
	}
	return time.LoadLocation(s.TimeZone)
}

// Needs reports whether any limit of the sale counts by d.
func (s *Sale) Needs(d Dimension) bool {
	for _, l := range s.Limits {
		if l.Dimension == d {
			return true
		}
	}
	return false
}

// Subjects are who a purchase is by, in every dimension; a dimension no limit
// of the sale counts by may be left empty. Build them with the Normalise
// functions below.
type Subjects struct {
	User, Phone, Device, IP, Address string
}

// Of is the subject of dimension d.
func (s *Subjects) Of(d Dimension) string {
	switch d {
	case DimUser:
		return s.User
	case DimPhone:
		return s.Phone
	case DimDevice:
		return s.Device
	case DimIP:
		return s.IP
	case DimAddress:
		return s.Address
	}
	return ""
}

// MissingSubjectError says that a purchase lacks what a limit counts by.
type MissingSubjectError struct{ Dimension Dimension }

func (e *MissingSubjectError) Error() string {
	switch e.Dimension {
	case DimPhone, DimDevice:
		return fmt.Sprintf("this sale limits purchases per %s: the token has no %s claim", e.Dimension, e.Dimension)
	case DimAddress:
		return "this sale limits purchases per shipping address: address is required"
	}
	return fmt.Sprintf("this sale limits purchases per %s, which this request lacks", e.Dimension)
}

// Charge is what one order counts against one limit: Inc (its units, or 1 for
// an order limit) on Subject's counter of Limit (an index into Sale.Limits)
// in Window ("sale", "d20261122", "m202611").
type Charge struct {
	Limit   int
	Window  string
	Subject string
	Inc     int64
	// Ends is when Window ends (zero for the whole sale); not encoded.
	Ends time.Time
}

// Charges lists what an order of qty units by sub, placed at now, counts
// against each limit of the sale; loc is s.Location(). A subject a limit
// needs and sub lacks is a *MissingSubjectError.
func (s *Sale) Charges(sub Subjects, qty int64, now time.Time, loc *time.Location) ([]Charge, error) {
	if len(s.Limits) == 0 {
		return nil, nil
	}
	out := make([]Charge, len(s.Limits))
	for i, l := range s.Limits {
		subj := sub.Of(l.Dimension)
		if subj == "" {
			return nil, &MissingSubjectError{Dimension: l.Dimension}
		}
		c := Charge{Limit: i, Subject: subj, Inc: qty}
		if l.Of == OfOrders {
			c.Inc = 1
		}
		c.Window, c.Ends = Window(l.Per, now, loc)
		out[i] = c
	}
	return out, nil
}

// Window names the window of kind per ("sale", "day", "month") that now falls
// in, in loc, and when it ends (zero for the whole sale).
func Window(per string, now time.Time, loc *time.Location) (string, time.Time) {
	t := now.In(loc)
	y, m, d := t.Date()
	switch per {
	case PerDay:
		return fmt.Sprintf("d%04d%02d%02d", y, m, d), time.Date(y, m, d+1, 0, 0, 0, 0, loc)
	case PerMonth:
		return fmt.Sprintf("m%04d%02d", y, m), time.Date(y, m+1, 1, 0, 0, 0, 0, loc)
	}
	return PerSale, time.Time{}
}

// WindowEnd is when the window named id ends in loc; zero for "sale" (and
// for a name it cannot read).
func WindowEnd(id string, loc *time.Location) time.Time {
	if len(id) < 2 {
		return time.Time{}
	}
	n, err := strconv.Atoi(id[1:])
	if err != nil {
		return time.Time{}
	}
	switch {
	case id[0] == 'd' && len(id) == 9:
		return time.Date(n/10000, time.Month(n/100%100), n%100+1, 0, 0, 0, 0, loc)
	case id[0] == 'm' && len(id) == 7:
		return time.Date(n/100, time.Month(n%100)+1, 1, 0, 0, 0, 0, loc)
	}
	return time.Time{}
}

// TTL is how long a window's counter must live from now: to the window's end
// and an hour more (clocks differ), 0 for a counter of the whole sale.
func (c Charge) TTL(now time.Time) time.Duration {
	if c.Ends.IsZero() {
		return 0
	}
	return c.Ends.Sub(now) + time.Duration(windowGraceMillis)*time.Millisecond
}

// ExpiresAtMillis is when the counter of the charge's window may go, in Unix
// milliseconds: the window's end plus a grace (0 for the whole sale: never).
// Redis expires it by its own clock (PEXPIREAT), so no caller's clock sets
// how long a window's counts live.
func (c Charge) ExpiresAtMillis() int64 {
	if c.Ends.IsZero() {
		return 0
	}
	return c.Ends.UnixMilli() + windowGraceMillis
}

// Field is the charge's field in its window's counter hash: "<limit>/<subject>".
func (c Charge) Field() string { return strconv.Itoa(c.Limit) + "/" + c.Subject }

// EncodeCharges writes charges as "limit/window/inc/subject,…", the form
// orders carry them in (NATS messages, Redis records, MySQL rows). Subjects
// never hold ',' or '|' (see the Normalise functions).
func EncodeCharges(cs []Charge) string {
	if len(cs) == 0 {
		return ""
	}
	var b strings.Builder
	for i, c := range cs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(c.Limit))
		b.WriteByte('/')
		b.WriteString(c.Window)
		b.WriteByte('/')
		b.WriteString(strconv.FormatInt(c.Inc, 10))
		b.WriteByte('/')
		b.WriteString(c.Subject)
	}
	return b.String()
}

// ErrBadCharges marks an encoded charge list that does not parse.
var ErrBadCharges = errors.New("bad charges")

// ParseCharges reads what EncodeCharges wrote (Ends is left zero).
func ParseCharges(s string) ([]Charge, error) {
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > MaxLimits {
		return nil, fmt.Errorf("%w: %d charges", ErrBadCharges, len(parts))
	}
	out := make([]Charge, len(parts))
	for i, p := range parts {
		f := strings.SplitN(p, "/", 4)
		if len(f) != 4 || f[1] == "" || !validSubject(f[3]) {
			return nil, fmt.Errorf("%w: %q", ErrBadCharges, p)
		}
		lim, err1 := strconv.Atoi(f[0])
		inc, err2 := strconv.ParseInt(f[2], 10, 64)
		if err1 != nil || err2 != nil || lim < 0 || lim >= MaxLimits || inc < 1 {
			return nil, fmt.Errorf("%w: %q", ErrBadCharges, p)
		}
		out[i] = Charge{Limit: lim, Window: f[1], Inc: inc, Subject: f[3]}
	}
	return out, nil
}

// ValidSubject reports whether s could be a normalised subject (see
// validSubject): what an order's message may carry as a fact.
func ValidSubject(s string) bool { return validSubject(s) }

// validSubject reports whether s is 1-64 bytes of what normalised subjects
// are made of, [A-Za-z0-9_.:+/-]: nothing that JSON, the record separators of
// Redis ('|', ',') or a charge's own ('/' only after the subject starts) need
// escaped.
func validSubject(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("_.:+/-", c) >= 0) {
			return false
		}
	}
	return true
}

// NormalisePhone reduces a phone claim to "+" and digits (or digits alone),
// dropping spaces, dashes, dots and brackets; false if what is left is not 5
// to 20 digits.
func NormalisePhone(p string) (string, bool) {
	var b strings.Builder
	b.Grow(len(p))
	digits := 0
	for i, r := range p {
		switch {
		case r >= '0' && r <= '9':
			b.WriteRune(r)
			digits++
		case r == '+' && i == 0:
			b.WriteRune(r)
		case r == ' ' || r == '-' || r == '.' || r == '(' || r == ')':
		default:
			return "", false
		}
	}
	if digits < minPhoneDigits || digits > maxPhoneDigits {
		return "", false
	}
	return b.String(), true
}

// ValidDevice reports whether a device claim is 1-64 characters of
// [A-Za-z0-9_.:-].
func ValidDevice(d string) bool {
	if len(d) == 0 || len(d) > maxDeviceBytes {
		return false
	}
	for i := 0; i < len(d); i++ {
		c := d[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.' || c == ':') {
			return false
		}
	}
	return true
}

// IPSubject is the subject a client address counts as: an IPv4 address as
// itself, an IPv6 address by its /64 (one subscriber's network: a host picks
// any address inside it).
func IPSubject(a netip.Addr) string {
	a = a.Unmap()
	if !a.IsValid() {
		return ""
	}
	if a.Is4() {
		return a.String()
	}
	p, _ := a.Prefix(64)
	return p.String()
}

// NormaliseAddress reduces a shipping address to the key it is limited by, so
// that two spellings a person reads as one address count as one: Unicode NFKD
// (full-width letters and digits become ASCII, accented letters their base
// and a combining mark), lower case, without format characters (Cf: zero-width
// spaces and joiners, bidi controls) or non-spacing marks (Mn: accents,
// combining overlays), then the UTS #39 confusable skeleton (a Cyrillic "а"
// or a "０" is the Latin letter it looks like; "rn" and "m", "1" and "l" are
// one), without spaces, punctuation or symbols, hashed (SHA-256, 128 bits in
// hex) so that neither Redis nor the limit table holds the address itself.
// Two addresses that differ only so share a limit: a false match costs a
// buyer a shared quota, a miss lets a bot through. False when nothing is left
// or the address is over MaxAddressBytes.
func NormaliseAddress(addr string) (string, bool) {
	if len(addr) > MaxAddressBytes {
		return "", false
	}
	folded := strings.Map(addressRune, norm.NFKD.String(addr))
	skel := confusable.Skeleton(folded)
	var b strings.Builder
	b.Grow(len(skel))
	for _, r := range norm.NFKD.String(skel) {
		if r = addressRune(r); r >= 0 {
			b.WriteRune(r)
		}
	}
	if b.Len() == 0 {
		return "", false
	}
	sum := sha256.Sum256([]byte(b.String()))
	return hex.EncodeToString(sum[:addressKeyBytes]), true
}

// addressRune is r as an address key keeps it (lower case), or -1 for what it
// drops: format characters, non-spacing marks, spaces, punctuation, symbols
// and controls.
func addressRune(r rune) rune {
	switch {
	case unicode.Is(unicode.Cf, r), unicode.Is(unicode.Mn, r), unicode.IsSpace(r),
		unicode.IsPunct(r), unicode.IsSymbol(r), unicode.IsControl(r):
		return -1
	}
	return unicode.ToLower(r)
}
