#!/usr/bin/env bash
# flashgate edge bench (`make bench-edge`; flashgate issue 3, "Measured").
#
# In one run, on one machine, with the same wrk threads, connections, duration, request (POST,
# same headers and body: scripts/wrk-purchase.lua):
#   nginx-static     nginx (nginx/bench.conf) answering a fixed JSON 409 sold_out from memory:
#                    the fastest a sold-out answer can be here;
#   gateway-soldout  a gateway (bin/flashgate) answering POST /v1/sales/<sale>/orders for a sale
#                    that is sold out;
# and prints both rates and, last, "edge: gateway-soldout/nginx-static = R". Target: R >= 0.9.
#
# It needs the infra (started if down: scripts/stack.sh infra-up) and a backend to create the
# sale (if none runs, `scripts/stack.sh up` starts backend, gateway and nginx, and they are
# stopped again at the end with `scripts/stack.sh apps-down`; whatever was running before is left
# as it was). The bench gateway and the bench nginx run on their own ports and are always stopped.
# Raw wrk outputs: var/bench/edge-*.txt. On a shared 2-core machine one pair of runs can differ by
# 30% from the next: hence the rounds.
#
# Environment: BENCH_THREADS (2), BENCH_CONNS (64), BENCH_DURATION (10s, each run), BENCH_ROUNDS
# (2: runs per target, in alternating order A B B A …; the rates are the means), BENCH_WARMUP (3s:
# a first run against each target that counts every answer by status, not measured; 0 skips it),
# BENCH_NGINX_PORT (18090), BENCH_GATEWAY_PORT (18080), BENCH_GATEWAY_ADMIN_PORT (18081, and up:
# one per gateway process), BENCH_GATEWAYS (1: gateway processes sharing the port with
# SO_REUSEPORT, GOMAXPROCS = cores / processes each; on 2 cores two measured no better than one),
# BENCH_STRICT=1 (exit 1 when R < 0.9), STACK_CONFIG (configs/flashgate.yaml).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin:/usr/local/go/bin"
# shellcheck source=scripts/goruntime.sh
. "$ROOT/scripts/goruntime.sh"

THREADS="${BENCH_THREADS:-2}"
CONNS="${BENCH_CONNS:-64}"
DURATION="${BENCH_DURATION:-10s}"
WARMUP="${BENCH_WARMUP:-3s}"
ROUNDS="${BENCH_ROUNDS:-2}"
NGINX_PORT="${BENCH_NGINX_PORT:-18090}"
GW_PORT="${BENCH_GATEWAY_PORT:-18080}"
GW_ADMIN="${BENCH_GATEWAY_ADMIN_PORT:-18081}"
CORES="$(nproc)"
GATEWAYS="${BENCH_GATEWAYS:-1}"
[[ "$GATEWAYS" =~ ^[1-9][0-9]*$ ]] || { echo "bench-edge: BENCH_GATEWAYS must be a positive number" >&2; exit 2; }
GW_PROCS=$(( CORES / GATEWAYS > 0 ? CORES / GATEWAYS : 1 ))
CONFIG="${STACK_CONFIG:-configs/flashgate.yaml}"
BIN="$ROOT/bin/flashgate"
STACK="$ROOT/scripts/stack.sh"
WRK_SCRIPT="$ROOT/scripts/wrk-purchase.lua"
OUT="$ROOT/var/bench"
LOG="$ROOT/var/log"
RUN="$ROOT/var/run"
NGINX_PREFIX="$OUT/nginx"
NGINX_PID="$RUN/bench-nginx.pid"
# The secrets are the stack's (var/secrets.env, read after infra-up below), or the environment's.
# Dev mode, as the Makefile sets it for the local stack (docs/security.md).
export FLASHGATE_DEV="${FLASHGATE_DEV:-1}"

say() { printf 'bench-edge: %s\n' "$*"; }
die() {
	printf 'bench-edge: ERROR: %s\n' "$1" >&2
	if [[ -n "${2:-}" && -f "$2" ]]; then
		printf -- '---- last 20 lines of %s ----\n' "$2" >&2
		tail -n 20 "$2" >&2 || true
	fi
	exit 1
}
need() {
	local c
	for c in "$@"; do
		command -v "$c" >/dev/null 2>&1 || die "'$c' not found: run 'make deps' first"
	done
}
tcp_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_for() {
	local secs="$1" i
	shift
	for ((i = 0; i < secs * 10; i++)); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	return 1
}
status_of() { "$STACK" status 2>/dev/null | awk -v p="$1" '$1 == p { print $2 }'; }

need wrk nginx envsubst curl awk
[[ -x "$BIN" ]] || die "$BIN not found: run 'make build' first"
[[ "$CONNS" =~ ^[1-9][0-9]*$ && "$THREADS" =~ ^[1-9][0-9]*$ && "$ROUNDS" =~ ^[1-9][0-9]*$ ]] ||
	die "BENCH_CONNS, BENCH_THREADS and BENCH_ROUNDS must be positive whole numbers"
((CONNS >= THREADS)) || die "BENCH_CONNS ($CONNS) must be at least BENCH_THREADS ($THREADS)"
for p in "$NGINX_PORT" "$GW_PORT" $(seq "$GW_ADMIN" $((GW_ADMIN + GATEWAYS - 1))); do
	tcp_open "$p" && die "127.0.0.1:$p is taken (BENCH_NGINX_PORT / BENCH_GATEWAY_PORT / BENCH_GATEWAY_ADMIN_PORT choose others)"
done
mkdir -p "$OUT" "$LOG" "$RUN" "$NGINX_PREFIX/tmp"
rm -f "$OUT"/edge-*.txt

# ---------------------------------------------------------------------------------------------
# clean-up: always the bench gateway and nginx; the stack's apps only if this run started them.

GW_PIDS=()
STARTED_APPS=()
cleanup() {
	local rc=$? i pid
	for pid in "${GW_PIDS[@]}"; do
		kill -0 "$pid" 2>/dev/null && kill -TERM "$pid" 2>/dev/null || true
	done
	for pid in "${GW_PIDS[@]}"; do
		for ((i = 0; i < 150; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
	done
	if [[ -f "$NGINX_PID" ]]; then
		local np
		np="$(tr -dc '0-9' <"$NGINX_PID")"
		if [[ -n "$np" ]] && tr '\0' ' ' <"/proc/$np/cmdline" 2>/dev/null | grep -q "$NGINX_PREFIX"; then
			kill -QUIT "$np" 2>/dev/null || true
			for ((i = 0; i < 100; i++)); do kill -0 "$np" 2>/dev/null || break; sleep 0.1; done
			if kill -0 "$np" 2>/dev/null; then kill -KILL "$np" 2>/dev/null || true; fi
		fi
		rm -f "$NGINX_PID"
	fi
	if ((${#STARTED_APPS[@]})); then
		say "stopping what this run started: ${STARTED_APPS[*]}"
		"$STACK" apps-down "${STARTED_APPS[@]}" >>"$LOG/bench-edge-stack.log" 2>&1 ||
			printf 'bench-edge: scripts/stack.sh apps-down %s failed (see %s)\n' "${STARTED_APPS[*]}" "$LOG/bench-edge-stack.log" >&2
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------------------------
# the stack: infra, and a backend to create the sale

"$STACK" infra-up >>"$LOG/bench-edge-stack.log" 2>&1 || die "scripts/stack.sh infra-up failed" "$LOG/bench-edge-stack.log"
# The operator's credentials (docs/credentials.md): the CLI and the bench's own processes log in.
# shellcheck disable=SC1091 # written by scripts/stack.sh
. "$ROOT/var/secrets.env"
if [[ "$(status_of backend)" != up ]]; then
	before=()
	for p in nginx gateway backend; do
		[[ "$(status_of "$p")" == up ]] || before+=("$p")
	done
	say "no backend running: scripts/stack.sh up (will stop ${before[*]} again at the end)"
	STARTED_APPS=("${before[@]}")
	"$STACK" up >>"$LOG/bench-edge-stack.log" 2>&1 || die "scripts/stack.sh up failed" "$LOG/bench-edge-stack.log"
fi

# ---------------------------------------------------------------------------------------------
# a sold-out sale: 1 unit, bought once; the bench gateway learns it from Redis at start

SALE="bench-edge-$(date +%Y%m%d%H%M%S)-$RANDOM"
"$BIN" sale create --config "$CONFIG" --id "$SALE" --title "bench-edge" --total 1 \
	--per-user-limit 1 --per-order-max 1 --starts-at now --duration 1h >"$OUT/edge-sale.json" ||
	die "flashgate sale create failed (is the backend running with the same FLASHGATE_ADMIN_TOKEN?)"
say "sale $SALE created (1 unit)"

say "starting $GATEWAYS bench gateway process(es) on 127.0.0.1:$GW_PORT (SO_REUSEPORT, GOMAXPROCS=$GW_PROCS each, admin from $GW_ADMIN), rate limits off"
printf '\n==== bench-edge gateway %s ====\n' "$(date -Is)" >>"$LOG/bench-gateway.log"
for ((g = 0; g < GATEWAYS; g++)); do
	(
		export FLASHGATE_GATEWAY_LISTEN="127.0.0.1:$GW_PORT" FLASHGATE_GATEWAY_ADMIN_LISTEN="127.0.0.1:$((GW_ADMIN + g))"
		export FLASHGATE_GATEWAY_REUSEPORT=true GOMAXPROCS="$GW_PROCS"
		export FLASHGATE_RATELIMIT_PER_IP_RATE=0 FLASHGATE_RATELIMIT_PER_USER_RATE=0 FLASHGATE_RATELIMIT_PER_SALE_RATE=0
		exec setsid "$BIN" gateway --config "$CONFIG" --log-level warn </dev/null >>"$LOG/bench-gateway.log" 2>&1
	) &
	GW_PIDS+=($!)
done
gw_ready() {
	local g
	for ((g = 0; g < GATEWAYS; g++)); do
		[[ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "http://127.0.0.1:$((GW_ADMIN + g))/readyz")" == 200 ]] || return 1
	done
}
wait_for 30 gw_ready || die "bench gateways not ready on 127.0.0.1:$GW_ADMIN.. within 30s" "$LOG/bench-gateway.log"

URL_PATH="/v1/sales/$SALE/orders"
buy() { # buy TOKEN → "status body"
	curl -s --max-time 5 -o /dev/stdout -w ' %{http_code}' -X POST "http://127.0.0.1:$GW_PORT$URL_PATH" \
		-H "Authorization: Bearer $1" -H 'Content-Type: application/json' -d '{"quantity":1}'
}
FIRST_TOKEN="$("$BIN" token --config "$CONFIG" --user bench-edge-first)"
WRK_TOKEN="$("$BIN" token --config "$CONFIG" --user bench-edge-wrk --ttl 2h)"
export WRK_TOKEN
first="$(buy "$FIRST_TOKEN")"
[[ "$first" == *' 202' ]] || die "buying the only unit answered: $first" "$LOG/bench-gateway.log"
say "the only unit bought: ${first% *}"
second="$(buy "$WRK_TOKEN")"
[[ "$second" == *' 409' ]] || die "the next purchase answered: $second (want 409 sold_out)" "$LOG/bench-gateway.log"
say "sold out: ${second% *}"

# ---------------------------------------------------------------------------------------------
# the yardstick: nginx with a fixed 409

# shellcheck disable=SC2016 # literal ${...}: the names envsubst may substitute
BENCH_LISTEN="127.0.0.1:$NGINX_PORT" BENCH_LOG_DIR="$LOG" BENCH_PID="$NGINX_PID" \
	envsubst '${BENCH_LISTEN} ${BENCH_LOG_DIR} ${BENCH_PID}' <"$ROOT/nginx/bench.conf" >"$NGINX_PREFIX/nginx.conf"
hard="$(ulimit -Hn)"
[[ "$hard" == unlimited ]] && hard=65535
((hard > 65535)) && hard=65535
g="worker_rlimit_nofile $hard;"
[[ "$(id -u)" == 0 ]] && g+=" user root root;"
nginx_args=(-p "$NGINX_PREFIX/" -c "$NGINX_PREFIX/nginx.conf" -e "$LOG/nginx-bench-error.log" -g "$g")
nginx "${nginx_args[@]}" -t -q 2>>"$LOG/nginx-bench-error.log" || die "nginx -t failed on nginx/bench.conf" "$LOG/nginx-bench-error.log"
nginx "${nginx_args[@]}" || die "bench nginx failed to start" "$LOG/nginx-bench-error.log"
wait_for 10 tcp_open "$NGINX_PORT" || die "bench nginx not listening on 127.0.0.1:$NGINX_PORT" "$LOG/nginx-bench-error.log"
static="$(curl -s --max-time 5 -o /dev/stdout -w ' %{http_code}' -X POST "http://127.0.0.1:$NGINX_PORT$URL_PATH" \
	-H "Authorization: Bearer $WRK_TOKEN" -d '{"quantity":1}')"
[[ "$static" == *' 409' ]] || die "bench nginx answered: $static"
say "bench nginx on 127.0.0.1:$NGINX_PORT answers: ${static% *}"

# ---------------------------------------------------------------------------------------------
# wrk: same threads, connections, duration and request against both

# field FILE REGEX: the first number after REGEX in a wrk output (0 if the line is absent).
field() { awk -v re="$2" '$0 ~ re { sub(".*" re "[[:space:]]*", ""); print $1 + 0; f = 1; exit } END { if (!f) print 0 }' "$1"; }

# warmup NAME URL: a first run counting every answer by status (a Lua call per answer, so it is
# not measured); anything but 409s stops the bench.
warmup() {
	local name="$1" url="$2" warm="$OUT/edge-$1-warmup.txt" st
	WRK_COUNT_STATUS=1 wrk -t"$THREADS" -c"$CONNS" -d"$WARMUP" -s "$WRK_SCRIPT" "$url" >"$warm" 2>&1 ||
		die "wrk warm-up against $name failed" "$warm"
	st="$(sed -n 's/^statuses: //p' "$warm")"
	[[ "$st" =~ ^409=[0-9]+$ ]] || die "$name answered other than 409 during the warm-up: ${st:-nothing}" "$warm"
	say "$name warm-up ($WARMUP): every answer a 409 ($st)"
}

# measure NAME URL ROUND: one measured run; adds its req/s to SUM_<NAME>.
declare -A SUM=()
measure() {
	local name="$1" url="$2" round="$3" out="$OUT/edge-$1.txt" reqs non2xx rps errs
	((ROUNDS == 1)) || out="$OUT/edge-$1-$round.txt"
	wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" -s "$WRK_SCRIPT" "$url" >"$out" 2>&1 || die "wrk against $name failed" "$out"
	reqs="$(awk '/requests in/ { print $1; exit }' "$out")"
	non2xx="$(field "$out" "Non-2xx or 3xx responses:")"
	rps="$(field "$out" "Requests/sec:")"
	errs="$(awk '/Socket errors:/ { gsub(/[^0-9 ]/, ""); s = 0; for (i = 1; i <= NF; i++) s += $i; print s; exit } END { if (!NR) print 0 }' "$out")"
	[[ -n "$reqs" && "$reqs" -gt 0 ]] || die "no requests completed against $name" "$out"
	printf 'edge: %-16s %12.2f req/s  (round %d: %s requests in %s, non-2xx %s, socket errors %s)\n' \
		"$name" "$rps" "$round" "$reqs" "$DURATION" "$non2xx" "${errs:-0}"
	((non2xx == reqs)) || die "$name: $non2xx of $reqs answers were non-2xx; want all (409)" "$out"
	SUM[$name]="$(awk -v a="${SUM[$name]:-0}" -v b="$rps" 'BEGIN { printf "%.2f", a + b }')"
}

NGINX_URL="http://127.0.0.1:$NGINX_PORT$URL_PATH"
GW_URL="http://127.0.0.1:$GW_PORT$URL_PATH"
say "wrk -t$THREADS -c$CONNS -d$DURATION, POST $URL_PATH (scripts/wrk-purchase.lua), $ROUNDS round(s), $(nproc) cores"
if [[ "$WARMUP" != 0 ]]; then
	warmup nginx-static "$NGINX_URL"
	warmup gateway-soldout "$GW_URL"
fi
# Rounds alternate the order (A B, B A, A B, …) so that a drift in what else the machine does
# weighs on both sides alike.
for ((round = 1; round <= ROUNDS; round++)); do
	if ((round % 2)); then
		measure nginx-static "$NGINX_URL" "$round"
		measure gateway-soldout "$GW_URL" "$round"
	else
		measure gateway-soldout "$GW_URL" "$round"
		measure nginx-static "$NGINX_URL" "$round"
	fi
done

RPS_N="$(awk -v s="${SUM[nginx-static]}" -v n="$ROUNDS" 'BEGIN { printf "%.2f", s / n }')"
RPS_G="$(awk -v s="${SUM[gateway-soldout]}" -v n="$ROUNDS" 'BEGIN { printf "%.2f", s / n }')"
R="$(awk -v g="$RPS_G" -v n="$RPS_N" 'BEGIN { printf "%.2f", g / n }')"
met="$(awk -v r="$R" 'BEGIN { print (r >= 0.9) ? "met" : "NOT met" }')"
say "target R >= 0.90: $met; raw wrk outputs in var/bench/edge-*.txt"
((ROUNDS == 1)) || say "means over $ROUNDS rounds: nginx-static $RPS_N req/s, gateway-soldout $RPS_G req/s"
printf 'edge: gateway-soldout/nginx-static = %s (gateway-soldout %s req/s / nginx-static %s req/s)\n' "$R" "$RPS_G" "$RPS_N"
if [[ "${BENCH_STRICT:-}" == 1 && "$met" != met ]]; then
	exit 1
fi
