# shellcheck shell=bash
# Sourced by every script that starts flashgate's Go processes: the stack's gateways, backends
# and nats-server (scripts/stack.sh), the benches' gateways and load tools (scripts/bench*.sh,
# scripts/hostile.sh). The systemd units in deploy/systemd set the same; goruntime_test.go checks.
#
# The Go runtime's monitor thread (sysmon) sleeps deeply while every P is idle; the first system
# call after that wakes it and starts it over at 20 µs naps (go.dev/issue/18236). A server at a
# moderate rate goes idle between requests, so its sysmon ran at 50,000 wake-ups a second: 28-32%
# of the gateway's CPU in `perf` at 1,000-5,800 requests/s. With schedtrace set, sysmon never
# sleeps deeply and backs off to its 10 ms naps as in any busy process; the trace line it would
# print is due every 2^31-1 ms (24.8 days). Measured: docs/runbook.md, "The Go runtime's idle
# wake-ups". A schedtrace the caller already set wins (it comes later in GODEBUG).
case ",${GODEBUG:-}," in
*,schedtrace=*) ;;
*) export GODEBUG="schedtrace=2147483647${GODEBUG:+,$GODEBUG}" ;;
esac
