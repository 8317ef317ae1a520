//go:build !failpoints

package gateway

import (
	"testing"
)

// TestFailpointEnvIgnoredInNormalBuild: the crash failpoint's variable, set
// to crash at the first admission, does nothing in a normal build: the buyer
// gets 202 and this test process (which runs the gateway) lives on to check.
func TestFailpointEnvIgnoredInNormalBuild(t *testing.T) {
	t.Setenv("FLASHGATE_FAILPOINT_CRASH_AFTER_ADMITS", "1")
	e := start(t)
	if n := e.g.crashAfter.Load(); n != 0 {
		t.Fatalf("failpoint armed (%d) in a build without -tags failpoints", n)
	}
	s := e.sale(nil)
	for _, u := range []string{"fp1", "fp2"} {
		if r := e.buy(s, e.token(u), `{}`, nil); r.Status != 202 {
			t.Fatalf("%s: %d %s", u, r.Status, r.Raw)
		}
	}
}
