#!/usr/bin/env bash
# flashgate yardstick: the seeds' synchronous design (flashgate issue 6; see bench/README.md).
#
# Builds bin/flashgate and bin/seedsync (bench/seedsync: the seed articles' first solution, one
# MySQL transaction per purchase: stock check, one order per user, UPDATE … SET stock = stock - 1
# WHERE id = ? AND stock > 0, INSERT the order), starts the seeds server on 127.0.0.1:18095 with
# its own database (flashgate_seedsync) on the project's MariaDB and a fresh sale whose stock
# never runs out within the run, drives it with the project's own load tool, unchanged:
#   bin/flashgate bench --sale <sale> --no-check --target http://127.0.0.1:18095 \
#     --users $BENCH_USERS --concurrency $BENCH_CONCURRENCY --duration $BENCH_DURATION
# then stops it and counts the orders in MySQL. So the figure is the rate of successful
# purchases: orders_per_s = orders committed in MySQL / the run's elapsed time, checked against
# the 202s the load tool counted (an accepted order missing from MySQL fails the run).
#
# The last line of stdout is one JSON object:
#   {"name":"seeds_sync","orders_per_s":…,"req_per_s":…,"accepted":…,"p50_ms":…,"p99_ms":…,
#    "stock_left":…,"orders_in_db":…, …}
# (p50/p99: latency of the 202 answers, from the load tool's HDR histogram.) Raw output:
# var/bench/seedsync-bench.txt; the server's log: var/log/bench-seedsync.log. The sale is deleted
# at the end (BENCH_SEEDSYNC_KEEP=1 keeps it).
#
# Environment: BENCH_USERS (200000), BENCH_CONCURRENCY (256), BENCH_DURATION (10s),
# BENCH_SEEDSYNC_PORT (18095), BENCH_SEEDSYNC_STOCK (10000000), BENCH_SEEDSYNC_POOL (the seeds'
# MySQL pool; default the product's mysql.max_open_conns), BENCH_SEEDSYNC_DSN (default: the
# server of FLASHGATE_MYSQL_DSN, or 127.0.0.1:13306, database flashgate_seedsync), GO (go),
# FLASHGATE_JWT_SECRET (the Makefile's local value by default).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin:/usr/local/go/bin"

USERS="${BENCH_USERS:-200000}"
CONC="${BENCH_CONCURRENCY:-256}"
DURATION="${BENCH_DURATION:-10s}"
PORT="${BENCH_SEEDSYNC_PORT:-18095}"
STOCK="${BENCH_SEEDSYNC_STOCK:-10000000}"
POOL="${BENCH_SEEDSYNC_POOL:-}"
GO="${GO:-go}"
BIN="$ROOT/bin/flashgate"
SEEDS="$ROOT/bin/seedsync"
STACK="$ROOT/scripts/stack.sh"
OUT="$ROOT/var/bench"
LOG="$ROOT/var/log"
# The same local-only secret as the Makefile (and so as a stack `make up` started).
export FLASHGATE_JWT_SECRET="${FLASHGATE_JWT_SECRET:-flashgate-local-dev-jwt-secret}"
# The local values above are published: only dev mode accepts them.
export FLASHGATE_DEV="${FLASHGATE_DEV:-1}"

say() { printf 'bench-seedsync: %s\n' "$*" >&2; }
die() {
	printf 'bench-seedsync: ERROR: %s\n' "$1" >&2
	if [[ -n "${2:-}" && -f "$2" ]]; then
		printf -- '---- last 20 lines of %s ----\n' "$2" >&2
		tail -n 20 "$2" >&2 || true
	fi
	exit 1
}
tcp_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
posint() { [[ "$1" =~ ^[1-9][0-9]*$ ]]; }

command -v "$GO" >/dev/null 2>&1 || die "'$GO' not found (Go lives in /usr/local/go/bin)"
posint "$USERS" && posint "$CONC" && posint "$STOCK" && posint "$PORT" ||
	die "BENCH_USERS, BENCH_CONCURRENCY, BENCH_SEEDSYNC_STOCK and BENCH_SEEDSYNC_PORT must be positive whole numbers"
[[ -z "$POOL" ]] || posint "$POOL" || die "BENCH_SEEDSYNC_POOL must be a positive whole number"
tcp_open "$PORT" && die "127.0.0.1:$PORT is taken (BENCH_SEEDSYNC_PORT chooses another)"
mkdir -p "$OUT" "$LOG"
rm -f "$OUT"/seedsync-*.txt

SEEDS_ARGS=()
[[ -n "${BENCH_SEEDSYNC_DSN:-}" ]] && SEEDS_ARGS+=(--dsn "$BENCH_SEEDSYNC_DSN")
if [[ -z "${BENCH_SEEDSYNC_DSN:-}" && -z "${FLASHGATE_MYSQL_DSN:-}" ]] && ! tcp_open 13306; then
	say "no MariaDB on 127.0.0.1:13306: scripts/stack.sh infra-up"
	"$STACK" infra-up >>"$LOG/bench-seedsync-stack.log" 2>&1 || die "scripts/stack.sh infra-up failed" "$LOG/bench-seedsync-stack.log"
fi

say "building bin/flashgate and bin/seedsync"
"$GO" build -o "$BIN" ./cmd/flashgate || die "go build ./cmd/flashgate failed"
"$GO" build -o "$SEEDS" ./bench/seedsync || die "go build ./bench/seedsync failed"

# ---------------------------------------------------------------------------------------------
# clean-up: the seeds server, always; the sale's rows unless BENCH_SEEDSYNC_KEEP=1

SALE="seeds-$(date +%Y%m%d%H%M%S)-$RANDOM"
SRV_PID=""
LOAD_PID=""
stop_server() {
	local i
	[[ -n "$SRV_PID" ]] || return 0
	kill -TERM "$SRV_PID" 2>/dev/null || true
	for ((i = 0; i < 150; i++)); do kill -0 "$SRV_PID" 2>/dev/null || break; sleep 0.1; done
	if kill -0 "$SRV_PID" 2>/dev/null; then kill -KILL "$SRV_PID" 2>/dev/null || true; fi
	wait "$SRV_PID" 2>/dev/null || true
	SRV_PID=""
}
cleanup() {
	local rc=$?
	if [[ -n "$LOAD_PID" ]] && kill -0 "$LOAD_PID" 2>/dev/null; then
		kill -TERM "$LOAD_PID" 2>/dev/null || true # its first signal ends the load
		wait "$LOAD_PID" 2>/dev/null || true
	fi
	stop_server
	if [[ "${BENCH_SEEDSYNC_KEEP:-}" != 1 ]]; then
		"$SEEDS" "${SEEDS_ARGS[@]}" --sale "$SALE" --delete >>"$LOG/bench-seedsync.log" 2>&1 ||
			printf 'bench-seedsync: could not delete sale %s (see %s)\n' "$SALE" "$LOG/bench-seedsync.log" >&2
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------------------------
# the seeds server

[[ -n "$POOL" ]] && SEEDS_ARGS+=(--max-open-conns "$POOL")
printf '\n==== bench-seedsync %s ====\n' "$(date -Is)" >>"$LOG/bench-seedsync.log"
"$SEEDS" "${SEEDS_ARGS[@]}" --listen "127.0.0.1:$PORT" --sale "$SALE" --stock "$STOCK" \
	</dev/null >>"$LOG/bench-seedsync.log" 2>&1 &
SRV_PID=$!
for ((i = 0; i < 300; i++)); do
	tcp_open "$PORT" && break
	kill -0 "$SRV_PID" 2>/dev/null || die "the seeds server exited at start" "$LOG/bench-seedsync.log"
	sleep 0.1
done
tcp_open "$PORT" || die "the seeds server is not listening on 127.0.0.1:$PORT after 30s" "$LOG/bench-seedsync.log"
say "seeds server (pid $SRV_PID) on 127.0.0.1:$PORT, sale $SALE with $STOCK units, $(sed -n 's/.*(MySQL pool \([0-9]*\)).*/\1/p' "$LOG/bench-seedsync.log" | tail -n 1) MySQL connections"

# ---------------------------------------------------------------------------------------------
# the load: the project's own tool, unchanged

RAW="$OUT/seedsync-bench.txt"
CMD=("$BIN" bench --sale "$SALE" --no-check --target "http://127.0.0.1:$PORT"
	--users "$USERS" --concurrency "$CONC" --duration "$DURATION")
say "${CMD[*]#"$ROOT/"}"
# In the background, so that a signal to this script is handled at once, not after the run.
"${CMD[@]}" >"$RAW" &
LOAD_PID=$!
rc=0
wait "$LOAD_PID" || rc=$?
LOAD_PID=""
((rc == 0)) || die "flashgate bench failed (exit $rc)" "$RAW"
cat "$RAW" >&2
stop_server

REP="$("$SEEDS" "${SEEDS_ARGS[@]}" --sale "$SALE" --report)" || die "seedsync --report failed"
say "MySQL: $REP"
jnum() { sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p" <<<"$REP"; }
STOCK_LEFT="$(jnum stock_left)"
ORDERS="$(jnum orders)"
UNITS="$(jnum units)"
BUYERS="$(jnum distinct_users)"
[[ -n "$STOCK_LEFT" && -n "$ORDERS" && -n "$UNITS" && -n "$BUYERS" ]] || die "unreadable report: $REP"

# What flashgate bench printed (loadgen's Result.Write):
#   requests   4757 in 5.34s, 891 req/s, transport errors 0
#   status     202: 4757  409: 3
#   accepted   4757 order ids
#   latency    all  p50 205.18ms  p99 1.13s  p999 1.69s  max 2.27s
#              202  p50 205.18ms  p99 1.13s  p999 1.69s  max 2.27s
REQS="$(awk '$1 == "requests" { print $2; exit }' "$RAW")"
ELAPSED="$(awk '$1 == "requests" { sub(/s,$/, "", $4); print $4; exit }' "$RAW")"
RPS="$(awk '$1 == "requests" { print $5; exit }' "$RAW")"
TERRS="$(awk '$1 == "requests" { print $NF; exit }' "$RAW")"
S202="$(awk '$1 == "status" { for (i = 2; i < NF; i += 2) if ($i == "202:") { print $(i + 1); exit } }' "$RAW")"
S202="${S202:-0}"
ACCEPTED="$(awk '$1 == "accepted" { print $2; exit }' "$RAW")"
# ms LABEL WHICH: the WHICH (p50, p99) of the latency line whose first field is LABEL, in ms.
ms() {
	awk -v l="$1" -v q="$2" '
		$1 == l || ($1 == "latency" && $2 == l) {
			for (i = 1; i < NF; i++) if ($i == q) { v = $(i + 1); break }
			if (v ~ /µs$/) { sub(/µs$/, "", v); printf "%.3f", v / 1000 }
			else if (v ~ /ms$/) { sub(/ms$/, "", v); printf "%.3f", v }
			else if (v ~ /s$/) { sub(/s$/, "", v); printf "%.3f", v * 1000 }
			exit
		}' "$RAW"
}
P50="$(ms 202 p50)"
P99="$(ms 202 p99)"
[[ -n "$REQS" && -n "$ELAPSED" && -n "$RPS" && -n "$ACCEPTED" ]] || die "could not read flashgate bench's output" "$RAW"
((S202 > 0)) || die "no purchase succeeded (no 202)" "$RAW"
[[ -n "$P50" && -n "$P99" ]] || die "no latency of the 202s in flashgate bench's output" "$RAW"

# Cross-checks: MySQL against the 202s, and the stock ledger.
((ORDERS >= S202)) || die "MySQL holds $ORDERS orders but the seeds answered $S202 202s: accepted orders lost"
((ACCEPTED == S202)) || die "$S202 202s but $ACCEPTED distinct order ids read from them" "$RAW"
((STOCK_LEFT + UNITS == STOCK)) || die "stock ledger off: $STOCK_LEFT left + $UNITS sold != $STOCK"
((ORDERS == BUYERS)) || die "$ORDERS orders but $BUYERS distinct users: a user bought twice"
((STOCK_LEFT > 0)) || die "the sale sold out during the run: raise BENCH_SEEDSYNC_STOCK"
((ORDERS == S202)) || say "note: $ORDERS orders in MySQL, $S202 202s: $((ORDERS - S202)) committed orders whose answer the load tool did not get (transport errors $TERRS)"
((REQS == S202)) || say "note: $((REQS - S202)) of $REQS requests were not 202 (see $RAW)"

ORDERS_PER_S="$(awk -v o="$ORDERS" -v e="$ELAPSED" 'BEGIN { printf "%.1f", o / e }')"
say "seeds_sync: $ORDERS orders in ${ELAPSED}s = $ORDERS_PER_S orders/s ($RPS req/s, 202 p50 ${P50} ms, p99 ${P99} ms)"
printf '{"name":"seeds_sync","orders_per_s":%s,"req_per_s":%s,"requests":%s,"accepted":%s,"p50_ms":%s,"p99_ms":%s,"stock_left":%s,"orders_in_db":%s,"elapsed_s":%s,"users":%s,"concurrency":%s,"transport_errors":%s}\n' \
	"$ORDERS_PER_S" "$RPS" "$REQS" "$S202" "$P50" "$P99" "$STOCK_LEFT" "$ORDERS" "$ELAPSED" "$USERS" "$CONC" "$TERRS"
