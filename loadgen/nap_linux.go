package loadgen

import (
	"syscall"
	"time"
)

// nap sleeps d in the kernel, with nanosleep(2)'s precision (see pace).
func nap(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	for syscall.Nanosleep(&ts, &ts) == syscall.EINTR {
	}
}
