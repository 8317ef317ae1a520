#!/usr/bin/env bash
# flashgate Redis limit bench (flashgate issue 6, "Redis limit"; see bench/README.md).
#
# redis-benchmark runs the project's OWN admission script, lua/admit.lua, with EVALSHA on the
# project's Redis (the one the gateway uses, 127.0.0.1:16379), twice with the same clients and
# requests: without pipelining (-P 1) and pipelined (-P 16). That is the most admissions per
# second one Redis can decide here, the ceiling of the gateway's purchase rate.
#
# Each run gets a fresh bench-only sale (keys fg:{s:<sale>}:…, never in the sales index, so no
# gateway or backend looks at it), open, with stock that never runs out and a limit of one unit
# per user. Every call names a random user (u__rand_int__) and a random order id (1__rand_int__),
# so almost every call takes the whole admission path: meta, user's count, stock, the order-id
# check, DECRBY, HINCRBY and two HSETs. Afterwards the stock's decrease says how many calls were
# admitted (admitted_fraction: the rest met a repeated random user or order id). The sale's keys
# are deleted (UNLINK) after each run, and on any exit.
#
# The last line of stdout is one JSON object:
#   {"name":"redis_evalsha","rps_p1":…,"rps_p16":…,"clients":…,"requests":…,"admitted_fraction":…}
# Raw redis-benchmark outputs: var/bench/redis-p1.csv, var/bench/redis-p16.csv.
#
# Environment: BENCH_REDIS_CLIENTS (64), BENCH_REDIS_REQUESTS (200000, per run),
# BENCH_REDIS_THREADS (2: redis-benchmark --threads; 0 leaves the option out), BENCH_REDIS_PIPELINE
# (16: the pipelined run's -P), BENCH_REDIS_HOST (127.0.0.1), BENCH_REDIS_PORT (16379 + STACK_PORT_OFFSET),
# BENCH_REDIS_SCRIPT (lua/admit.lua: another version of it, to compare). The bench sale's meta is
# what warm writes for a sale without regions or extra limits (lmax empty).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin:/usr/local/go/bin"

CLIENTS="${BENCH_REDIS_CLIENTS:-64}"
REQUESTS="${BENCH_REDIS_REQUESTS:-200000}"
THREADS="${BENCH_REDIS_THREADS:-2}"
PIPE="${BENCH_REDIS_PIPELINE:-16}"
HOST="${BENCH_REDIS_HOST:-127.0.0.1}"
DEFAULT_PORT=$((16379 + ${STACK_PORT_OFFSET:-0}))
PORT="${BENCH_REDIS_PORT:-$DEFAULT_PORT}"
STACK="$ROOT/scripts/stack.sh"
SCRIPT="${BENCH_REDIS_SCRIPT:-$ROOT/lua/admit.lua}"
OUT="$ROOT/var/bench"
LOG="$ROOT/var/log"
# Random ints from redis-benchmark -r are random() % keyspace: at most 2^31 - 1 distinct values.
KEYSPACE=2000000000
# Units on sale: far more than any run can admit, and exact as a Lua number (< 2^53).
STOCK=1000000000000

say() { printf 'bench-redis: %s\n' "$*" >&2; }
die() {
	printf 'bench-redis: ERROR: %s\n' "$1" >&2
	if [[ -n "${2:-}" && -f "$2" ]]; then
		printf -- '---- last 20 lines of %s ----\n' "$2" >&2
		tail -n 20 "$2" >&2 || true
	fi
	exit 1
}
need() {
	local c
	for c in "$@"; do
		command -v "$c" >/dev/null 2>&1 || die "'$c' not found: run 'make deps' first (Debian package redis-tools)"
	done
}
# The stack's Redis wants a login: the operator's, from var/secrets.env (REDISCLI_AUTH is its
# password), when the environment gives none.
login() {
	if [[ -z "${FLASHGATE_REDIS_USERNAME:-}" && -f "$ROOT/var/secrets.env" ]]; then
		# shellcheck disable=SC1091 # written by scripts/stack.sh
		. "$ROOT/var/secrets.env"
	fi
	AUTH_ARGS=()
	if [[ -n "${FLASHGATE_REDIS_USERNAME:-}" ]]; then
		export REDISCLI_AUTH="${REDISCLI_AUTH:-${FLASHGATE_REDIS_PASSWORD:-}}"
		AUTH_ARGS=(--user "$FLASHGATE_REDIS_USERNAME" --no-auth-warning)
	fi
}
login
rcli() { redis-cli -h "$HOST" -p "$PORT" "${AUTH_ARGS[@]}" --no-raw "$@"; }
rraw() { redis-cli -h "$HOST" -p "$PORT" "${AUTH_ARGS[@]}" --raw "$@"; }
posint() { [[ "$1" =~ ^[1-9][0-9]*$ ]]; }

need redis-benchmark redis-cli awk
posint "$CLIENTS" && posint "$REQUESTS" && posint "$PIPE" ||
	die "BENCH_REDIS_CLIENTS, BENCH_REDIS_REQUESTS and BENCH_REDIS_PIPELINE must be positive whole numbers"
[[ "$THREADS" =~ ^[0-9]+$ ]] || die "BENCH_REDIS_THREADS must be a whole number"
[[ -f "$SCRIPT" ]] || die "$SCRIPT not found"
mkdir -p "$OUT" "$LOG"
rm -f "$OUT"/redis-p*.csv

if [[ "$(rraw ping 2>/dev/null)" != PONG ]]; then
	[[ "$HOST:$PORT" == "127.0.0.1:$DEFAULT_PORT" ]] || die "no Redis answers on $HOST:$PORT"
	say "no Redis on 127.0.0.1:$DEFAULT_PORT: scripts/stack.sh infra-up"
	"$STACK" infra-up >>"$LOG/bench-redis-stack.log" 2>&1 || die "scripts/stack.sh infra-up failed" "$LOG/bench-redis-stack.log"
	login
	[[ "$(rraw ping 2>/dev/null)" == PONG ]] || die "still no Redis on $HOST:$PORT"
fi
THREAD_ARGS=()
if ((THREADS > 0)); then
	redis-benchmark --help 2>&1 | grep -q -- '--threads' || die "this redis-benchmark has no --threads: set BENCH_REDIS_THREADS=0"
	THREAD_ARGS=(--threads "$THREADS")
fi

# ---------------------------------------------------------------------------------------------
# clean-up: the current bench sale's keys, whatever happened

SALE=""
keys_of() { # keys_of SALE → meta stock users resv orders idem (admit.lua's KEYS, in order)
	local p="fg:{s:$1}:"
	printf '%s\n' "${p}meta" "${p}stock" "${p}users" "${p}resv" "${p}orders" "${p}idem"
}
drop_sale() {
	[[ -n "$SALE" ]] || return 0
	local keys
	mapfile -t keys < <(keys_of "$SALE")
	rraw unlink "${keys[@]}" >/dev/null 2>&1 || printf 'bench-redis: could not delete the keys of %s\n' "$SALE" >&2
	SALE=""
}
cleanup() {
	local rc=$?
	drop_sale
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------------------------
# the script, as the gateway runs it

SHA="$(rraw script load "$(cat "$SCRIPT")")"
[[ "$SHA" =~ ^[0-9a-f]{40}$ ]] || die "SCRIPT LOAD of lua/admit.lua answered: $SHA"
say "lua/admit.lua loaded: $SHA"

# new_sale: a fresh open sale with STOCK units, 1 per user, 1 per order; sets SALE and KEYS.
NOW_MS=""
new_sale() {
	SALE="bench-redis-$(date +%Y%m%d%H%M%S)-$RANDOM$RANDOM"
	mapfile -t KEYS < <(keys_of "$SALE")
	NOW_MS="$(($(date +%s%3N)))"
	local starts=$((NOW_MS - 60000)) ends=$((NOW_MS + 86400000))
	[[ "$(rraw set "${KEYS[1]}" "$STOCK")" == OK ]] || die "SET ${KEYS[1]} failed"
	rraw hset "${KEYS[0]}" state open starts "$starts" ends "$ends" limit 1 omax 1 lmax "" \
		total "$STOCK" price 9900 title bench-redis regions "" >/dev/null || die "HSET ${KEYS[0]} failed"
}
stock_left() { rraw get "${KEYS[1]}"; }

# admit USER ORDER_ID: one admission with redis-cli, the same arguments as the benchmark's.
# ARGV: user, quantity, order id, now (ms), idempotency key, region, payment deadline (ms).
admit() {
	rraw evalsha "$SHA" 6 "${KEYS[@]}" "$1" 1 "$2" "$NOW_MS" "" "" "$((NOW_MS + 900000))" | paste -sd' ' -
}

# A check of the arguments before the load: a first purchase is admitted, the same user again
# is refused. Throws both away with their sale.
new_sale
first="$(admit check-user 7)"
[[ "$first" == "ok 7 $((STOCK - 1))" ]] || die "a first admission answered '$first', want 'ok 7 $((STOCK - 1))': do lua/admit.lua's KEYS/ARGV still match this script?"
again="$(admit check-user 8)"
[[ "$again" == "limit_reached 1" || "$again" == "limit_reached 1 "* ]] ||
	die "a second admission of the same user answered '$again', want 'limit_reached 1 …'"
say "admission check: '$first', then '$again'"
drop_sale

# ---------------------------------------------------------------------------------------------
# the runs

# run P: one redis-benchmark run with pipeline P on a fresh sale; sets RPS and ADMITTED.
RPS=""
ADMITTED=""
run() {
	local p="$1" out="$OUT/redis-p$1.csv" before after p50 p99
	new_sale
	before="$(stock_left)"
	local bauth=()
	[[ -n "${FLASHGATE_REDIS_USERNAME:-}" ]] && bauth=(--user "$FLASHGATE_REDIS_USERNAME" -a "$REDISCLI_AUTH")
	redis-benchmark -h "$HOST" -p "$PORT" "${bauth[@]}" -c "$CLIENTS" -n "$REQUESTS" -P "$p" "${THREAD_ARGS[@]}" \
		-r "$KEYSPACE" --csv \
		EVALSHA "$SHA" 6 "${KEYS[@]}" u__rand_int__ 1 1__rand_int__ "$NOW_MS" "" "" "$((NOW_MS + 900000))" \
		>"$out" 2>&1 || die "redis-benchmark -P $p failed" "$out"
	grep -q '^"EVALSHA' "$out" || die "redis-benchmark -P $p printed no EVALSHA result" "$out"
	after="$(stock_left)"
	ADMITTED=$((before - after))
	drop_sale
	# "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
	RPS="$(awk -F'","' '/^"EVALSHA/ { printf "%.2f", $2; exit }' "$out")"
	p50="$(awk -F'","' '/^"EVALSHA/ { print $5 + 0; exit }' "$out")"
	p99="$(awk -F'","' '/^"EVALSHA/ { print $7 + 0; exit }' "$out")"
	printf 'redis: EVALSHA lua/admit.lua -P %-3s %12s calls/s  (clients %d, requests %d, p50 %s ms, p99 %s ms, admitted %d)\n' \
		"$p" "$RPS" "$CLIENTS" "$REQUESTS" "$p50" "$p99" "$ADMITTED" >&2
}

say "redis-benchmark -c $CLIENTS -n $REQUESTS ${THREAD_ARGS[*]} -r $KEYSPACE on $HOST:$PORT, $(nproc) cores"
run 1
RPS1="$RPS" ADM1="$ADMITTED"
run "$PIPE"
RPS16="$RPS" ADM16="$ADMITTED"
FRACTION="$(awk -v a="$((ADM1 + ADM16))" -v n="$((2 * REQUESTS))" 'BEGIN { printf "%.4f", a / n }')"
awk -v f="$FRACTION" 'BEGIN { exit !(f >= 0.99) }' ||
	die "only $FRACTION of the calls were admitted: the runs did not measure the full admission path"
say "admitted: $ADM1 + $ADM16 of $((2 * REQUESTS)) calls ($FRACTION); the bench sales' keys are deleted"
printf '{"name":"redis_evalsha","rps_p1":%s,"rps_p16":%s,"pipeline":%d,"clients":%d,"requests":%d,"threads":%d,"admitted_fraction":%s}\n' \
	"$RPS1" "$RPS16" "$PIPE" "$CLIENTS" "$REQUESTS" "$THREADS" "$FRACTION"
