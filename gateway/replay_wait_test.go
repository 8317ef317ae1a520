package gateway

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/flashgate/flashgate/config"
	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

// TestReplayAfterNotReplicated: under redis.wait_replicas 1 a purchase's
// admission came back ErrNotReplicated (its buyer was told 503; its undo has
// not run yet) and the buyer retries with the same Idempotency-Key. The
// admission answers replay; the replay must not answer 202 before the
// replicas have the order. On the standalone Redis (no replica) it answers
// 503; on the stack's Cluster (a replica behind every master), where the
// first admission asked for 2 replicas and one has it, the replay waits for
// that one and answers 202 with the first order's id.
func TestReplayAfterNotReplicated(t *testing.T) {
	wait := func(c *config.Config) { c.Redis.WaitReplicas, c.Redis.WaitTimeout = 1, 50*time.Millisecond }
	for _, tc := range []struct {
		name     string
		addrs    []string
		asked    int // replicas the first admission asked for
		want     int
		wantCode string
	}{
		{"standalone", nil, 1, 503, "unavailable"},
		{"cluster", testenv.ClusterAddrs(), 2, 202, "accepted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			muts := []func(*config.Config){wait}
			if tc.addrs != nil {
				muts = append(muts, func(c *config.Config) { c.Redis.Addrs = tc.addrs })
			}
			e := start(t, muts...)
			s := e.sale(nil)
			now := time.Now()
			a := lua.AdmitArgs{User: "alice", Quantity: 1, OrderID: uint64(now.UnixNano()), Now: now, PayBy: now.Add(time.Minute), IdemKey: "K-1"}
			// The first request's admission, not replicated as asked.
			adm, err := lua.Load().AdmitWait(context.Background(), e.rc, lua.KeysOf(s), a, tc.asked, 20*time.Millisecond)
			if !errors.Is(err, lua.ErrNotReplicated) || adm.Outcome != lua.Admitted {
				t.Fatalf("first admission: %+v %v, want admitted and ErrNotReplicated", adm, err)
			}
			r := e.buy(s, e.token("alice"), `{}`, map[string]string{"Idempotency-Key": "K-1"})
			if r.Status != tc.want || r.Code != tc.wantCode {
				t.Fatalf("same-key retry: %d %s, want %d %s", r.Status, r.Raw, tc.want, tc.wantCode)
			}
			if r.Status == 202 && r.OrderID != strconv.FormatUint(a.OrderID, 10) {
				t.Fatalf("same-key retry answered order %s, want the key's first order %d", r.OrderID, a.OrderID)
			}
		})
	}
}
