package flashgate

import (
	"errors"
	"testing"
	"time"
)

// degrade and degrade_rate: closed (or absent) and mysql, a rate only with
// mysql and within bounds; "closed" is stored as the default it is.
func TestDegradeSpec(t *testing.T) {
	base := func(mode string, rate int64) *Sale {
		now := time.Now()
		return &Sale{ID: "s", Title: "t", Total: 10, StartsAt: now, EndsAt: now.Add(time.Hour),
			PerUserLimit: 1, PerOrderMax: 1, Degrade: mode, DegradeRate: rate}
	}
	ok := []struct {
		mode      string
		rate      int64
		wantMode  string
		wantLimit int64
	}{
		{"", 0, DegradeClosed, 0},
		{DegradeClosed, 0, DegradeClosed, 0},
		{DegradeMySQL, 0, DegradeMySQL, DefaultDegradeRate},
		{DegradeMySQL, 7, DegradeMySQL, 7},
		{DegradeMySQL, MaxDegradeRate, DegradeMySQL, MaxDegradeRate},
	}
	for _, c := range ok {
		s := base(c.mode, c.rate)
		if err := s.Validate(); err != nil {
			t.Errorf("%q/%d: %v", c.mode, c.rate, err)
			continue
		}
		if s.DegradeMode() != c.wantMode || s.DegradeLimit() != c.wantLimit {
			t.Errorf("%q/%d: mode %s limit %d", c.mode, c.rate, s.DegradeMode(), s.DegradeLimit())
		}
		if c.mode == DegradeClosed && s.Degrade != "" {
			t.Errorf("closed kept as %q", s.Degrade)
		}
	}
	bad := []struct {
		mode string
		rate int64
	}{
		{"redis", 0}, {"MySQL", 0}, {DegradeMySQL, -1}, {DegradeMySQL, MaxDegradeRate + 1}, {DegradeClosed, 5}, {"", 5},
	}
	for _, c := range bad {
		if err := base(c.mode, c.rate).Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%q/%d: %v, want invalid", c.mode, c.rate, err)
		}
	}
	split := base(DegradeMySQL, 0)
	split.Buckets = 4
	if err := split.Validate(); !errors.Is(err, ErrInvalid) {
		t.Errorf("degrade mysql on a sale with 4 buckets: %v, want invalid", err)
	}
	split.Degrade = DegradeClosed
	if err := split.Validate(); err != nil {
		t.Errorf("a split sale that fails closed: %v", err)
	}
}
