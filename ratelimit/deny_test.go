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
	d.Deny("a", now, now+int64(time.Second))
	if ok, wait := d.Denied("a", now+int64(time.Millisecond)); !ok || wait != 999*time.Millisecond {
		t.Fatalf("a: %v %v", ok, wait)
	}
	if ok, _ := d.Denied("a", now+int64(time.Second)); ok {
		t.Fatal("a refused after its wait")
	}
	d.Deny("b", now, now+int64(time.Second))
	d.Deny("c", now, now+int64(time.Second))
	d.Deny("d", now, now+int64(time.Second)) // full: not remembered
	if ok, _ := d.Denied("d", now); ok {
		t.Fatal("a full cache remembered d")
	}
	later := now + 2*int64(time.Second)
	d.Deny("e", later, later+int64(time.Second)) // the sweep frees b and c
	if ok, _ := d.Denied("e", later); !ok {
		t.Fatal("e not remembered after the sweep")
	}
	if n := d.Sweep(later + 2*int64(time.Second)); n != 0 {
		t.Fatalf("%d left after every wait", n)
	}
}
