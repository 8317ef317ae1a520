//go:build bucketsbench

package e2e

// The figures of BENCHMARKS.md's "One hot sale over the Cluster" (docs/buckets.md):
//
//	go test -tags bucketsbench -count=1 -v -timeout 20m -run TestBucketsBench ./e2e
//
// on the stack's Redis Cluster (3 masters; nothing else may use it meanwhile:
// the figures are INFO commandstats, reset at the start of each run).

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/internal/wire"
	"github.com/flashgate/flashgate/loadgen"
	"github.com/flashgate/flashgate/lua"
)

// bucketScriptStats are one master's EVAL/EVALSHA calls and their Redis time.
type bucketScriptStats struct {
	addr        string
	calls, usec int64
	cpu         float64 // s of CPU (user + sys) the process used meanwhile
}

// cpuUsed reads each master's CPU seconds (INFO cpu: used_cpu_user + used_cpu_sys).
func cpuUsed(t *testing.T, ms map[string]rueidis.Client) map[string]float64 {
	out := map[string]float64{}
	for addr, nc := range ms {
		info, err := nc.Do(context.Background(), nc.B().Info().Section("cpu").Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
			if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
				f, _ := strconv.ParseFloat(v, 64)
				out[addr] += f
			}
		}
	}
	return out
}

// masters answers a client per master of the Cluster.
func clusterMasters(t *testing.T, c rueidis.Client) map[string]rueidis.Client {
	out := map[string]rueidis.Client{}
	for addr, nc := range c.Nodes() {
		role, err := nc.Do(context.Background(), nc.B().Role().Build()).ToArray()
		if err != nil {
			t.Fatal(err)
		}
		if r, _ := role[0].ToString(); r == "master" {
			out[addr] = nc
		}
	}
	if len(out) != 3 {
		t.Fatalf("%d masters, want 3", len(out))
	}
	return out
}

func resetBucketStats(t *testing.T, ms map[string]rueidis.Client) {
	for addr, nc := range ms {
		if err := nc.Do(context.Background(), nc.B().ConfigResetstat().Build()).Error(); err != nil {
			t.Fatalf("%s: CONFIG RESETSTAT: %v", addr, err)
		}
	}
}

func readBucketStats(t *testing.T, ms map[string]rueidis.Client) []bucketScriptStats {
	var out []bucketScriptStats
	for addr, nc := range ms {
		info, err := nc.Do(context.Background(), nc.B().Info().Section("commandstats").Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		st := bucketScriptStats{addr: addr}
		for _, line := range strings.Split(info, "\n") {
			line = strings.TrimSpace(line)
			if !strings.HasPrefix(line, "cmdstat_evalsha:") && !strings.HasPrefix(line, "cmdstat_eval:") {
				continue
			}
			for _, kv := range strings.Split(line[strings.IndexByte(line, ':')+1:], ",") {
				k, v, _ := strings.Cut(kv, "=")
				n, _ := strconv.ParseInt(v, 10, 64)
				switch k {
				case "calls":
					st.calls += n
				case "usec":
					st.usec += n
				}
			}
		}
		out = append(out, st)
	}
	return out
}

// spread runs n admissions of one unit by n distinct buyers on a sale of k
// buckets with stock to spare, straight through the scripts, and answers each
// master's script calls and Redis time.
func spread(t *testing.T, c rueidis.Client, ms map[string]rueidis.Client, k, n, inflight int, oneMaster bool) []bucketScriptStats {
	now := time.Now()
	spec := &flashgate.Sale{ID: testenv.ID("spread"), Title: "spread", Total: 10 * int64(n), StartsAt: now.Add(-time.Minute),
		EndsAt: now.Add(time.Hour), PerUserLimit: 2, PerOrderMax: 2, Buckets: k}
	var err error
	if spec.BucketTags, err = lua.ChooseBucketTags(context.Background(), c, spec.ID, k); err != nil {
		t.Fatal(err)
	}
	if oneMaster && k > 1 {
		spec.BucketTags = sameMasterTags(t, c, spec.ID, k)
	}
	if err := spec.Validate(); err != nil {
		t.Fatal(err)
	}
	scripts := lua.Load()
	if _, err := scripts.Warm(context.Background(), c, spec, map[string]int64{"": spec.Total}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = lua.Retire(context.Background(), c, spec) })
	keys := lua.KeysOf(spec)
	// Load every script on every master first, so that the figures count
	// admissions only.
	for i := range 64 {
		_, _ = scripts.AdmitBucketed(context.Background(), c, keys, lua.AdmitArgs{User: "warmup" + strconv.Itoa(i), Quantity: 1,
			OrderID: uint64(now.UnixNano()) + uint64(i), Now: time.Now(), PayBy: time.Now().Add(time.Minute)})
	}
	resetBucketStats(t, ms)
	cpu0 := cpuUsed(t, ms)
	var next atomic.Int64
	var wg sync.WaitGroup
	base := uint64(now.UnixNano()) + 1000
	for range inflight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				a, err := scripts.AdmitBucketed(context.Background(), c, keys, lua.AdmitArgs{User: "b" + strconv.FormatInt(i, 10),
					Quantity: 1, OrderID: base + uint64(i), Now: time.Now(), PayBy: time.Now().Add(time.Minute)})
				if err != nil || a.Outcome != lua.Admitted {
					t.Errorf("admission %d: %v %v", i, a.Outcome, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	st := readBucketStats(t, ms)
	cpu1 := cpuUsed(t, ms)
	for i := range st {
		st[i].cpu = cpu1[st[i].addr] - cpu0[st[i].addr]
	}
	return st
}

// sameMasterTags picks k bucket tags of sale that all hash to the master of
// the sale's own tag: a split sale without the spread, to tell the cost of
// the buckets from the cost of spreading them over processes that share 2
// cores.
func sameMasterTags(t *testing.T, c rueidis.Client, sale string, k int) []string {
	res, err := c.Do(context.Background(), c.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		t.Fatal(err)
	}
	owner := func(slot int) int64 {
		for _, r := range res {
			v, _ := r.ToArray()
			lo, _ := v[0].AsInt64()
			hi, _ := v[1].AsInt64()
			if int64(slot) >= lo && int64(slot) <= hi {
				node, _ := v[2].ToArray()
				port, _ := node[1].AsInt64()
				return port
			}
		}
		return -1
	}
	want := owner(lua.Slot(lua.KeysFor(sale, nil).Meta))
	var tags []string
	for i := 0; len(tags) < k; i++ {
		sfx := "m" + strconv.Itoa(i)
		if owner(lua.Slot(lua.BucketTag(sale, sfx))) == want {
			tags = append(tags, sfx)
		}
	}
	return tags
}

func TestBucketsBench(t *testing.T) {
	c := testenv.Redis(t, testenv.ClusterAddrs())
	ms := clusterMasters(t, c)

	// Spread: a K=12 sale under 32 admissions in flight.
	const n = 30000
	cpuPerAdmission := map[string][]float64{}
	report := func(label string, k, n int, st []bucketScriptStats) float64 {
		var calls, usec int64
		var cpu float64
		for _, s := range st {
			calls += s.calls
			usec += s.usec
			cpu += s.cpu
		}
		var parts []string
		for _, s := range st {
			parts = append(parts, fmt.Sprintf("%s %.1f%% (%d calls, %.2f µs/call)", s.addr, 100*float64(s.calls)/float64(calls), s.calls, float64(s.usec)/float64(max(1, s.calls))))
		}
		per := float64(usec) / float64(n)
		cpuPer := cpu * 1e6 / float64(n)
		t.Logf("%s, K=%d: %d admissions, %d script calls, Redis time %.2f µs per admission (commandstats), Redis CPU %.2f µs per admission (INFO cpu, all masters); per master: %s",
			label, k, n, calls, per, cpuPer, strings.Join(parts, ", "))
		cpuPerAdmission[label[strings.LastIndex(label, ", ")+2:]] = append(cpuPerAdmission[label[strings.LastIndex(label, ", ")+2:]], cpuPer)
		return per
	}
	report("spread, 32 in flight", 12, n, spread(t, c, ms, 12, n, 32, false))

	// Cost: Redis time per admission with one admission in flight, so that
	// no two Redis processes compete for the 2 cores (a call's usec is its
	// wall time: under contention it counts waiting for a core). Three
	// rounds of K = 1 then K = 12, the medians compared.
	const nc = 10000
	usecPer := map[string][]float64{}
	for round := range 3 {
		for _, v := range []struct {
			name string
			k    int
			one  bool
		}{{"K=1", 1, false}, {"K=12 on one master", 12, true}, {"K=12 spread", 12, false}} {
			usecPer[v.name] = append(usecPer[v.name], report(fmt.Sprintf("cost round %d, 1 in flight, %s", round, v.name), v.k, nc, spread(t, c, ms, v.k, nc, 1, v.one)))
		}
	}
	median := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	m1, m12one, m12 := median(usecPer["K=1"]), median(usecPer["K=12 on one master"]), median(usecPer["K=12 spread"])
	c1, c12one, c12 := median(cpuPerAdmission["K=1"]), median(cpuPerAdmission["K=12 on one master"]), median(cpuPerAdmission["K=12 spread"])
	t.Logf("cost in CPU: median Redis CPU per admission K=1 %.2f µs, K=12 on one master %.2f µs (%.1f%%), K=12 spread %.2f µs (%.1f%%)",
		c1, c12one, 100*c12one/c1, c12, 100*c12/c1)
	t.Logf("cost: median Redis time per admission K=1 %.2f µs, K=12 on one master %.2f µs (%.1f%%), K=12 spread over 3 masters %.2f µs (%.1f%%); projected ceiling for one sale: K=1 %.0f/s (one master), K=12 %.0f/s (3 masters ÷ %.2f µs, the one-master cost)",
		m1, m12one, 100*m12one/m1, m12, 100*m12/m1, 1/(m1*1e-6), 3/(m12one*1e-6), m12one)

	// Exactness through three gateways and two backends.
	cfg := e2eConfig(t)
	cfg.Redis.Addrs = testenv.ClusterAddrs()
	be := startBackend(t, cfg)
	startBackend(t, cfg)
	gws := []*wire.Gateway{startGateway(t, cfg), startGateway(t, cfg), startGateway(t, cfg)}
	s := newSale(10000, 2)
	s.PerOrderMax, s.Buckets = 2, 12
	createSale(t, cfg, be.AdminAddr(), s)
	for _, gw := range gws {
		awaitSale(t, gw, s.ID)
	}
	const buyers = 100000
	toks := tokens(t, cfg, "x", buyers)
	spec, err := lua.LoadSale(context.Background(), c, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	keys := lua.KeysOf(spec)

	// Watchers: when Redis holds no unit any more, and when each gateway
	// first answers sold out from memory (a purchase with a token that is
	// not valid: the mark answers 409 before the token is read; without it
	// the answer is 401).
	done := make(chan struct{})
	var emptyAt atomic.Int64
	markedAt := make([]atomic.Int64, len(gws))
	var wwg sync.WaitGroup
	wwg.Add(1 + len(gws))
	go func() {
		defer wwg.Done()
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
			rem, err := lua.Remaining(context.Background(), c, keys)
			if err == nil && rem[""] == 0 && emptyAt.Load() == 0 {
				emptyAt.Store(time.Now().UnixNano())
			}
		}
	}()
	for i, gw := range gws {
		go func() {
			defer wwg.Done()
			cl := &http.Client{Timeout: 2 * time.Second}
			for {
				select {
				case <-done:
					return
				case <-time.After(time.Millisecond):
				}
				req, _ := http.NewRequest("POST", "http://"+gw.Addr()+"/v1/sales/"+s.ID+"/orders", strings.NewReader(`{"quantity":1}`))
				req.Header.Set("Authorization", "Bearer not-a-token")
				res, err := cl.Do(req)
				if err != nil {
					continue
				}
				res.Body.Close()
				if res.StatusCode == 409 && markedAt[i].Load() == 0 {
					markedAt[i].Store(time.Now().UnixNano())
				}
			}
		}()
	}

	// Each buyer tries twice (the second try meets the limit or the
	// sell-out); half buy 1 unit an order, half 2; the three gateways take a
	// third of the buyers each.
	var mu sync.Mutex
	var accepted []uint64
	byStatus := map[int]int64{}
	var lwg sync.WaitGroup
	start := time.Now()
	for g, gw := range gws {
		for q := int64(1); q <= 2; q++ {
			var part [][]byte
			for i := g*2 + int(q-1); i < buyers; i += 2 * len(gws) {
				part = append(part, toks[i])
			}
			lwg.Add(1)
			go func() {
				defer lwg.Done()
				res, err := loadgen.Run(context.Background(), loadgen.Config{Target: "http://" + gw.Addr(), Sale: s.ID,
					Tokens: part, Quantity: q, Concurrency: 64, Requests: int64(2 * len(part))})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				accepted = append(accepted, res.Accepted...)
				for code, n := range res.ByStatus {
					byStatus[code] += n
				}
				mu.Unlock()
			}()
		}
	}
	lwg.Wait()
	load := time.Since(start)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		all := emptyAt.Load() != 0
		for i := range markedAt {
			all = all && markedAt[i].Load() != 0
		}
		if all {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(done)
	wwg.Wait()
	rep := drain(t, cfg, s.ID, accepted)
	t.Logf("exactness: %d buyers x 2 tries through 3 gateways in %v, statuses %v; audit: sold %d of %d, oversold %d, over the limit %d, Redis stock left (stranded) %d, ledger holds %v, buyers %d",
		buyers, load.Round(time.Millisecond), byStatus, rep.Sold, rep.Total, rep.Oversold, rep.OverLimitUsers, rep.RedisRemaining, rep.LedgerHolds, rep.DistinctBuyers)
	var slowest time.Duration
	for i := range markedAt {
		d := time.Duration(markedAt[i].Load() - emptyAt.Load())
		t.Logf("gateway %d answers sold out from memory %v after Redis held no unit", i, d.Round(time.Millisecond))
		slowest = max(slowest, d)
	}
	t.Logf("every gateway answers sold out from memory %v after the last unit was sold (1 ms polling)", slowest.Round(time.Millisecond))
	assertInvariants(t, rep)
	if rep.Sold != 10000 || rep.Oversold != 0 || rep.OverLimitUsers != 0 || rep.RedisRemaining != 0 || byStatus[503] != 0 {
		t.Fatalf("not exact: %+v", rep)
	}
}

// TestBucketsCostInterleaved: the cost of the buckets alone, on one master,
// with the machine's drift cancelled: a K = 1 sale and a K = 12 sale whose
// twelve tags all live on the K = 1 sale's master take batches of 500
// admissions in turn, one in flight, 98 batches each (49,000 admissions);
// each batch's Redis time is that master's commandstats delta, and every
// admission is one script call. Three windows are reported apart (below): a
// bucket's hashes start small, in Redis's compact encoding (listpack, up to
// hash-max-listpack-entries entries, scanned linearly), and grow out of it.
func TestBucketsCostInterleaved(t *testing.T) {
	c := testenv.Redis(t, testenv.ClusterAddrs())
	scripts := lua.Load()
	now := time.Now()
	mk := func(k int) (*flashgate.Sale, *lua.Keys) {
		spec := &flashgate.Sale{ID: testenv.ID("cost"), Title: "cost", Total: 1_000_000, StartsAt: now.Add(-time.Minute),
			EndsAt: now.Add(time.Hour), PerUserLimit: 2, PerOrderMax: 2, Buckets: k}
		return spec, nil
	}
	one, _ := mk(1)
	split, _ := mk(12)
	// The split sale's tags on the master of the K = 1 sale's tag.
	split.BucketTags = sameMasterTagsAs(t, c, split.ID, lua.KeysFor(one.ID, nil).Meta, 12)
	var master rueidis.Client
	slot := lua.Slot(lua.KeysFor(one.ID, nil).Meta)
	for _, nc := range clusterMasters(t, c) {
		n, err := nc.Do(context.Background(), nc.B().ClusterCountkeysinslot().Slot(int64(slot)).Build()).AsInt64()
		_ = n
		if err != nil {
			continue
		}
		// The master that serves the slot answers GET of a key in it; the
		// others redirect (MOVED).
		if err := nc.Do(context.Background(), nc.B().Get().Key(lua.KeysFor(one.ID, nil).Meta).Build()).Error(); err == nil || rueidis.IsRedisNil(err) {
			master = nc
		}
	}
	if master == nil {
		t.Fatal("no master found for the sale's slot")
	}
	keys := map[int]*lua.Keys{}
	for _, s := range []*flashgate.Sale{one, split} {
		if err := s.Validate(); err != nil {
			t.Fatal(err)
		}
		if _, err := scripts.Warm(context.Background(), c, s, map[string]int64{"": s.Total}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = lua.Retire(context.Background(), c, s) })
		keys[s.BucketCount()] = lua.KeysOf(s)
	}
	stat := func() (calls, usec int64) {
		info, err := master.Do(context.Background(), master.B().Info().Section("commandstats").Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			line = strings.TrimSpace(line)
			if !strings.HasPrefix(line, "cmdstat_evalsha:") {
				continue
			}
			for _, kv := range strings.Split(line[len("cmdstat_evalsha:"):], ",") {
				k, v, _ := strings.Cut(kv, "=")
				n, _ := strconv.ParseInt(v, 10, 64)
				switch k {
				case "calls":
					calls = n
				case "usec":
					usec = n
				}
			}
		}
		return calls, usec
	}
	// Three windows of the sale's life, and the whole of it: a bucket's first buyers (its hashes
	// small, some in listpack encoding), 10,000 to 30,000 admissions (each
	// bucket's hashes grow from 833 to 2,500 entries, doubling their tables
	// twice, while the K = 1 sale's grow from 10,000 to 30,000, doubling
	// once), and 25,000 to 49,000 (the buckets' tables stay at 4,096 slots,
	// the K = 1 sale's double from 32,768 to 65,536). A hash table's doubling
	// is paid by the commands that touch it while it is rehashed, so which
	// side pays more depends on where the window sits.
	windows := []struct {
		name     string
		from, to int // batches
	}{{"first 10,000", 0, 20}, {"10,000-30,000", 20, 60}, {"25,000-49,000", 50, 98}, {"all 49,000 (the whole sale)", 0, 98}}
	const batches = 98
	// usec[k][b], calls[k][b]: batch b's Redis time and script calls.
	usec, calls := map[int][]int64{}, map[int][]int64{}
	// ratios[b]: batch b's Redis time per admission, K = 12 over K = 1. The
	// two batches of a pair run back to back, so the median of the pairs'
	// ratios cancels what the machine did meanwhile better than the totals
	// (one busy second moves a total, not a median).
	var ratios [batches]float64
	id := uint64(now.UnixNano())
	for batch := range batches {
		var perBatch [2]float64
		for j, k := range []int{1, 12} {
			c0, u0 := stat()
			for i := range 500 {
				id++
				a, err := scripts.AdmitBucketed(context.Background(), c, keys[k], lua.AdmitArgs{User: fmt.Sprintf("b%d-%d", batch, i), Quantity: 1,
					OrderID: id, Now: time.Now(), PayBy: time.Now().Add(time.Minute)})
				if err != nil || a.Outcome != lua.Admitted {
					t.Fatalf("K=%d: %v %v", k, a.Outcome, err)
				}
			}
			c1, u1 := stat()
			if c1-c0 != 500 {
				t.Fatalf("K=%d: %d script calls for 500 admissions", k, c1-c0)
			}
			usec[k], calls[k] = append(usec[k], u1-u0), append(calls[k], c1-c0)
			perBatch[j] = float64(u1-u0) / float64(c1-c0)
		}
		ratios[batch] = perBatch[1] / perBatch[0]
	}
	per := func(k, from, to int) float64 {
		var u, n int64
		for b := from; b < to; b++ {
			u, n = u+usec[k][b], n+calls[k][b]
		}
		return float64(u) / float64(n)
	}
	median := func(v []float64) float64 { v = slices.Clone(v); slices.Sort(v); return v[len(v)/2] }
	cfg, _ := master.Do(context.Background(), master.B().ConfigGet().Parameter("hash-max-listpack-entries").Build()).AsStrMap()
	for _, w := range windows {
		t.Logf("interleaved on one master (hash-max-listpack-entries %s), admissions %s: K=1 %.2f µs per admission, K=12 %.2f µs: %.1f%%; median of the pairs' ratios %.1f%%",
			cfg["hash-max-listpack-entries"], w.name, per(1, w.from, w.to), per(12, w.from, w.to), 100*per(12, w.from, w.to)/per(1, w.from, w.to), 100*median(ratios[w.from:w.to]))
	}
}

// sameMasterTagsAs picks k bucket tags of sale on the master of key's slot.
func sameMasterTagsAs(t *testing.T, c rueidis.Client, sale, key string, k int) []string {
	res, err := c.Do(context.Background(), c.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		t.Fatal(err)
	}
	owner := func(slot int) int64 {
		for _, r := range res {
			v, _ := r.ToArray()
			lo, _ := v[0].AsInt64()
			hi, _ := v[1].AsInt64()
			if int64(slot) >= lo && int64(slot) <= hi {
				node, _ := v[2].ToArray()
				port, _ := node[1].AsInt64()
				return port
			}
		}
		return -1
	}
	want := owner(lua.Slot(key))
	var tags []string
	for i := 0; len(tags) < k; i++ {
		sfx := "m" + strconv.Itoa(i)
		if owner(lua.Slot(lua.BucketTag(sale, sfx))) == want {
			tags = append(tags, sfx)
		}
	}
	return tags
}
