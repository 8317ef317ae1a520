#!/usr/bin/env bash
# CPU per accepted purchase, one binary against another (flashgate issue 13; bench/README.md).
#
#   scripts/bench-cpu.sh BIN [BIN...]     e.g. scripts/bench-cpu.sh /tmp/fg-before bin/flashgate bin/flashgate /tmp/fg-before
#
# For each BIN in turn (list them A B B A for an alternation): a bench gateway of that binary on
# the bench's port (rate limits off, like make bench's), then `BIN bench --create --rate R` for
# BENCH_CPU_DURATION, the same paced load each time (so that every run does the same work), then
# the wait until the stack's backend has written every order (the JetStream consumer has nothing
# pending or unacknowledged). utime + stime of each process of the chain are read from /proc
# before the load, when it ends and when the orders are written: CPU µs per accepted purchase, for
# the load and for the whole (load + drain). Also what each purchase cost in Redis commands
# (INFO commandstats) and NATS messages (the monitor's in/out counts), and each process's run-queue
# wait and context switches per purchase (the wake-ups it paid for). With BENCH_CPU_GCTRACE=1 the
# gateway runs with GODEBUG=gctrace=1 (its GC cycles counted in the output).
#
# Needs the stack (scripts/stack.sh up: infra and backend). Environment: BENCH_CPU_RATE (1500),
# BENCH_CPU_DURATION (10s), BENCH_CPU_USERS (200000), BENCH_GATEWAY_PORT (18080 + STACK_PORT_OFFSET),
# BENCH_GATEWAY_ADMIN_PORT (18081 + STACK_PORT_OFFSET), STACK_CONFIG (configs/flashgate.yaml).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin:/usr/local/go/bin"
# shellcheck source=scripts/goruntime.sh
. "$ROOT/scripts/goruntime.sh"
RATE="${BENCH_CPU_RATE:-1500}"
DURATION="${BENCH_CPU_DURATION:-10s}"
USERS="${BENCH_CPU_USERS:-200000}"
OFFSET="${STACK_PORT_OFFSET:-0}"
GW_PORT="${BENCH_GATEWAY_PORT:-$((18080 + OFFSET))}"
GW_ADMIN="${BENCH_GATEWAY_ADMIN_PORT:-$((18081 + OFFSET))}"
CONFIG="${STACK_CONFIG:-configs/flashgate.yaml}"
RUN="$ROOT/var/run"
OUT="$ROOT/var/bench/cpu"
(($# > 0)) || {
	echo "usage: scripts/bench-cpu.sh BIN [BIN...]" >&2
	exit 2
}
mkdir -p "$OUT"
# shellcheck disable=SC1091 # written by scripts/stack.sh
. "$ROOT/var/secrets.env"
export FLASHGATE_DEV="${FLASHGATE_DEV:-1}"
NATS_MON="http://127.0.0.1:18222"
[[ -n "${STACK_PORT_OFFSET:-}" ]] && NATS_MON="http://127.0.0.1:$((18222 + STACK_PORT_OFFSET))"
REDIS_PORT="${FLASHGATE_REDIS_ADDRS##*:}"
export REDISCLI_AUTH="$FLASHGATE_REDIS_PASSWORD"

pid_in() { [[ -f "$1" ]] && tr -dc '0-9' <"$1"; }
ticks() { # ticks PID...
	local p sum=0 st
	local -a f
	for p in "$@"; do
		[[ -n "$p" && -r "/proc/$p/stat" ]] || continue
		st="$(cat "/proc/$p/stat")"
		read -r -a f <<<"${st##*) }"
		sum=$((sum + f[11] + f[12]))
	done
	echo "$sum"
}
# runq PID...: how long the processes' threads waited on a run queue, runnable but not running
# (ns, /proc/<pid>/task/*/schedstat's second field): the CPU a purchase waited for, not used.
runq() {
	local p t w sum=0
	for p in "$@"; do
		[[ -n "$p" && -d "/proc/$p/task" ]] || continue
		for t in /proc/"$p"/task/*/schedstat; do
			read -r _ w _ <"$t" 2>/dev/null && sum=$((sum + w))
		done
	done
	echo "$sum"
}
# switches PID...: how often the processes' threads were switched out (voluntary and not,
# /proc/<pid>/task/*/status): each is a wake-up to pay for. Threads that ended are not counted.
switches() {
	local p t sum=0
	for p in "$@"; do
		[[ -n "$p" && -d "/proc/$p/task" ]] || continue
		for t in /proc/"$p"/task/*/status; do
			sum=$((sum + $(awk '/ctxt_switches/ { n += $2 } END { print n + 0 }' "$t" 2>/dev/null || echo 0)))
		done
	done
	echo "$sum"
}
# each GWPID FN: FN of "gateway redis nats backend mariadb"
each() {
	local rp=() f
	for f in "$RUN"/redis-*.pid; do rp+=("$(pid_in "$f")"); done
	echo "$("$2" "$1") $("$2" "${rp[@]}") $("$2" "$(pid_in "$RUN/nats.pid")") $("$2" "$(pid_in "$RUN/backend.pid")") $("$2" "$(pid_in "$RUN/mariadb.pid")")"
}
redis_calls() { # total calls per command, "cmd calls" lines
	redis-cli --user "$FLASHGATE_REDIS_USERNAME" -p "$REDIS_PORT" --no-auth-warning INFO commandstats |
		tr -d '\r' | sed -nE 's/^cmdstat_([a-z|_]+):calls=([0-9]+),usec=([0-9]+).*/\1 \2 \3/p'
}
nats_msgs() { curl -s "$NATS_MON/varz" | tr -d ' \n' | sed -E 's/.*"in_msgs":([0-9]+),"out_msgs":([0-9]+).*/\1 \2/'; }
drained() {
	curl -s "$NATS_MON/jsz?consumers=true" | tr -d ' \n' |
		grep -qE '"num_ack_pending":0,"num_redelivered":[0-9]+,"num_waiting":[0-9]+,"num_pending":0'
}
CLK="$(getconf CLK_TCK)"

printf '%-28s %8s | %-44s | %-44s | %s\n' binary accepted "load: gw redis nats backend mariadb = chain" "whole: gw redis nats backend mariadb = chain" "per purchase: redis cmds (admit.lua µs), nats msgs in/out, drain s"
for bin in "$@"; do
	log="$OUT/$(basename "$bin")-$(date +%H%M%S).log"
	(
		export FLASHGATE_GATEWAY_LISTEN="127.0.0.1:$GW_PORT" FLASHGATE_GATEWAY_ADMIN_LISTEN="127.0.0.1:$GW_ADMIN"
		export FLASHGATE_RATELIMIT_PER_IP_RATE=0 FLASHGATE_RATELIMIT_PER_USER_RATE=0 FLASHGATE_RATELIMIT_PER_SALE_RATE=0
		[[ "${BENCH_CPU_GCTRACE:-0}" == 1 ]] && export GODEBUG=gctrace=1
		exec setsid "$bin" gateway --config "$CONFIG" --log-level warn
	) </dev/null >"$log" 2>&1 &
	gw=$!
	for ((i = 0; i < 300; i++)); do
		[[ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "http://127.0.0.1:$GW_ADMIN/readyz")" == 200 ]] && break
		sleep 0.1
	done
	sale="cpu-$(date +%H%M%S%N | cut -c1-10)"
	
	"$ROOT/bin/flashgate" sale create --config "$CONFIG" --id "$sale" --total 100000000 --per-user-limit 1 >/dev/null 2>&1 || true
	sleep 1
	r0="$(redis_calls)"
	n0="$(nats_msgs)"
	s0="$(each "$gw" ticks)"
	q0="$(each "$gw" runq)"
	w0="$(each "$gw" switches)"
	t0="$(date +%s.%N)"
	"$ROOT/bin/flashgate" bench --config "$CONFIG" --no-check --sale "$sale" --target "http://127.0.0.1:$GW_PORT" \
		--users "$USERS" --concurrency 256 --duration "$DURATION" --rate "$RATE" --json "$OUT/last.json" >"$OUT/last.out" 2>&1 || true
	s1="$(each "$gw" ticks)"
	q1="$(each "$gw" runq)"
	w1="$(each "$gw" switches)"
	t1="$(date +%s.%N)"
	for ((i = 0; i < 1200; i++)); do drained && break; sleep 0.1; done
	s2="$(each "$gw" ticks)"
	t2="$(date +%s.%N)"
	r1="$(redis_calls)"
	n1="$(nats_msgs)"
	curl -s "http://127.0.0.1:$GW_ADMIN/metrics" >"$OUT/last.metrics" || true
	kill -TERM "$gw" 2>/dev/null || true
	wait "$gw" 2>/dev/null || true
	"$ROOT/bin/flashgate" sale close --config "$CONFIG" "$sale" >/dev/null 2>&1 || true
	acc="$(sed -nE 's/.*"accepted": *([0-9]+).*/\1/p' "$OUT/last.json" | head -1)"
	[[ -n "$acc" && "$acc" -gt 0 ]] || {
		echo "$bin: no accepted purchases (see $OUT/last.out)" >&2
		continue
	}
	gcs="$(grep -c '^gc ' "$log" || true)"
	[[ "$gcs" != 0 ]] && gcs+=" ($(grep '^gc ' "$log" | tail -1 | awk '{print $4}' | tr -d :) of its CPU since start)"
	# The gateway's own view of a purchase's waits (its histograms): the admission (Redis) and the
	# publish (the JetStream ack), p50 and p99 from the buckets.
	waits="$(awk '
		/^flashgate_gateway_(admit|publish)_duration_seconds_bucket/ {
			split($0, a, "le=\""); split(a[2], b, "\""); n = (index($0, "admit") ? "admit" : "publish")
			le[n, ++k[n]] = b[1]; c[n, k[n]] = $NF
		}
		END {
			for (n in k) {
				tot = c[n, k[n]]; p50 = p99 = ""
				for (i = 1; i <= k[n]; i++) {
					if (p50 == "" && c[n, i] >= tot * 0.5) p50 = le[n, i]
					if (p99 == "" && c[n, i] >= tot * 0.99) p99 = le[n, i]
				}
				printf "%s p50 <= %s s, p99 <= %s s; ", n, p50, p99
			}
		}' "$OUT/last.metrics")"
	lat="$(tr -d ' \n' <"$OUT/last.json" | sed -nE 's/.*"accepted_latency_us":\{[^}]*"p50":([0-9]+)[^}]*"p99":([0-9]+).*/202 p50 \1 us, p99 \2 us/p' | head -1)"
	awk -v a="$s0" -v b="$s1" -v c="$s2" -v n="$acc" -v clk="$CLK" -v bin="$bin" -v r0="$r0" -v r1="$r1" \
		-v n0="$n0" -v n1="$n1" -v drain="$(echo "$t2 - $t1" | bc)" -v gcs="$gcs" -v waits="$waits" -v lat="$lat" -v q0="$q0" -v q1="$q1" -v w0="$w0" -v w1="$w1" '
	function per(x, y,   i, s, t, out) {
		split(x, X, " "); split(y, Y, " "); t = 0; out = ""
		for (i = 1; i <= 5; i++) { s = (Y[i] - X[i]) / clk * 1e6 / n; t += s; out = out sprintf("%5.0f", s) }
		return out sprintf(" = %5.0f", t)
	}
	BEGIN {
		nr0 = split(r0, R0, "\n"); for (i = 1; i <= nr0; i++) { split(R0[i], f, " "); c0[f[1]] = f[2]; u0[f[1]] = f[3] }
		nr1 = split(r1, R1, "\n"); cmds = ""
		for (i = 1; i <= nr1; i++) {
			split(R1[i], f, " "); d = f[2] - c0[f[1]]
			if (d / n >= 0.01) cmds = cmds sprintf("%s %.2f ", f[1], d / n)
			if (f[1] == "evalsha") us = (f[3] - u0[f[1]]) / (d > 0 ? d : 1)
		}
		split(n0, N0, " "); split(n1, N1, " ")
		split(q0, Q0, " "); split(q1, Q1, " "); rq = "run-queue wait µs per purchase (load): gw redis nats backend mariadb ="
		for (i = 1; i <= 5; i++) rq = rq sprintf(" %.0f", (Q1[i] - Q0[i]) / 1000 / n)
		split(w0, W0, " "); split(w1, W1, " "); rq = rq "; context switches per purchase (load): gw redis nats backend mariadb ="
		for (i = 1; i <= 5; i++) rq = rq sprintf(" %.1f", (W1[i] - W0[i]) / n)
		printf "%-28s %8d | %s | %s | %s(evalsha %.1f µs); nats %.2f/%.2f; drain %.1f s; gc cycles %s; %s; %s; %s\n", bin, n, per(a, b), per(a, c), cmds, us,
			(N1[1] - N0[1]) / n, (N1[2] - N0[2]) / n, drain, gcs, lat, waits, rq
	}'
done
