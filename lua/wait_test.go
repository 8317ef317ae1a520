package lua_test

import (
	"errors"
	"testing"
	"time"

	"github.com/flashgate/flashgate/internal/testenv"
	"github.com/flashgate/flashgate/lua"
)

// TestAdmitWait: on the stack's Cluster (a replica behind every master) an
// admission that waits for one replica is admitted once its replica has it;
// asking for more replicas than the master has, or for one on the standalone
// Redis (none), admits in Redis but answers ErrNotReplicated after the
// timeout, the admission still there for the caller to undo. The script runs
// on a shard that lost the library (loaded again by the caller) as on one that
// did not.
func TestAdmitWait(t *testing.T) {
	cluster := testenv.Redis(t, testenv.ClusterAddrs())
	s := newSale(t, cluster, nil)
	for i, user := range []string{"alice", "bob"} {
		a := lua.AdmitArgs{User: user, Quantity: 1, OrderID: nextID(), Now: time.Now()}
		a.PayBy = a.Now.Add(time.Minute)
		adm, err := scripts.AdmitWait(ctx(t), cluster, s.k, a, 1, time.Second)
		if err != nil || adm.Outcome != lua.Admitted || adm.Remaining != int64(9-i) {
			t.Fatalf("AdmitWait 1 replica, %s = %+v, %v; want admitted, %d left", user, adm, err, 9-i)
		}
	}
	a := lua.AdmitArgs{User: "carol", Quantity: 1, OrderID: nextID(), Now: time.Now()}
	a.PayBy = a.Now.Add(time.Minute)
	adm, err := scripts.AdmitWait(ctx(t), cluster, s.k, a, 2, 20*time.Millisecond)
	if !errors.Is(err, lua.ErrNotReplicated) || adm.Outcome != lua.Admitted {
		t.Fatalf("AdmitWait 2 replicas of 1 = %+v, %v; want admitted and ErrNotReplicated", adm, err)
	}
	if got := s.held("carol"); got != 1 {
		t.Errorf("carol holds %d after the unreplicated admission, want 1 (the caller releases it)", got)
	}
	// A refusal is not waited on: nothing was promised.
	a = lua.AdmitArgs{User: "alice", Quantity: 5, OrderID: nextID(), Now: time.Now()}
	a.PayBy = a.Now.Add(time.Minute)
	if adm, err := scripts.AdmitWait(ctx(t), cluster, s.k, a, 2, 20*time.Millisecond); err != nil || adm.Outcome == lua.Admitted {
		t.Errorf("AdmitWait of a refused purchase = %+v, %v; want a refusal, no error", adm, err)
	}

	standalone := testenv.Redis(t, testenv.RedisAddrs())
	s = newSale(t, standalone, nil)
	// The function is unknown there now: AdmitWait loads the library again.
	_, library := lua.Library()
	if err := standalone.Do(ctx(t), standalone.B().FunctionDelete().LibraryName(library).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	a = lua.AdmitArgs{User: "dave", Quantity: 1, OrderID: nextID(), Now: time.Now()}
	a.PayBy = a.Now.Add(time.Minute)
	if adm, err := scripts.AdmitWait(ctx(t), standalone, s.k, a, 1, 20*time.Millisecond); !errors.Is(err, lua.ErrNotReplicated) || adm.Outcome != lua.Admitted {
		t.Errorf("AdmitWait on a Redis without replicas = %+v, %v; want ErrNotReplicated", adm, err)
	}
}

// TestClaimAndReleaseWait: under redis.wait_replicas a backend's claim and a
// gateway's release are answered only once the replicas have them. On the
// Cluster (one replica a master) both are; asking for two replicas, the
// write stands on the master but the call answers ErrNotReplicated, and
// running it again is harmless (a claim finds its own claim, a release its
// own release). A backend's release (MySQL refused the order) is not waited
// on: a failover that lost it leaves a reservation reconcile writes back.
func TestClaimAndReleaseWait(t *testing.T) {
	cluster := testenv.Redis(t, testenv.ClusterAddrs())
	s := newSale(t, cluster, nil)
	one, two := lua.LoadWait(1, time.Second), lua.LoadWait(2, 20*time.Millisecond)

	claimed, _ := s.mustAdmit(lua.AdmitArgs{User: "alice", Quantity: 1})
	if st, err := one.Claim(ctx(t), cluster, s.k, []uint64{claimed}); err != nil || st[0] != lua.ClaimOK {
		t.Fatalf("claim waiting for 1 replica: %v, %v", st, err)
	}
	unrep, _ := s.mustAdmit(lua.AdmitArgs{User: "bob", Quantity: 1})
	if _, err := two.Claim(ctx(t), cluster, s.k, []uint64{unrep}); !errors.Is(err, lua.ErrNotReplicated) {
		t.Fatalf("claim waiting for 2 replicas of 1: %v, want ErrNotReplicated", err)
	}
	if rec, _ := s.order(unrep); rec.Status != "processing" {
		t.Fatalf("the unreplicated claim is not on the master: %+v", rec)
	}
	if st, err := one.Claim(ctx(t), cluster, s.k, []uint64{unrep}); err != nil || st[0] != lua.ClaimOK {
		t.Fatalf("the claim again: %v, %v", st, err)
	}

	gone, _ := s.mustAdmit(lua.AdmitArgs{User: "carol", Quantity: 1})
	if _, err := two.Release(ctx(t), cluster, s.k, gone, "", "", lua.ReleaseGateway, "publish_failed"); !errors.Is(err, lua.ErrNotReplicated) {
		t.Fatalf("gateway release waiting for 2 replicas of 1: %v, want ErrNotReplicated", err)
	}
	r, err := one.Release(ctx(t), cluster, s.k, gone, "", "", lua.ReleaseGateway, "publish_failed")
	if err != nil || r.Released || r.Status != "released" {
		t.Fatalf("the release again = %+v, %v; want already released", r, err)
	}
	if r, err := two.Release(ctx(t), cluster, s.k, claimed, "", "", lua.ReleaseGateway, "publish_failed"); !errors.Is(err, lua.ErrNotReplicated) || r.Claimed {
		t.Fatalf("gateway release of a claimed order, 2 replicas of 1 = %+v, %v; want ErrNotReplicated", r, err)
	}
	if r, err := one.Release(ctx(t), cluster, s.k, claimed, "", "", lua.ReleaseGateway, "publish_failed"); err != nil || !r.Claimed {
		t.Fatalf("gateway release of a claimed order = %+v, %v; want claimed", r, err)
	}
	if _, err := two.Release(ctx(t), cluster, s.k, unrep, "", "", lua.ReleaseBackend, "sold_out"); err != nil {
		t.Fatalf("backend release under wait: %v, want no wait", err)
	}
	if s.remaining("") != 9 {
		t.Fatalf("remaining %d, want 9 (carol's and bob's units back, alice's claimed)", s.remaining(""))
	}
}
