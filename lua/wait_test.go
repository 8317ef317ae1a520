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
