//go:build race

package gateway

// raceBuild: the race detector's instrumentation allocates where a normal
// build does not, so allocation counts are checked only without it.
const raceBuild = true
