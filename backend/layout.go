package backend

import (
	"context"
	"errors"
	"strconv"
	"sync"

	"github.com/flashgate/flashgate/lua"
	"github.com/flashgate/flashgate/mysql"
)

// layouts caches each sale's Redis key layout: its regions and, for a sale
// split over stock buckets (docs/buckets.md), its buckets' tags. Both are
// fixed when the sale is created, so an entry never goes stale; MySQL, which
// keeps them, is read once per sale per process.
var layouts sync.Map // sale id → *lua.Keys

// keysOf returns sale's keys with every region and bucket. A sale MySQL does
// not know gets its plain layout (no regions, not split): what every caller
// used before buckets existed, for orders of a sale being retired.
func keysOf(ctx context.Context, q queryer, sale string) (*lua.Keys, error) {
	if k, ok := layouts.Load(sale); ok {
		return k.(*lua.Keys), nil
	}
	row, err := loadSale(ctx, q, sale)
	if errors.Is(err, errSaleNotFound) {
		return lua.KeysFor(sale, nil), nil
	}
	if err != nil {
		return nil, err
	}
	k := lua.KeysOf(&row.Sale)
	layouts.Store(sale, k)
	return k, nil
}

// bucketProbe is a user id whose home is bucket i of k's buckets: what the
// per-bucket filters of a refill (which pick buyers by user) ask about a
// bucket as a whole.
func bucketProbe(k *lua.Keys, i int) string {
	n := len(k.Buckets())
	for j := 0; ; j++ {
		u := "probe-" + strconv.Itoa(j)
		if lua.HomeBucket(u, n) == i {
			return u
		}
	}
}

// epochKeys is keysOf for a write-back: the keys carry the sale's epoch as
// MySQL has it now, read after the decision written back was committed
// (lua.Keys.AtEpoch). A rebuild that began before this read counted the
// decision from MySQL, and leaves nothing for the write-back to change (its
// scripts decide on presence: the reservation, the restocked set); one that
// begins after it opens a later epoch, and the scripts refuse the write-back.
func epochKeys(ctx context.Context, q queryer, sale string) (*lua.Keys, error) {
	k, err := keysOf(ctx, q, sale)
	if err != nil {
		return nil, err
	}
	epoch, err := mysql.SaleEpoch(ctx, q, sale)
	if err != nil {
		return nil, err
	}
	return k.AtEpoch(epoch), nil
}
