package lua

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/flashgate/flashgate"
)

// Stock buckets (docs/buckets.md): a hot sale's stock split over K hash tags,
// so that its admissions spread over the masters of a Redis Cluster. A buyer's
// home bucket (HomeBucket) holds everything of theirs, so every limit by user
// is still checked in one script call (a limit by phone, device, IP or
// address whose subject's bucket is another is held there first: holds.go);
// units move between buckets by transfers
// (take.lua on the giver, give.lua on the receiver), which reconcile finishes
// when the process that started one died half way (FinishTransfers).

var (
	//go:embed take.lua
	takeSrc string
	//go:embed give.lua
	giveSrc string
	//go:embed view.lua
	viewSrc string

	takeScript  = newScript("take", takeSrc).reading(3)
	giveScript  = newScript("give", giveSrc).reading(3)
	viewScript  = newReadScript("view", viewSrc)
	touchScript = newScript("touch", touchSrc)
)

// touchSrc writes a giver's ledger entry again, unchanged, when it is still
// there (1) and answers 0 when it is gone: a write of the giver's master that
// comes after the take in its replication stream, so that a WAIT after it
// tells whether the replicas have the take (confirmTaken).
//
//	KEYS: 1 the giver's transfers out; ARGV: 1 transfer id
const touchSrc = `local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], v)
return 1`

// replication is redis.wait_replicas and redis.wait_timeout for the transfer
// scripts: with replicas > 0 each take and give is followed by WAIT on its
// connection, as an admission is (AdmitWait).
type replication struct {
	replicas int
	timeout  time.Duration
}

// execWait runs a script on keys and args and, when w.replicas > 0, WAIT on
// the same connection in the same round trip; acked is whether that many
// replicas had the script's writes within the timeout (always true without a
// wait). A master that lost the library gets it again (Script.Exec).
func execWait(ctx context.Context, c rueidis.Client, s *Script, keys, args []string, w replication) (rueidis.RedisResult, bool, error) {
	if w.replicas <= 0 {
		return s.Exec(ctx, c, keys, args), true, nil
	}
	wait := func() rueidis.Completed {
		return c.B().Wait().Numreplicas(int64(w.replicas)).Timeout(w.timeout.Milliseconds()).Build()
	}
	rs := s.execMulti(ctx, c, keys, args, wait)
	if rs[0].Error() != nil {
		return rs[0], false, nil
	}
	n, err := rs[1].AsInt64()
	if err != nil {
		return rs[0], false, fmt.Errorf("wait: %w", err)
	}
	return rs[0], n >= int64(w.replicas), nil
}

// How long the two halves of a transfer's record are kept after it landed.
// A landed transfer stays in its giver's ledger for ledgerKeep, so that a
// reader adding up the buckets never misses its units (remainingBucketed);
// its id stays in the receiver's set for receivedKeep, far longer, so that a
// late give of it finds it landed. Reconcile prunes both (FinishTransfers).
const (
	ledgerKeep   = 10 * time.Second
	receivedKeep = 10 * time.Minute
)

// takeReply is the first word of take.lua's answer.
type takeReply string

const (
	takeTook  takeReply = "took"  // units left the giver and are in its ledger
	takeEmpty takeReply = "empty" // the giver has none
)

// giveReply is the first word of give.lua's answer.
type giveReply string

const (
	giveGiven   giveReply = "given"   // the units joined the receiver's stock now
	giveAlready giveReply = "already" // they had landed before
	giveFenced  giveReply = "fenced"  // taken before a rebuild, which counted them: never to land
)

// HomeBucket is the bucket (0..k-1) that holds user's purchases in a sale of k
// buckets: FNV-1a of the user id, the same in every process.
func HomeBucket(user string, k int) int {
	if k <= 1 {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(user))
	return int(h.Sum32() % uint32(k))
}

// Slot is the Redis Cluster slot of key (CRC16/XMODEM of its hash tag, mod 16384).
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}

// maxTagTries bounds the suffixes tried for one bucket: with M masters one in
// M fits, so 64 tries miss with odds (1-1/M)^64.
const maxTagTries = 64

// ChooseBucketTags picks the tag suffixes of a sale of k buckets so that they
// spread evenly over the masters of the cluster c talks to: bucket i goes to
// master i mod M, in the order of the masters' first slots. On a single Redis
// (no cluster) the suffixes are "0".."k-1". k <= 1 answers nil: not split.
//
// The choice is made once, when the sale is created; a reshard later moves
// slots, and with them whole buckets, intact (each bucket's keys share one
// slot), so nothing breaks, but the spread is then whatever the new slot map
// makes of it (docs/buckets.md).
func ChooseBucketTags(ctx context.Context, c rueidis.Client, sale string, k int) ([]string, error) {
	if k <= 1 {
		return nil, nil
	}
	if k > flashgate.MaxBuckets {
		return nil, fmt.Errorf("%d buckets: at most %d", k, flashgate.MaxBuckets)
	}
	masters, err := clusterMasters(ctx, c)
	if err != nil {
		return nil, err
	}
	tags := make([]string, k)
	for i := range tags {
		if len(masters) == 0 {
			tags[i] = strconv.Itoa(i)
			continue
		}
		want := masters[i%len(masters)]
		for n := 0; ; n++ {
			if n == maxTagTries {
				return nil, fmt.Errorf("bucket %d of sale %s: no tag found on master %d", i, sale, i%len(masters))
			}
			sfx := strconv.Itoa(i) + "." + strconv.Itoa(n)
			if want.has(Slot(bucketTagBody(sale, sfx))) {
				tags[i] = sfx
				break
			}
		}
	}
	return tags, nil
}

// slotRanges are the slots one master serves.
type slotRanges [][2]int

func (r slotRanges) has(slot int) bool {
	for _, x := range r {
		if slot >= x[0] && slot <= x[1] {
			return true
		}
	}
	return false
}

// clusterMasters reads the slot map: each master's slot ranges, ordered by
// its first slot. A Redis that is not a cluster answers none.
func clusterMasters(ctx context.Context, c rueidis.Client) ([]slotRanges, error) {
	res, err := c.Do(ctx, c.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		if strings.Contains(err.Error(), "cluster support disabled") {
			return nil, nil
		}
		return nil, fmt.Errorf("cluster slots: %w", err)
	}
	byNode := map[string]int{}
	var out []slotRanges
	first := []int{}
	for _, r := range res {
		v, err := r.ToArray()
		if err != nil || len(v) < 3 {
			return nil, fmt.Errorf("cluster slots: unexpected reply")
		}
		lo, _ := v[0].AsInt64()
		hi, _ := v[1].AsInt64()
		node, err := v[2].ToArray()
		if err != nil || len(node) < 2 {
			return nil, fmt.Errorf("cluster slots: unexpected node")
		}
		host, _ := node[0].ToString()
		port, _ := node[1].AsInt64()
		id := host + ":" + strconv.FormatInt(port, 10)
		i, ok := byNode[id]
		if !ok {
			i = len(out)
			byNode[id] = i
			out = append(out, nil)
			first = append(first, int(lo))
		}
		out[i] = append(out[i], [2]int{int(lo), int(hi)})
		first[i] = min(first[i], int(lo))
	}
	// Order masters by their first slot, so the choice does not depend on the
	// order CLUSTER SLOTS lists them in.
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && first[j] < first[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
			first[j], first[j-1] = first[j-1], first[j]
		}
	}
	return out, nil
}

// SplitUnits shares n units over k buckets: bucket i gets n/k, and the first
// n%k one more.
func SplitUnits(n int64, k, i int) int64 {
	q, r := n/int64(k), n%int64(k)
	if int64(i) < r {
		return q + 1
	}
	return q
}

// KeysOf returns the keys of sale with its buckets (KeysFor for a sale that
// is not split).
func KeysOf(sale *flashgate.Sale) *Keys {
	return BucketedKeysFor(sale.ID, sale.RegionNames(), sale.BucketTags)
}

// Transfer is one transfer of units between two buckets of a sale.
type Transfer struct {
	ID       string
	From, To int // bucket indexes
	Region   string
	Units    int64
	TakenMS  int64 // when it was taken (unix ms)
	// Epoch is the giver's epoch when it was taken (take.lua): the units
	// land only in the same epoch.
	Epoch string
}

// take moves up to want units of region out of bucket from into its ledger,
// bound for bucket to; it answers how many it took (0: from had none), and
// whether w.replicas replicas of from's master had the take within the wait
// (always true without one).
func take(ctx context.Context, c rueidis.Client, from *Keys, to int, id, region string, want int64, nowMS int64, w replication) (int64, string, bool, error) {
	stock, ok := from.Stock(region)
	if !ok {
		return 0, "", false, ErrUnknownRegion
	}
	r, acked, err := execWait(ctx, c, takeScript, []string{stock, from.xout, from.Epoch},
		[]string{id, strconv.FormatInt(want, 10), strconv.Itoa(to), region, strconv.FormatInt(nowMS, 10)}, w)
	if err != nil {
		return 0, "", false, fmt.Errorf("take %s bucket %d: %w", from.Sale, from.index, err)
	}
	res, err := r.AsStrSlice()
	if err != nil {
		return 0, "", false, fmt.Errorf("take %s bucket %d: %w", from.Sale, from.index, err)
	}
	switch takeReply(res[0]) {
	case takeEmpty:
		return 0, "", true, nil
	case takeTook:
		if len(res) == 4 {
			n, err := strconv.ParseInt(res[1], 10, 64)
			return n, res[3], acked, err
		}
	}
	return 0, "", false, fmt.Errorf("take %s: unexpected reply %q", from.Sale, res)
}

// land gives a taken transfer's units to its receiver, once. The giver's
// ledger entry stays (see ledgerKeep). It is what both the gateway and
// FinishTransfers run; it answers whether the units landed now, and whether
// w.replicas replicas of the receiver's master had them within the wait (a
// landing they did not confirm is landed again by reconcile if a failover
// loses it: the giver's entry is still there, and so is the take).
func land(ctx context.Context, c rueidis.Client, k *Keys, t Transfer, nowMS int64, w replication) (bool, bool, error) {
	if t.From < 0 || t.From >= len(k.buckets) || t.To < 0 || t.To >= len(k.buckets) {
		return false, false, fmt.Errorf("transfer %s of %s: bucket out of range", t.ID, k.Sale)
	}
	to := k.buckets[t.To]
	stock, ok := to.Stock(t.Region)
	if !ok {
		return false, false, ErrUnknownRegion
	}
	r, acked, err := execWait(ctx, c, giveScript, []string{stock, to.xin, to.Epoch},
		[]string{t.ID, strconv.FormatInt(t.Units, 10), strconv.FormatInt(nowMS, 10), t.Epoch}, w)
	if err != nil {
		return false, false, fmt.Errorf("give %s bucket %d: %w", k.Sale, t.To, err)
	}
	res, err := r.AsStrSlice()
	if err != nil {
		return false, false, fmt.Errorf("give %s bucket %d: %w", k.Sale, t.To, err)
	}
	if len(res) == 0 || (giveReply(res[0]) != giveGiven && giveReply(res[0]) != giveAlready && giveReply(res[0]) != giveFenced) {
		return false, false, fmt.Errorf("give %s: unexpected reply %q", k.Sale, res)
	}
	return giveReply(res[0]) == giveGiven, acked, nil
}

// confirmTaken tells whether w.replicas replicas of the giver's master have
// the take of t: it writes t's ledger entry again (touchSrc) and waits for
// that write, which follows the take in the master's replication stream. A
// transfer whose entry is gone (pruned: landed long ago) is not confirmed.
func confirmTaken(ctx context.Context, c rueidis.Client, k *Keys, t Transfer, w replication) (bool, error) {
	if w.replicas <= 0 {
		return true, nil
	}
	r, acked, err := execWait(ctx, c, touchScript, []string{k.buckets[t.From].xout}, []string{t.ID}, w)
	if err != nil {
		return false, fmt.Errorf("transfer %s of %s: %w", t.ID, k.Sale, err)
	}
	n, err := r.AsInt64()
	if err != nil {
		return false, fmt.Errorf("transfer %s of %s: %w", t.ID, k.Sale, err)
	}
	return n == 1 && acked, nil
}

// Gather brings at least need units of region into bucket home, from the other
// buckets in turn (starting at start, so that drained buckets do not all ask
// the same one first), and answers how many it moved. It stops early when the
// units are there; it moves fewer when the other buckets hold fewer. Every unit
// taken is either in home's stock, or in a giver's ledger that
// FinishTransfers lands (when this process dies between the two steps).
func Gather(ctx context.Context, c rueidis.Client, k *Keys, home int, region string, need int64, start int, idBase string, nowMS int64) (int64, error) {
	return gather(ctx, c, k, home, region, need, start, idBase, nowMS, replication{})
}

// gather is Gather whose takes and gives wait for w.replicas replicas. A
// take the replicas did not confirm in time is not landed: a failover of the
// giver's master now could hand its successor the units as they were before
// the take, and landing them would count them twice. Its units stay in the
// giver's ledger (Remaining counts them), where reconcile lands them once the
// replicas confirm the take (FinishTransfersWait).
func gather(ctx context.Context, c rueidis.Client, k *Keys, home int, region string, need int64, start int, idBase string, nowMS int64, w replication) (int64, error) {
	n := len(k.buckets)
	var moved int64
	for j := 0; j < n && moved < need; j++ {
		from := (start + j) % n
		if from == home {
			continue
		}
		id := idBase + "." + strconv.Itoa(from)
		got, epoch, acked, err := take(ctx, c, k.buckets[from], home, id, region, need-moved, nowMS, w)
		if err != nil {
			return moved, err
		}
		if got == 0 || !acked {
			continue
		}
		given, _, err := land(ctx, c, k, Transfer{ID: id, From: from, To: home, Region: region, Units: got, Epoch: epoch}, nowMS, w)
		if err != nil {
			return moved, err
		}
		if given {
			moved += got
		}
	}
	return moved, nil
}

// AdmitBucketed runs the admission on the buyer's home bucket; when the home
// lacks the units it gathers them from the other buckets and asks once more.
// A sold-out answer then means the sale holds fewer units than the quantity:
// Remaining is what it holds (every bucket and every transfer on the move),
// 0 when it is empty. When units exist but keep moving away faster than the
// gathering finds them (the last units of a contended sale), it gives up
// after gatherRounds and answers sold out with what the sale still holds
// (above 0: no sold-out mark is set on that).
func (s *Scripts) AdmitBucketed(ctx context.Context, c rueidis.Client, k *Keys, a AdmitArgs) (Admission, error) {
	return s.AdmitBucketedWait(ctx, c, k, a, 0, 0)
}

// AdmitBucketedWait is AdmitBucketed whose admission, when replicas > 0, is
// not an admission before that many replicas of its master have it (AdmitWait:
// redis.wait_replicas). The transfers that gather units into the home bucket
// wait too: a take is landed only once that many replicas of the giver's
// master have it, and each give waits for the receiver's (gather), so a
// failover never hands a master units that already moved (docs/buckets.md).
func (s *Scripts) AdmitBucketedWait(ctx context.Context, c rueidis.Client, k *Keys, a AdmitArgs, replicas int, timeout time.Duration) (Admission, error) {
	admit := func(k *Keys) (Admission, error) {
		if replicas > 0 {
			return s.AdmitWait(ctx, c, k, a, replicas, timeout)
		}
		return s.Admit(ctx, c, k, a)
	}
	if len(k.buckets) == 0 {
		return admit(k)
	}
	hk := k.Home(a.User)
	adm, err := admit(hk)
	if err != nil || adm.Outcome != SoldOut {
		return adm, err
	}
	for round := 0; round < gatherRounds; round++ {
		need := a.Quantity - max(0, adm.Remaining)
		id := "t" + strconv.FormatUint(a.OrderID, 10) + "." + strconv.Itoa(round)
		moved, err := gather(ctx, c, k, hk.index, a.Region, need, int(a.OrderID%uint64(len(k.buckets)))+round, id, a.Now.UnixMilli(),
			replication{replicas: replicas, timeout: timeout})
		if err != nil {
			return adm, err
		}
		if moved >= need {
			if adm, err = admit(hk); err != nil || adm.Outcome != SoldOut {
				return adm, err
			}
			continue // taken by a buyer of the same home meanwhile
		}
		// Short: is the sale, or are the units on the move?
		rem, err := Remaining(ctx, c, k)
		if err != nil {
			return adm, err
		}
		adm.Remaining = max(0, rem[a.Region])
		if adm.Remaining < a.Quantity {
			return adm, nil
		}
	}
	// Out of rounds: the answer is sold out, with what the whole sale holds
	// (not what the home bucket held at its last ask), so that a sale with
	// units left is not marked sold out.
	rem, err := Remaining(ctx, c, k)
	if err != nil {
		return adm, err
	}
	adm.Remaining = max(0, rem[a.Region])
	return adm, nil
}

// gatherRounds bounds the gatherings of one purchase.
const gatherRounds = 4

// ErrBucketed is returned by the single-tag calls for a sale split over buckets.
var ErrBucketed = errors.New("sale is split over buckets: use its home bucket's keys")

// PendingTransfers lists the transfers taken from the sale's buckets and not
// yet cleared from the givers' ledgers.
func PendingTransfers(ctx context.Context, c rueidis.Client, k *Keys) ([]Transfer, error) {
	var out []Transfer
	for _, b := range k.buckets {
		m, err := c.Do(ctx, c.B().Hgetall().Key(b.xout).Build()).AsStrMap()
		if err != nil {
			return nil, fmt.Errorf("transfers of %s bucket %d: %w", k.Sale, b.index, err)
		}
		for id, v := range m {
			p := strings.Split(v, "|")
			if len(p) != 4 && len(p) != 5 {
				return nil, fmt.Errorf("transfer %s of %s: bad entry %q", id, k.Sale, v)
			}
			to, err1 := strconv.Atoi(p[0])
			n, err2 := strconv.ParseInt(p[2], 10, 64)
			if err1 != nil || err2 != nil {
				return nil, fmt.Errorf("transfer %s of %s: bad entry %q", id, k.Sale, v)
			}
			ms, _ := strconv.ParseInt(p[3], 10, 64)
			t := Transfer{ID: id, From: b.index, To: to, Region: p[1], Units: n, TakenMS: ms}
			if len(p) == 5 {
				t.Epoch = p[4]
			}
			out = append(out, t)
		}
	}
	return out, nil
}

// FinishTransfers lands every transfer a process took and did not land (it
// died between take and give), and prunes the records of landed transfers
// (ledgerKeep, receivedKeep). It is safe beside live transfers: give lands a
// transfer once. It answers how many transfers' units it landed now.
func FinishTransfers(ctx context.Context, c rueidis.Client, k *Keys) (int, error) {
	return finishTransfers(ctx, c, k, 0, replication{})
}

// FinishTransfersWait is FinishTransfers under redis.wait_replicas: a
// transfer is landed only once replicas replicas of the giver's master have
// its take (confirmTaken), and its record is pruned only once as many of the
// receiver's have its landing; the others are left for the next run.
func FinishTransfersWait(ctx context.Context, c rueidis.Client, k *Keys, replicas int, timeout time.Duration) (int, error) {
	return finishTransfers(ctx, c, k, 0, replication{replicas: replicas, timeout: timeout})
}

// The ages of ledger entries and received ids are judged by the clock of the
// master holding each (take.lua and give.lua stamp them with its TIME), read
// ahead by ahead (a test's way to age them).
func finishTransfers(ctx context.Context, c rueidis.Client, k *Keys, ahead time.Duration, w replication) (int, error) {
	n, _, err := finishTransfersLeft(ctx, c, k, ahead, w)
	return n, err
}

// finishTransfersLeft is finishTransfers that also answers the transfers it
// left unlanded: those whose take the replicas did not confirm.
func finishTransfersLeft(ctx context.Context, c rueidis.Client, k *Keys, ahead time.Duration, w replication) (int, []Transfer, error) {
	ts, err := PendingTransfers(ctx, c, k)
	if err != nil {
		return 0, nil, err
	}
	// clock is bucket b's master's TIME in ms, read once, after its entries.
	clocks := map[int]int64{}
	clock := func(b int) (int64, error) {
		if ms, ok := clocks[b]; ok {
			return ms, nil
		}
		t, err := ServerTime(ctx, c, k.buckets[b].xout)
		if err != nil {
			return 0, fmt.Errorf("transfers of %s bucket %d: %w", k.Sale, b, err)
		}
		clocks[b] = t.Add(ahead).UnixMilli()
		return clocks[b], nil
	}
	n := 0
	nowMS := time.Now().UnixMilli() // for the scripts' ARGV only: they stamp with TIME
	inLedger := map[string]bool{}
	var left []Transfer
	for _, t := range ts {
		ok, err := confirmTaken(ctx, c, k, t, w)
		if err != nil {
			return n, left, err
		}
		if !ok {
			inLedger[t.ID] = true
			left = append(left, t)
			continue
		}
		given, acked, err := land(ctx, c, k, t, nowMS, w)
		if err != nil {
			return n, left, err
		}
		if given {
			n++
		}
		if !acked {
			inLedger[t.ID] = true
			continue
		}
		// Landed now or before: the entry goes once it is old enough that no
		// reader's sum can still be straddling it (by its giver's clock).
		giverMS, err := clock(t.From)
		if err != nil {
			return n, left, err
		}
		if giverMS-t.TakenMS < ledgerKeep.Milliseconds() {
			inLedger[t.ID] = true
			continue
		}
		if err := c.Do(ctx, c.B().Hdel().Key(k.buckets[t.From].xout).Field(t.ID).Build()).Error(); err != nil {
			return n, left, fmt.Errorf("transfer %s of %s: clear ledger: %w", t.ID, k.Sale, err)
		}
	}
	// A received id goes long after its ledger entry, and never while one
	// is left: a give of it must find it landed.
	for _, b := range k.buckets {
		m, err := c.Do(ctx, c.B().Hgetall().Key(b.xin).Build()).AsStrMap()
		if err != nil {
			return n, left, fmt.Errorf("transfers into %s bucket %d: %w", k.Sale, b.index, err)
		}
		if len(m) == 0 {
			continue
		}
		receiverMS, err := clock(b.index)
		if err != nil {
			return n, left, err
		}
		var old []string
		for id, at := range m {
			ms, _ := strconv.ParseInt(at, 10, 64)
			if !inLedger[id] && receiverMS-ms >= receivedKeep.Milliseconds() {
				old = append(old, id)
			}
		}
		if len(old) > 0 {
			if err := c.Do(ctx, c.B().Hdel().Key(b.xin).Field(old...).Build()).Error(); err != nil {
				return n, left, fmt.Errorf("transfers into %s bucket %d: %w", k.Sale, b.index, err)
			}
		}
	}
	return n, left, nil
}

// remainingBucketed is Remaining for a split sale: each bucket's stock and
// ledger read in one step (view.lua). A transfer's units are counted when
// its giver's ledger shows it taken and its receiver's set did not show it
// landed: read before the take, the giver still held them; read after it,
// the entry is there (entries outlive their landing by ledgerKeep), and the
// receiver holds them exactly when its set shows them landed. So no unit on
// the move is missed; one can be counted twice (giver read before the take,
// receiver after the landing), never none.
func remainingBucketed(ctx context.Context, c rueidis.Client, k *Keys) (map[string]int64, error) {
	cmds := make(rueidis.Commands, len(k.buckets))
	regions := make([][]string, len(k.buckets))
	// keys[i] are bucket i's keys for view.lua, in the order of regions[i]:
	// a retry on a master that lost the library sends these same keys, so
	// each value read is added to its own region.
	keys := make([][]string, len(k.buckets))
	for i, b := range k.buckets {
		var stock []string
		regions[i], stock = b.StockKeys()
		keys[i] = append([]string{b.xout, b.xin}, stock...)
		cmds[i] = viewScript.cmd(c, keys[i], nil)
	}
	res := c.DoMulti(ctx, cmds...)
	out := make(map[string]int64)
	landed := make([]map[string]bool, len(k.buckets))
	var moving []Transfer
	for i, r := range res {
		v, err := r.ToArray()
		if notFound(err) {
			// A master that lost the library (restarted, new, failed over).
			v, err = viewScript.Exec(ctx, c, keys[i], nil).ToArray()
		}
		if err != nil || len(v) != 3 {
			return nil, fmt.Errorf("remaining %s bucket %d: %v", k.Sale, i, err)
		}
		stock, _ := v[0].AsStrSlice()
		for j, sv := range stock {
			if sv == "" {
				continue
			}
			n, err := strconv.ParseInt(sv, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("remaining %s bucket %d: %w", k.Sale, i, err)
			}
			out[regions[i][j]] += n
		}
		xout, _ := v[1].AsStrSlice()
		for j := 0; j+1 < len(xout); j += 2 {
			p := strings.Split(xout[j+1], "|")
			if len(p) != 4 && len(p) != 5 {
				return nil, fmt.Errorf("transfer %s of %s: bad entry %q", xout[j], k.Sale, xout[j+1])
			}
			to, _ := strconv.Atoi(p[0])
			n, _ := strconv.ParseInt(p[2], 10, 64)
			moving = append(moving, Transfer{ID: xout[j], From: i, To: to, Region: p[1], Units: n})
		}
		ids, _ := v[2].AsStrSlice()
		landed[i] = make(map[string]bool, len(ids))
		for _, id := range ids {
			landed[i][id] = true
		}
	}
	for _, t := range moving {
		if t.To < 0 || t.To >= len(k.buckets) {
			return nil, fmt.Errorf("transfer %s of %s: bucket out of range", t.ID, k.Sale)
		}
		if _, ok := out[t.Region]; ok && !landed[t.To][t.ID] {
			out[t.Region] += t.Units
		}
	}
	return out, nil
}

// byHome calls fn once per home bucket of n items (user(i) is item i's
// buyer) with the indexes of the items at home there, in bucket order.
func byHome(k *Keys, n int, user func(int) string, fn func(b *Keys, at []int) error) error {
	groups := make([][]int, len(k.buckets))
	for i := 0; i < n; i++ {
		h := HomeBucket(user(i), len(k.buckets))
		groups[h] = append(groups[h], i)
	}
	for b, at := range groups {
		if len(at) == 0 {
			continue
		}
		if err := fn(k.buckets[b], at); err != nil {
			return err
		}
	}
	return nil
}

// ByHome is byHome for the callers of single-tag calls (Claim): on a sale
// that is not split, fn is called once with k itself and every index.
func ByHome(k *Keys, n int, user func(int) string, fn func(b *Keys, at []int) error) error {
	if len(k.buckets) == 0 {
		at := make([]int, n)
		for i := range at {
			at[i] = i
		}
		return fn(k, at)
	}
	return byHome(k, n, user, fn)
}

// bucketStock reads every bucket's stock per region (0 for an absent key).
func bucketStock(ctx context.Context, c rueidis.Client, k *Keys) ([]map[string]int64, error) {
	out := make([]map[string]int64, len(k.buckets))
	for i, b := range k.buckets {
		out[i] = map[string]int64{}
		regions, keys := b.StockKeys()
		for j, r := range c.DoMulti(ctx, getAll(c, keys)...) {
			n, err := r.AsInt64()
			if err != nil && !rueidis.IsRedisNil(err) {
				return nil, fmt.Errorf("stock of %s bucket %d: %w", k.Sale, i, err)
			}
			out[i][regions[j]] = n
		}
	}
	return out, nil
}

func getAll(c rueidis.Client, keys []string) rueidis.Commands {
	cmds := make(rueidis.Commands, len(keys))
	for i, key := range keys {
		cmds[i] = c.B().Get().Key(key).Build()
	}
	return cmds
}

// BucketTagsOf reads a warm sale's bucket tags from its meta (nil: not split,
// or not warm).
func BucketTagsOf(ctx context.Context, c rueidis.Client, sale string) ([]string, error) {
	v, err := c.Do(ctx, c.B().Hget().Key(KeysFor(sale, nil).Meta).Field("buckets").Build()).ToString()
	if rueidis.IsRedisNil(err) || (err == nil && v == "") {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("buckets of %s: %w", sale, err)
	}
	return strings.Split(v, ","), nil
}
