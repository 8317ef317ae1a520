package gateway

import (
	"log/slog"
	"syscall"
)

// raiseFDLimit lifts the soft RLIMIT_NOFILE to the hard limit and returns the
// soft limit in force. Go (1.19+) already does this when the process starts,
// so it is normally a no-op; it is done again because the public port's
// connection cap is derived from it and must not trust that it happened.
func raiseFDLimit() uint64 {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		slog.Warn("gateway: RLIMIT_NOFILE unknown", "err", err)
		return 0
	}
	if r.Cur < r.Max {
		was := r.Cur
		r.Cur = r.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
			slog.Warn("gateway: cannot raise RLIMIT_NOFILE", "soft", was, "hard", r.Max, "err", err)
			r.Cur = was
		}
	}
	slog.Info("gateway: file descriptor limit", "soft", r.Cur, "hard", r.Max)
	return r.Cur
}

// fdHeadroom is what the connection cap leaves of the descriptor limit for
// everything else: Redis and NATS connections, the admin port, refusals
// lingering above the cap, log and config files.
func fdHeadroom(limit uint64) uint64 { return min(512, limit/4) }

// connCap is the public port's cap on open connections: the configured one,
// else the descriptor limit less headroom; never above concurrency.
func connCap(maxConns, concurrency int, fdLimit uint64) int {
	n := maxConns
	if n <= 0 {
		n = 1 << 30
		if fdLimit > 0 {
			n = int(min(fdLimit-fdHeadroom(fdLimit), 1<<30))
		}
	}
	if concurrency > 0 {
		n = min(n, concurrency)
	}
	return max(n, 1)
}
