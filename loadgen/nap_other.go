//go:build !linux

package loadgen

import "time"

// nap sleeps d (with a Go timer's precision: see pace).
func nap(d time.Duration) { time.Sleep(d) }
