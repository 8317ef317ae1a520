//go:build failpoints

package gateway

import (
	"log/slog"
	"os"
	"strconv"
)

// failpointsBuilt is true only in a binary built with -tags failpoints (the
// fault suite's): a production binary cannot be told by its environment to
// crash.
const failpointsBuilt = true

// armFailpoints reads the failpoints from the environment:
// FLASHGATE_FAILPOINT_CRASH_AFTER_ADMITS=N makes the process die between the
// N-th admission and its publish, as a kill -9 there would.
func (g *Gateway) armFailpoints() {
	if n, err := strconv.ParseInt(os.Getenv("FLASHGATE_FAILPOINT_CRASH_AFTER_ADMITS"), 10, 64); err == nil && n > 0 {
		slog.Warn("failpoint armed: the process exits between an admission and its publish", "after", n)
		g.crashAfter.Store(n)
	}
}
