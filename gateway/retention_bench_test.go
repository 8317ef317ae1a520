package gateway

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

// BenchmarkSalesRefresh is one full refresh of the gateway's sales (what the
// refresh loop does every gateway.sale_refresh) with 10 live sales, and 0 or
// 10,000 sales that ended two days ago and that Redis still holds (not yet
// retired). "all" is the refresh as it was before the live index: every sale
// of the index read every time. A private Redis, so that other tests' sales
// do not count.
func BenchmarkSalesRefresh(b *testing.B) {
	srv := testenv.StartRedis(b)
	rc := testenv.Redis(b, []string{srv.Addr})
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Millisecond)
	warmN := func(n int, ends time.Time) {
		var wg sync.WaitGroup
		ids := make(chan int)
		for range 16 {
			wg.Go(func() {
				scripts := lua.Load()
				for i := range ids {
					s := &flashgate.Sale{ID: "bench" + strconv.FormatInt(ends.Unix(), 36) + "-" + strconv.Itoa(i), Title: "t",
						PriceCents: 100, Total: 10, StartsAt: ends.Add(-time.Hour), EndsAt: ends, PerUserLimit: 1, PerOrderMax: 1}
					if _, err := scripts.Warm(ctx, rc, s, map[string]int64{"": 10}); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		for i := range n {
			ids <- i
		}
		close(ids)
		wg.Wait()
	}
	warmN(10, now.Add(time.Hour))
	grace := 24 * time.Hour
	for _, ended := range []int{0, 10000} {
		if ended > 0 {
			warmN(ended, now.Add(-48*time.Hour))
		}
		b.Run("ended="+strconv.Itoa(ended)+"/live", func(b *testing.B) {
			ss := newSales(grace)
			if err := ss.loadAt(ctx, rc, now); err != nil { // steady state: the specs held already
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := ss.loadAt(ctx, rc, now); err != nil {
					b.Fatal(err)
				}
			}
			if n := len(ss.list()); n != 10 {
				b.Fatalf("%d sales held, want 10", n)
			}
		})
		b.Run("ended="+strconv.Itoa(ended)+"/all", func(b *testing.B) {
			ss := newSales(grace)
			if err := loadEverySale(ctx, rc, ss); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := loadEverySale(ctx, rc, ss); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// loadEverySale is the refresh before the live index: the whole index, and
// each sale's meta.
func loadEverySale(ctx context.Context, rc rueidis.Client, ss *sales) error {
	ids, err := rc.Do(ctx, rc.B().Smembers().Key(lua.SalesIndex).Build()).AsStrSlice()
	if err != nil {
		return err
	}
	for _, id := range ids {
		spec, err := lua.LoadSale(ctx, rc, id)
		if err != nil {
			continue
		}
		ss.put(spec)
	}
	return nil
}
