package lua

import (
	"slices"
	"strconv"

	"github.com/flashgate/flashgate"
)

// The Redis key layout (docs/redis.md). Every key flashgate reads or writes in
// Redis is spelled in this file and nowhere else: other packages, and the
// scripts (which get their keys through KEYS), ask for them here. A test
// (TestKeysSpelledOnlyHere) fails if the prefix or the hash tag turns up in
// another non-test Go or Lua file.
//
// A sale's keys all carry its hash tag, {s:<sale>}: on a Redis Cluster they
// hash to one slot, so one script on one shard decides a purchase atomically.
// The global keys (indexes, node leases, the leader lock) carry no tag and
// live on whatever slot they hash to; nothing touches them together with a
// sale's keys in one call.

const (
	// keyPrefix starts every flashgate key but the leader lock (ACLs grant
	// the gateway and backend users this pattern).
	keyPrefix = "fg:"
	// tagOpen and tagClose wrap a sale's id into its hash tag.
	tagOpen, tagClose = "{s:", "}"
)

// SalesIndex is the set of every sale id Redis holds (see LiveIndex for the
// ones gateways read).
const SalesIndex = keyPrefix + "sales"

// LiveIndex is the sorted set of the sales Redis holds, scored by ends_at in
// unix milliseconds.
const LiveIndex = keyPrefix + "sales:live"

// NodeLeasePrefix names the order-id node leases: NodeLeasePrefix + "<n>",
// each a string holding its owner's token, with a TTL its owner renews.
const NodeLeasePrefix = keyPrefix + "node:"

// NodeLease is the lease key of order-id node n.
func NodeLease(n int) string { return NodeLeasePrefix + strconv.Itoa(n) }

// LeaderLockPrefix is the prefix rueidislock names the backend leader lock
// with: the key is LeaderLockPrefix + ":0:" + <lock name> (one key: majority 1).
// It is outside "fg:" for history; the backend's ACL grants "flashgate:*".
const LeaderLockPrefix = "flashgate:leader"

// LeaderLock is the key rueidislock holds the lock named name in.
func LeaderLock(name string) string { return LeaderLockPrefix + ":0:" + name }

// SaleTag is the hash tag every key of sale carries.
func SaleTag(sale string) string { return tagOpen + sale + tagClose }

// Keys are the Redis keys of one sale. Build them once per sale (KeysFor), not
// per request.
type Keys struct {
	Sale string
	// Meta is a hash: the sale's spec and state (warm.lua writes it; its
	// presence means the sale is warm).
	Meta string
	// Users is a hash: buyer → units held (per_user_limit).
	Users string
	// Resv is a hash: order id → reservation, while MySQL has not settled it.
	Resv string
	// Orders is a hash: order id → the order's record (Record.Value).
	Orders string
	// Idem is a hash: "<user>|<idempotency key>" → order id.
	Idem string
	// Warming is the backend's short lock while it warms the sale.
	Warming string
	// Epoch is a string: the epoch of this tag's books (rebuild.go), "r<n>"
	// while rebuild n is under way; absent: never rebuilt, or Redis lost it.
	Epoch     string
	restocked string
	prefix    string
	stock     string
	region    map[string]string
	// buckets are the sale's buckets (nil: not split); a bucket's own Keys
	// have index, suffix and its transfer ledger.
	buckets   []*Keys
	index     int
	suffix    string
	xout, xin string
	// parent is a bucket's sale (nil for the sale's own keys); holds, held
	// and back are a bucket's hashes of purchase-limit holds (holds.go).
	parent            *Keys
	holds, held, back string
	// epochN is the epoch of the caller's decision (AtEpoch): what the
	// write-back scripts check the tag's epoch against ("": "0", unchecked).
	epochN string
	// fixed lists every key above (and the sale-wide stock key): retention
	// deletes them all, so a key added to the layout through add is retired
	// without anyone remembering to.
	fixed []string
}

// KeysFor returns the keys of sale, with a stock key for each region.
func KeysFor(sale string, regions []string) *Keys {
	p := keyPrefix + SaleTag(sale) + ":"
	k := &Keys{Sale: sale, prefix: p, region: make(map[string]string, len(regions)), fixed: make([]string, 0, 8)}
	k.addCommon()
	k.Warming = k.add("warming")
	k.addStock(regions)
	return k
}

// addCommon names the keys every hash tag of a sale holds (the sale's own, or
// one bucket's), in the order retention lists them.
func (k *Keys) addCommon() {
	k.Meta = k.add("meta")
	k.Users = k.add("users")
	k.Resv = k.add("resv")
	k.Orders = k.add("orders")
	k.Idem = k.add("idem")
	k.restocked = k.add("restocked")
	k.Epoch = k.add("epoch")
}

// AtEpoch is k for a caller writing back a decision MySQL made in epoch n of
// the sale's books (mysql.LockSaleEpoch): once a rebuild has opened a later
// epoch, the write-back scripts (confirm, release in backend mode, restock)
// called with it change nothing, since the rebuild counted the decision from
// MySQL already. n = 0: unchecked (a sale never rebuilt).
func (k *Keys) AtEpoch(n int64) *Keys {
	c := *k
	c.epochN = strconv.FormatInt(n, 10)
	if len(k.buckets) > 0 {
		c.buckets = make([]*Keys, len(k.buckets))
		for i, b := range k.buckets {
			bc := *b
			bc.epochN, bc.parent = c.epochN, &c
			c.buckets[i] = &bc
		}
	}
	return &c
}

// callerEpoch is the epoch the write-back scripts get: AtEpoch's, or "0".
func (k *Keys) callerEpoch() string {
	if k.epochN == "" {
		return "0"
	}
	return k.epochN
}

// stagePrefix starts the names of the keys a rebuild writes before it
// installs them (rebuild.go): under the same hash tag, so one script renames
// them into place; they expire if no install comes.
const stagePrefix = "rb:"

// staged is the name a rebuild writes key under before installing it.
func (k *Keys) staged(key string) string {
	return k.prefix + stagePrefix + key[len(k.prefix):]
}

// addStock names the stock key and each region's under it.
func (k *Keys) addStock(regions []string) {
	k.stock = k.add("stock")
	for _, r := range regions {
		k.region[r] = k.stock + ":" + r
	}
}

// add names one key of the sale and records it for retention.
func (k *Keys) add(name string) string {
	key := k.prefix + name
	k.fixed = append(k.fixed, key)
	return key
}

// Restocked is the key of the set of orders whose units restock.lua has settled.
// It is what makes a restock happen once: an order's record can be rewritten
// from MySQL by a late confirm, the set cannot.
func (k *Keys) Restocked() string { return k.restocked }

// Stock is the stock key of region ("" for a sale without regions), and false
// for a region the sale does not have.
func (k *Keys) Stock(region string) (string, bool) {
	if region == "" {
		return k.stock, len(k.region) == 0
	}
	key, ok := k.region[region]
	return key, ok
}

// Limit is the counter hash of a purchase-limit window ("sale", "d20261122",
// "m202611"): field "<limit>/<subject>" → units or orders counted.
func (k *Keys) Limit(window string) string { return k.prefix + "lim:" + window }

// windowKeys lists the distinct windows of encoded charges with their counter
// hashes, for the scripts that undo them.
func (k *Keys) windowKeys(charges string) (windows, keys []string, err error) {
	cs, err := flashgate.ParseCharges(charges)
	if err != nil {
		return nil, nil, err
	}
	for _, c := range cs {
		if !slices.Contains(windows, c.Window) {
			windows = append(windows, c.Window)
			keys = append(keys, k.Limit(c.Window))
		}
	}
	return windows, keys, nil
}

// StockKeys lists every stock key of the sale, with the region each belongs
// to, in the order of the region names: the same on every call, so that a
// caller that lists them twice (a retry) pairs each value with its region.
func (k *Keys) StockKeys() (regions, keys []string) {
	if len(k.region) == 0 {
		return []string{""}, []string{k.stock}
	}
	regions = make([]string, 0, len(k.region))
	for r := range k.region {
		regions = append(regions, r)
	}
	slices.Sort(regions)
	keys = make([]string, len(regions))
	for i, r := range regions {
		keys[i] = k.region[r]
	}
	return regions, keys
}

// perSale lists every key of the sale that is not a limit counter: the fixed
// ones, then a stock key per region.
func (k *Keys) perSale() []string {
	keys := slices.Clone(k.fixed)
	if len(k.region) > 0 {
		_, stock := k.StockKeys()
		keys = append(keys, stock...)
	}
	return keys
}

// Stock buckets (docs/buckets.md). A sale created with buckets: K > 1 keeps its
// sale-wide keys (meta, the warming lock) under SaleTag, and splits the rest
// over K buckets, each under a tag of its own, BucketTag(sale, suffix): a copy
// of meta (what admit.lua reads), its share of the stock, and everything of the
// buyers whose home it is (users, reservations, orders, idempotency keys, limit
// counters), plus its transfer ledger (TransfersOut, TransfersIn). The suffixes
// are chosen when the sale is created (ChooseBucketTags) and stored with it.

// bucketSep separates the sale id from a bucket's suffix inside its tag; sale
// ids are [A-Za-z0-9_-], so it cannot occur in one.
const bucketSep = "/"

// BucketTag is the hash tag of the bucket of sale with suffix suffix.
func BucketTag(sale, suffix string) string { return tagOpen + sale + bucketSep + suffix + tagClose }

// bucketTagBody is what Redis hashes for a bucket's keys: the text between
// the braces of BucketTag.
func bucketTagBody(sale, suffix string) string { return tagOpen[1:] + sale + bucketSep + suffix }

// BucketedKeysFor returns the keys of a sale split over buckets, one per suffix
// (nil or one suffix: the sale is not split, as KeysFor).
func BucketedKeysFor(sale string, regions []string, suffixes []string) *Keys {
	k := KeysFor(sale, regions)
	if len(suffixes) <= 1 {
		return k
	}
	k.buckets = make([]*Keys, len(suffixes))
	for i, sfx := range suffixes {
		b := &Keys{Sale: sale, prefix: keyPrefix + BucketTag(sale, sfx) + ":", region: make(map[string]string, len(regions)),
			fixed: make([]string, 0, 10), index: i, suffix: sfx}
		b.addCommon()
		b.xout = b.add("xout")
		b.xin = b.add("xin")
		b.holds = b.add("lhold")
		b.held = b.add("lheld")
		b.back = b.add("lback")
		b.parent = k
		b.Warming = k.Warming
		b.addStock(regions)
		k.buckets[i] = b
	}
	return k
}

// giveBack is the hash release.lua and restock.lua write the charges to give
// back in other buckets into (holds.go): a bucket's own, or, for a sale that is
// not split (which never writes it), a key of its tag.
func (k *Keys) giveBack() string {
	if k.back != "" {
		return k.back
	}
	return k.prefix + "lback"
}

// Buckets lists the sale's buckets (nil for a sale that is not split).
func (k *Keys) Buckets() []*Keys { return k.buckets }

// BucketIndex is the position of a bucket's keys among its sale's buckets.
func (k *Keys) BucketIndex() int { return k.index }

// TransfersOut is a bucket's hash of the transfers it gave units to and the
// receiver has not acknowledged: transfer id → "<to>|<region>|<units>|<ms>".
func (k *Keys) TransfersOut() string { return k.xout }

// TransfersIn is a bucket's set of the transfer ids whose units it received:
// what makes a transfer land once.
func (k *Keys) TransfersIn() string { return k.xin }

// Holds is a bucket's hash of the purchase-limit holds not yet decided
// (holds.go): order id → "<ms>|<user>|…|<charges>" ("" for a sale's own keys,
// which hold nothing).
func (k *Keys) Holds() string { return k.holds }

// Home is the keys holding user's purchases: the sale's own for a sale that is
// not split, else the bucket HomeBucket picks.
func (k *Keys) Home(user string) *Keys {
	if len(k.buckets) == 0 {
		return k
	}
	return k.buckets[HomeBucket(user, len(k.buckets))]
}

// rateLimitPrefix names the fleet-wide rate-limit keys (ratelimit.mode:
// global): a string per limited subject holding its GCRA state, which expires
// once its bucket is full again.
const rateLimitPrefix = keyPrefix + "rl:"

// RateKey is the key of the fleet-wide rate limit kind ("sale", "user") of id.
func RateKey(kind, id string) string { return rateLimitPrefix + kind + ":" + id }

// HomeFor is Home(user) with a stock key for region even when the sale has no
// such region: what releasing an order whose message names a region the sale
// lacks needs (the script then finds the order's record disagrees, or none).
func (k *Keys) HomeFor(user, region string) *Keys {
	h := k.Home(user)
	if _, ok := h.Stock(region); ok || region == "" {
		return h
	}
	c := *h
	c.region = make(map[string]string, len(h.region)+1)
	for r, key := range h.region {
		c.region[r] = key
	}
	c.region[region] = h.stock + ":" + region
	return &c
}

// ACL key patterns (package roles): which keys a role may read or write,
// spelled from the layout above.

// AllKeysPattern matches every key of flashgate but the leader lock.
const AllKeysPattern = keyPrefix + "*"

// LeaderLockPattern matches the backend's leader lock.
const LeaderLockPattern = LeaderLockPrefix + "*"

// GatewayWritePatterns match the keys the functions a gateway calls write
// (admit, release, claim, the purchase-limit holds and the transfers of a
// split sale, the rate limits): a sale's or bucket's stock, buyers' counts,
// reservations, order records, idempotency keys, purchase-limit counters,
// holds, give-backs and transfer ledgers. Not meta, epoch, the warm lock, the
// restock set or the indexes of sales. The node leases are apart
// (NodeLeasePrefix): each gateway's range is its own.
func GatewayWritePatterns() []string {
	tag := keyPrefix + tagOpen + "*" + tagClose + ":"
	var out []string
	for _, name := range []string{"stock", "stock:*", "users", "resv", "orders", "idem", "lim:*", "lhold", "lheld", "lback", "xout", "xin"} {
		out = append(out, tag+name)
	}
	return append(out, rateLimitPrefix+"*")
}
