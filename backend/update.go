package backend

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"time"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/bus"
	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/mysql"
)

// saleSummary is one sale of GET /admin/v1/sales: its spec and MySQL's
// count of units sold.
type saleSummary struct {
	*flashgate.Sale
	Sold int64 `json:"sold"`
}

// listSales is GET /admin/v1/sales[?limit=N]: the newest sales by start
// (default 100, at most 1000), from MySQL.
func (a *adminAPI) listSales(w http.ResponseWriter, r *http.Request) {
	limit := 100
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			writeError(w, http.StatusBadRequest, flashgate.CodeInvalidRequest, "limit: a number from 1 to 1000")
			return
		}
		limit = n
	}
	ids, err := mysql.SaleIDs(r.Context(), a.db, limit)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, "MySQL: "+err.Error())
		return
	}
	out := make([]saleSummary, 0, len(ids))
	for _, id := range ids {
		row, err := loadSale(r.Context(), a.db, id)
		if errors.Is(err, errSaleNotFound) {
			continue
		}
		if err != nil {
			writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, "MySQL: "+err.Error())
			return
		}
		out = append(out, saleSummary{Sale: &row.Sale, Sold: row.Sold})
	}
	writeJSON(w, http.StatusOK, map[string]any{"sales": out})
}

// salePatch is the body of PATCH /admin/v1/sales/{sale}: the fields to
// change, the others left out.
type salePatch struct {
	StartsAt     *time.Time `json:"starts_at"`
	EndsAt       *time.Time `json:"ends_at"`
	Total        *int64     `json:"total"`
	PerUserLimit *int64     `json:"per_user_limit"`
	PerOrderMax  *int64     `json:"per_order_max"`
	// Limits: the sale's purchase limits with new maxima, the same limits
	// in the same order (dimension, of and per cannot change).
	Limits *[]flashgate.Limit `json:"limits"`
	// Regions: the units of each region of a sale with regions, the same
	// regions (none added or removed); the total becomes their sum.
	Regions *map[string]int64 `json:"regions"`
}

// updateRefusal is an update that would invalidate what the sale has already
// counted: 409 conflict with the reason.
type updateRefusal struct{ reason string }

func (r updateRefusal) Error() string { return r.reason }

func refuse(format string, a ...any) error { return updateRefusal{fmt.Sprintf(format, a...)} }

// updateSale is PATCH /admin/v1/sales/{sale}: a new window, total,
// per_user_limit or per_order_max for an open sale. A change that would
// invalidate a count already taken is refused (409 conflict, with the reason):
// per_user_limit below what a buyer holds or has reserved, a total that
// removes units sold or reserved, a start moved once the sale has started, an
// end in the past (close the sale instead). The total of a sale with regions is
// the sum of its regions and does not change here.
//
// Under the sale row lock (batch writers of the sale wait), MySQL's counts are
// checked, then Redis checks its own and changes the spec and stock in one
// script (lua.Update; on a sale split over stock buckets, bucket by bucket,
// docs/buckets.md), then MySQL commits. Gateways learn the new spec by the
// created event and their refresh.
func (a *adminAPI) updateSale(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("sale")
	var p salePatch
	if err := decodeStrict(w, r, &p); err != nil {
		writeError(w, http.StatusBadRequest, flashgate.CodeInvalidRequest, "body: "+err.Error())
		return
	}
	if p == (salePatch{}) {
		writeError(w, http.StatusBadRequest, flashgate.CodeInvalidRequest,
			"body: nothing to change (starts_at, ends_at, total, per_user_limit, per_order_max, limits, regions)")
		return
	}
	before, ok := a.saleOr404(w, r, id)
	if !ok {
		return
	}
	sale, err := a.applyPatch(r, id, &p)
	var no updateRefusal
	switch {
	case errors.As(err, &no):
		writeError(w, http.StatusConflict, flashgate.CodeConflict, "sale "+id+": "+no.reason)
		return
	case errors.Is(err, flashgate.ErrInvalid):
		writeError(w, http.StatusBadRequest, flashgate.CodeInvalidRequest, err.Error())
		return
	case errors.Is(err, errSaleNotFound):
		writeError(w, http.StatusNotFound, flashgate.CodeSaleNotFound, "no sale "+id)
		return
	case err != nil:
		a.log.Error("update sale", "sale", id, "err", err)
		writeError(w, http.StatusServiceUnavailable, flashgate.CodeUnavailable, err.Error())
		return
	}
	a.events.publish(bus.SaleEvent{Type: bus.EventCreated, SaleID: id, Sale: sale})
	a.log.Info("sale updated", "sale", id, "total", sale.Total, "starts_at", sale.StartsAt, "ends_at", sale.EndsAt,
		"per_user_limit", sale.PerUserLimit, "per_order_max", sale.PerOrderMax)
	a.record(r, change{action: "update", sale: id, before: &before.Sale, after: sale})
	writeJSON(w, http.StatusOK, sale)
}

func (a *adminAPI) applyPatch(r *http.Request, id string, p *salePatch) (*flashgate.Sale, error) {
	ctx := r.Context()
	now := time.Now().UTC()
	tx, err := mysql.Begin(ctx, a.db)
	if err != nil {
		return nil, fmt.Errorf("MySQL: %w", err)
	}
	defer tx.Rollback()
	if found, err := mysql.LockSale(ctx, tx, id); err != nil {
		return nil, fmt.Errorf("MySQL: %w", err)
	} else if !found {
		return nil, errSaleNotFound
	}
	row, err := loadSale(ctx, tx, id)
	if err != nil {
		return nil, fmt.Errorf("MySQL: %w", err)
	}
	retired, err := saleRetired(ctx, tx, id)
	if err != nil {
		return nil, fmt.Errorf("MySQL: %w", err)
	}
	old := row.Sale
	switch {
	case old.Closed:
		return nil, refuse("it is closed")
	case retired != nil || !old.EndsAt.After(now):
		return nil, refuse("it ended at %s", old.EndsAt.Format(time.RFC3339))
	}
	s := old
	if p.StartsAt != nil {
		s.StartsAt = p.StartsAt.UTC().Truncate(time.Millisecond)
	}
	if p.EndsAt != nil {
		s.EndsAt = p.EndsAt.UTC().Truncate(time.Millisecond)
	}
	if p.Total != nil {
		s.Total = *p.Total
	}
	if p.PerUserLimit != nil {
		s.PerUserLimit = *p.PerUserLimit
	}
	if p.PerOrderMax != nil {
		s.PerOrderMax = *p.PerOrderMax
	}
	if p.Limits != nil {
		s.Limits = append([]flashgate.Limit(nil), *p.Limits...)
	}
	if p.Regions != nil {
		if err := patchRegions(&old, &s, *p.Regions, p.Total != nil); err != nil {
			return nil, err
		}
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	lowered, err := loweredLimits(&old, &s, now)
	if err != nil {
		return nil, err
	}
	switch {
	case !s.StartsAt.Equal(old.StartsAt) && !old.StartsAt.After(now):
		return nil, refuse("it started at %s: its start cannot move", old.StartsAt.Format(time.RFC3339))
	case !s.EndsAt.After(now):
		return nil, refuse("ends_at %s is not in the future (to stop selling now: flashgate sale close)", s.EndsAt.Format(time.RFC3339))
	case s.Total != old.Total && len(old.Regions) > 0 && p.Regions == nil:
		return nil, refuse("its total is the sum of its regions' units and cannot change alone")
	case s.Total < row.Sold:
		return nil, refuse("total %d is below the %d units sold", s.Total, row.Sold)
	}
	for _, r := range s.RegionNames() {
		if s.Regions[r] < row.RegionSold[r] {
			return nil, refuse("region %s: %d units is below the %d sold there", r, s.Regions[r], row.RegionSold[r])
		}
	}
	if s.PerUserLimit < old.PerUserLimit {
		most, err := mysql.MostUnitsOneBuyer(ctx, tx, id)
		if err != nil {
			return nil, fmt.Errorf("MySQL: %w", err)
		}
		if most > s.PerUserLimit {
			return nil, refuse("per_user_limit %d is below the %d units a buyer already bought", s.PerUserLimit, most)
		}
	}
	for _, l := range lowered {
		most, err := mysql.MostUsed(ctx, tx, id, l.Index, l.Window)
		if err != nil {
			return nil, fmt.Errorf("MySQL: %w", err)
		}
		if most > l.Max {
			return nil, refuse("limit %d (%s): max %d is below the %d one subject already used", l.Index, s.Limits[l.Index].Dimension, l.Max, most)
		}
	}
	if err := mysql.UpdateSale(ctx, tx, &s, now); err != nil {
		return nil, fmt.Errorf("MySQL: %w", err)
	}
	// deltas: each stock's change (the sale's, or each region's).
	deltas := map[string]int64{"": s.Total - old.Total}
	if len(old.Regions) > 0 {
		deltas = map[string]int64{}
		for _, r := range s.RegionNames() {
			deltas[r] = s.Regions[r] - old.Regions[r]
		}
		if err := mysql.UpdateSaleRegions(ctx, tx, &s); err != nil {
			return nil, fmt.Errorf("MySQL: %w", err)
		}
	}
	// Redis holds what MySQL has not settled yet (reservations): its script
	// refuses what they would break, atomically with the change (bucket by
	// bucket on a split sale, each refusal undone: docs/buckets.md).
	err = lua.UpdateWait(ctx, a.rc, &s, deltas, lowered, a.waitReplicas, a.waitTimeout)
	switch {
	case errors.Is(err, lua.ErrOverLimit):
		return nil, refuse("per_user_limit %d: %v", s.PerUserLimit, err)
	case errors.Is(err, lua.ErrOverMax):
		return nil, refuse("limits: %v (reserved or bought)", err)
	case errors.Is(err, lua.ErrStockTaken):
		return nil, refuse("total %d: %v", s.Total, err)
	case errors.Is(err, lua.ErrNotWarmed):
		// Redis does not hold the sale: its warm will read the new spec.
	case err != nil:
		return nil, fmt.Errorf("Redis: %w", err)
	}
	if err := tx.Commit(); err != nil {
		// Redis has the new spec and MySQL not: put the old one back.
		back := map[string]int64{}
		for r, d := range deltas {
			back[r] = -d
		}
		if uerr := lua.UpdateWait(ctx, a.rc, &old, back, nil, a.waitReplicas, a.waitTimeout); uerr != nil && !errors.Is(uerr, lua.ErrNotWarmed) {
			a.log.Error("update sale: MySQL did not commit and Redis keeps the new spec; reconcile repairs the stock", "sale", id, "err", uerr)
		}
		return nil, fmt.Errorf("MySQL: %w", err)
	}
	return &s, nil
}

// patchRegions sets s's regions to units, the same regions as old's, and its
// total to their sum (a total given as well must be that sum).
func patchRegions(old, s *flashgate.Sale, units map[string]int64, totalGiven bool) error {
	if len(old.Regions) == 0 {
		return refuse("it has no regions (change its total)")
	}
	if len(units) != len(old.Regions) {
		return refuse("it has the regions %v: a live sale's regions can change their units, not be added or removed", old.RegionNames())
	}
	var sum int64
	for r, n := range units {
		if _, ok := old.Regions[r]; !ok {
			return refuse("it has no region %q (regions: %v)", r, old.RegionNames())
		}
		sum += n
	}
	if totalGiven && s.Total != sum {
		return fmt.Errorf("%w: total %d is not the sum of the regions' units (%d)", flashgate.ErrInvalid, s.Total, sum)
	}
	s.Regions = maps.Clone(units)
	s.Total = sum
	return nil
}

// loweredLimits checks that the new limits are the old ones with other
// maxima (what a limit counts, and over which window, cannot change on a live
// sale: the counts taken would mean something else), and lists those whose max
// goes down, with the window each counts now.
func loweredLimits(old, s *flashgate.Sale, now time.Time) ([]lua.Lowered, error) {
	if len(old.Limits) != len(s.Limits) {
		return nil, refuse("it has %d purchase limits: a live sale's limits can change their max, not be added or removed", len(old.Limits))
	}
	loc, err := s.Location()
	if err != nil {
		return nil, err
	}
	var out []lua.Lowered
	for i, o := range old.Limits {
		n := s.Limits[i]
		if n.Dimension != o.Dimension || n.Of != o.Of || n.Per != o.Per {
			return nil, refuse("limit %d is %s: only its max can change", i, o)
		}
		if n.Max < o.Max {
			w, _ := flashgate.Window(n.Per, now, loc)
			out = append(out, lua.Lowered{Index: i, Window: w, Max: n.Max})
		}
	}
	return out, nil
}
