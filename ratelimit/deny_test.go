package ratelimit

import (
	"testing"
	"time"
)

// TestDenyCache: a refused key is refused from memory until its wait ends;
// a full cache remembers nothing new until a sweep frees room.
func TestDenyCache(t *testing.T) {
	d := NewDenyCache(2)
	now := int64(time.Hour)
	d.Deny(DenyKey{ID: "a"}, now, now+int64(time.Second))
	if ok, wait := d.Denied(DenyKey{ID: "a"}, now+int64(time.Millisecond)); !ok || wait != 999*time.Millisecond {
		t.Fatalf("a: %v %v", ok, wait)
	}
	if ok, _ := d.Denied(DenyKey{ID: "a"}, now+int64(time.Second)); ok {
		t.Fatal("a refused after its wait")
	}
	d.Deny(DenyKey{ID: "b"}, now, now+int64(time.Second))
	d.Deny(DenyKey{ID: "c"}, now, now+int64(time.Second))
	d.Deny(DenyKey{ID: "d"}, now, now+int64(time.Second)) // full: not remembered
	if ok, _ := d.Denied(DenyKey{ID: "d"}, now); ok {
		t.Fatal("a full cache remembered d")
	}
	later := now + 2*int64(time.Second)
	d.Deny(DenyKey{ID: "e"}, later, later+int64(time.Second)) // the sweep frees b and c
	if ok, _ := d.Denied(DenyKey{ID: "e"}, later); !ok {
		t.Fatal("e not remembered after the sweep")
	}
	if n := d.Sweep(later + 2*int64(time.Second)); n != 0 {
		t.Fatalf("%d left after every wait", n)
	}
}

// TestDenyCacheRefusalAllocatesNothing: a refusal from memory costs no
// allocation (docs/gateway.md: the refusals answered from memory).
func TestDenyCacheRefusalAllocatesNothing(t *testing.T) {
	d := NewDenyCache(10)
	now := int64(time.Hour)
	id := "sale-1"
	d.Deny(DenyKey{Kind: 2, ID: id}, now, now+int64(time.Minute))
	if n := testing.AllocsPerRun(1000, func() {
		if ok, _ := d.Denied(DenyKey{Kind: 2, ID: id}, now); !ok {
			t.Fatal("not denied")
		}
	}); n != 0 {
		t.Fatalf("%v allocs per refusal", n)
	}
}
