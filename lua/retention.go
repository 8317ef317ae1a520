package lua

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
)

// Retention (docs/retention.md). Redis indexes the sales it holds twice:
// SalesIndex, the set of them all, and LiveIndex, the same ids scored by
// ends_at (unix ms), so that a gateway's refresh reads only the sales that have
// not ended long ago (LiveSales) however many ended ones Redis still holds. The
// backend leader removes a sale that is over and settled from both, with every
// key of its hash tag (Retire).

// indexSale records sale in both indexes. The two keys live outside any sale's
// hash tag (on a Cluster, on their own slots), so they are written apart from
// the sale's keys, after them: an index entry without keys reads as "not
// warmed", never the other way round.
func indexSale(ctx context.Context, c rueidis.Client, sale *flashgate.Sale) error {
	for _, r := range c.DoMulti(ctx,
		c.B().Sadd().Key(SalesIndex).Member(sale.ID).Build(),
		c.B().Zadd().Key(LiveIndex).ScoreMember().ScoreMember(float64(sale.EndsAt.UnixMilli()), sale.ID).Build(),
	) {
		if err := r.Error(); err != nil {
			return err
		}
	}
	return nil
}

// LiveSales lists the sales Redis holds that end after since (ended ones
// too, if they ended after it; closed ones until they are retired).
func LiveSales(ctx context.Context, c rueidis.Client, since time.Time) ([]string, error) {
	ids, err := c.Do(ctx, c.B().Zrange().Key(LiveIndex).Min("("+strconv.FormatInt(since.UnixMilli(), 10)).Max("+inf").
		Byscore().Build()).AsStrSlice()
	if err != nil {
		return nil, fmt.Errorf("live sales: %w", err)
	}
	return ids, nil
}

// Unindex removes sale from both indexes (its keys stay: see Retire).
func Unindex(ctx context.Context, c rueidis.Client, sale string) error {
	for _, r := range c.DoMulti(ctx,
		c.B().Zrem().Key(LiveIndex).Member(sale).Build(),
		c.B().Srem().Key(SalesIndex).Member(sale).Build(),
	) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("unindex %s: %w", sale, err)
		}
	}
	return nil
}

// BackfillLive scores in LiveIndex each sale of SalesIndex it lacks (sales
// warmed before LiveIndex existed), from the ends_at of its meta. A sale
// without meta is left out: warming it indexes it. It answers how many it
// added. Round trips go by backfillChunk sales.
func BackfillLive(ctx context.Context, c rueidis.Client) (int, error) {
	ids, err := c.Do(ctx, c.B().Smembers().Key(SalesIndex).Build()).AsStrSlice()
	if err != nil {
		return 0, fmt.Errorf("backfill live index: %w", err)
	}
	added := 0
	for start := 0; start < len(ids); start += backfillChunk {
		part := ids[start:min(start+backfillChunk, len(ids))]
		scores, err := c.Do(ctx, c.B().Zmscore().Key(LiveIndex).Member(part...).Build()).ToArray()
		if err != nil {
			return added, fmt.Errorf("backfill live index: %w", err)
		}
		var missing []string
		var gets rueidis.Commands
		for i, sc := range scores {
			if sc.IsNil() {
				missing = append(missing, part[i])
				gets = append(gets, c.B().Hget().Key(KeysFor(part[i], nil).Meta).Field("ends").Build())
			}
		}
		if len(missing) == 0 {
			continue
		}
		zadd := c.B().Zadd().Key(LiveIndex).Nx().ScoreMember() // NX: a warm that raced us scored it already
		n := 0
		for i, r := range c.DoMulti(ctx, gets...) {
			ends, err := r.AsInt64()
			if rueidis.IsRedisNil(err) {
				continue
			}
			if err != nil {
				return added, fmt.Errorf("backfill live index %s: %w", missing[i], err)
			}
			zadd = zadd.ScoreMember(float64(ends), missing[i])
			n++
		}
		if n == 0 {
			continue
		}
		k, err := c.Do(ctx, zadd.Build()).AsInt64()
		if err != nil {
			return added, fmt.Errorf("backfill live index: %w", err)
		}
		added += int(k)
	}
	return added, nil
}

// backfillChunk bounds the sales of one round trip of BackfillLive.
const backfillChunk = 500

// AllKeys lists every key sale may have in Redis: every key of its layout
// (KeysFor: a key added there is listed here by construction), and the limit
// counters of every window an admission between the sale's start and end can
// have charged (a day either side for clocks).
func AllKeys(sale *flashgate.Sale) []string {
	all := KeysOf(sale)
	keys := all.perSale()
	for _, b := range all.buckets {
		keys = append(keys, b.perSale()...)
	}
	if len(sale.Limits) == 0 {
		return keys
	}
	// A split sale's limit counters are in its buckets (each buyer's home).
	tags := []*Keys{all}
	if len(all.buckets) > 0 {
		tags = all.buckets
	}
	for _, k := range tags {
		keys = append(keys, k.limitKeys(sale)...)
	}
	return keys
}

// limitKeys lists the limit counters of one tag of sale (see AllKeys).
func (k *Keys) limitKeys(sale *flashgate.Sale) []string {
	keys := []string{k.Limit(flashgate.PerSale)}
	loc, err := sale.Location()
	if err != nil {
		loc = time.UTC
	}
	seen := map[string]bool{flashgate.PerSale: true}
	for _, l := range sale.Limits {
		if l.Per != flashgate.PerDay && l.Per != flashgate.PerMonth {
			continue
		}
		from, to := sale.StartsAt.Add(-24*time.Hour), sale.EndsAt.Add(24*time.Hour)
		for t := from; ; t = t.Add(24 * time.Hour) {
			if t.After(to) {
				t = to // the last window, whatever the step skipped
			}
			if w, _ := flashgate.Window(l.Per, t, loc); !seen[w] {
				seen[w] = true
				keys = append(keys, k.Limit(w))
			}
			if t.Equal(to) {
				break
			}
		}
	}
	return keys
}

// retireChunk bounds the keys of one DEL.
const retireChunk = 512

// Retire removes sale from Redis: its entries in both indexes first (a
// gateway's refresh stops reading it), then every key of AllKeys. Every key
// carries the sale's hash tag, so each DEL goes to the sale's one shard. It is
// idempotent; it answers how many keys it deleted.
func Retire(ctx context.Context, c rueidis.Client, sale *flashgate.Sale) (int64, error) {
	if err := Unindex(ctx, c, sale.ID); err != nil {
		return 0, fmt.Errorf("retire %s: %w", sale.ID, err)
	}
	// One DEL per slot: a split sale's buckets are on slots of their own.
	bySlot := map[int][]string{}
	var slots []int
	for _, key := range AllKeys(sale) {
		sl := Slot(key)
		if _, ok := bySlot[sl]; !ok {
			slots = append(slots, sl)
		}
		bySlot[sl] = append(bySlot[sl], key)
	}
	var n int64
	for _, sl := range slots {
		keys := bySlot[sl]
		for start := 0; start < len(keys); start += retireChunk {
			d, err := c.Do(ctx, c.B().Del().Key(keys[start:min(start+retireChunk, len(keys))]...).Build()).AsInt64()
			if err != nil {
				return n, fmt.Errorf("retire %s: %w", sale.ID, err)
			}
			n += d
		}
	}
	return n, nil
}

// Index lists a warm sale in the indexes gateways and retention read (what a
// rebuild does once its books are installed).
func Index(ctx context.Context, c rueidis.Client, sale *flashgate.Sale) error {
	return indexSale(ctx, c, sale)
}
