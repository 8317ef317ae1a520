package main

import (
	"testing"

	"github.com/flashgate/flashgate"
)

func TestLimitsFlag(t *testing.T) {
	var l limitsFlag
	for _, s := range []string{"phone:1:orders:day", "address:1", "ip:5:day", "device:2:units"} {
		if err := l.Set(s); err != nil {
			t.Fatalf("Set(%q): %v", s, err)
		}
	}
	want := []flashgate.Limit{
		{Dimension: "phone", Max: 1, Of: "orders", Per: "day"},
		{Dimension: "address", Max: 1},
		{Dimension: "ip", Max: 5, Per: "day"},
		{Dimension: "device", Max: 2, Of: "units"},
	}
	if len(l) != len(want) {
		t.Fatalf("%+v", l)
	}
	for i := range want {
		if l[i] != want[i] {
			t.Errorf("limit %d = %+v, want %+v", i, l[i], want[i])
		}
	}
	for _, bad := range []string{"phone", "phone:x", "phone:1:week", "a:1:2:3:4"} {
		if err := l.Set(bad); err == nil {
			t.Errorf("Set(%q) took it", bad)
		}
	}
	// What the flag cannot judge, the spec does: an unknown dimension.
	s := flashgate.Sale{Limits: limitsFlag{{Dimension: "email", Max: 1}}}
	if err := s.Validate(); err == nil {
		t.Error("Validate took an email limit")
	}
}
