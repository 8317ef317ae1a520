#!/usr/bin/env bash
# Where a purchase's tail comes from (flashgate issue 13; BENCHMARKS.md, "The tail's floor").
#
#   scripts/bench-tail.sh [RATE...]      default: 1000 2000 4000
#
# At each paced RATE, one after the other with the same load tool (`bin/flashgate bench --rate`,
# BENCH_TAIL_DURATION each, 256 in flight), three answers:
#   nginx       nginx/bench.conf's fixed 409: the machine's floor (the yardstick of make bench)
#   refusal     the gateway's sold-out 409 from memory: the same HTTP round trip through a Go
#               server, no Redis, no NATS
#   purchase    the gateway's 202: an admission in Redis and a JetStream publish acked from storage
# and for each: p50, p99, the load tool's send-lag p99 and how busy the machine's two cores were
# (/proc/stat, all processes). The purchase minus the refusal is what the two hops cost; the
# refusal minus nginx is what a Go HTTP server costs; the busy column says whether the tail is a
# queue for the cores.
#
# Needs the stack (scripts/stack.sh up: infra and backend). Environment: BENCH_TAIL_DURATION (10s),
# BENCH_USERS (200000), STACK_PORT_OFFSET, STACK_CONFIG (configs/flashgate.yaml).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin:/usr/local/go/bin"
# shellcheck source=scripts/goruntime.sh
. "$ROOT/scripts/goruntime.sh"
DURATION="${BENCH_TAIL_DURATION:-10s}"
USERS="${BENCH_USERS:-200000}"
OFFSET="${STACK_PORT_OFFSET:-0}"
GW_PORT=$((18080 + OFFSET))
GW_ADMIN=$((18081 + OFFSET))
NGINX_PORT=$((18090 + OFFSET))
CONFIG="${STACK_CONFIG:-configs/flashgate.yaml}"
OUT="$ROOT/var/bench/tail"
RATES=("$@")
((${#RATES[@]})) || RATES=(1000 2000 4000)
mkdir -p "$OUT/nginx/log" "$OUT/nginx/tmp"
# shellcheck disable=SC1091 # written by scripts/stack.sh
. "$ROOT/var/secrets.env"
export FLASHGATE_DEV="${FLASHGATE_DEV:-1}"

up() { [[ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$1")" == "$2" ]]; }
wait_up() { # wait_up URL CODE
	local i
	for ((i = 0; i < 100; i++)); do up "$1" "$2" && return 0; sleep 0.1; done
	echo "bench-tail: $1 did not answer $2" >&2
	return 1
}
busy() { awk '/^cpu /{print $2+$3+$4+$7+$8, $5+$6}' /proc/stat; } # "busy idle" ticks, all cores

gw=""
cleanup() {
	[[ -n "$gw" ]] && kill -TERM "$gw" 2>/dev/null && wait "$gw" 2>/dev/null
	[[ -f "$OUT/nginx.pid" ]] && kill -QUIT "$(cat "$OUT/nginx.pid")" 2>/dev/null
	rm -f "$OUT/nginx.pid"
}
trap cleanup EXIT

# shellcheck disable=SC2016 # literal ${...}: the names envsubst substitutes
BENCH_LISTEN="127.0.0.1:$NGINX_PORT" BENCH_LOG_DIR="$OUT/nginx/log" BENCH_PID="$OUT/nginx.pid" \
	envsubst '${BENCH_LISTEN} ${BENCH_LOG_DIR} ${BENCH_PID}' <nginx/bench.conf >"$OUT/nginx/nginx.conf"
g=""
[[ "$(id -u)" == 0 ]] && g="user root root;"
nginx -p "$OUT/nginx/" -c "$OUT/nginx/nginx.conf" -e "$OUT/nginx/log/error.log" ${g:+-g "$g"}
(
	export FLASHGATE_GATEWAY_LISTEN="127.0.0.1:$GW_PORT" FLASHGATE_GATEWAY_ADMIN_LISTEN="127.0.0.1:$GW_ADMIN"
	export FLASHGATE_RATELIMIT_PER_IP_RATE=0 FLASHGATE_RATELIMIT_PER_USER_RATE=0 FLASHGATE_RATELIMIT_PER_SALE_RATE=0
	exec setsid bin/flashgate gateway --config "$CONFIG" --log-level warn
) </dev/null >"$OUT/gateway.log" 2>&1 &
gw=$!
wait_up "http://127.0.0.1:$GW_ADMIN/readyz" 200
wait_up "http://127.0.0.1:$NGINX_PORT/" 409

stamp="$(date +%H%M%S)"
soldout="tail-soldout-$stamp"
buy="tail-buy-$stamp"
bin/flashgate sale create --config "$CONFIG" --id "$soldout" --total 1 --per-user-limit 1 >/dev/null
bin/flashgate sale create --config "$CONFIG" --id "$buy" --total 100000000 --per-user-limit 1 >/dev/null
sleep 1
load() { # load SALE TARGET RATE JSON [ARGS...]
	local sale="$1" target="$2" rate="$3" json="$4"
	shift 4
	bin/flashgate bench --config "$CONFIG" --no-check --sale "$sale" --target "$target" --users "$USERS" \
		--concurrency 256 --duration "$DURATION" --rate "$rate" --json "$json" "$@" >/dev/null 2>&1
}
# the sold-out sale's one unit goes first, so that every later answer is the 409
load "$soldout" "http://127.0.0.1:$GW_PORT" 100 "$OUT/warm.json" --duration 1s || true

printf '%8s  %-9s %10s %10s %12s %6s  %s\n' rate answer p50_ms p99_ms lag_p99_ms busy "p99 ÷ nginx p99"
for rate in "${RATES[@]}"; do
	np99=""
	for kind in nginx refusal purchase; do
		case "$kind" in
		nginx) args=(bench-nginx-fixed "http://127.0.0.1:$NGINX_PORT") ;;
		refusal) args=("$soldout" "http://127.0.0.1:$GW_PORT") ;;
		purchase) args=("$buy" "http://127.0.0.1:$GW_PORT") ;;
		esac
		b0="$(busy)"
		load "${args[@]}" "$rate" "$OUT/$kind-$rate.json" || true
		b1="$(busy)"
		read -r p50 p99 lag < <(tr -d ' \n' <"$OUT/$kind-$rate.json" | awk '{
			match($0, /"latency_us":\{[^}]*\}/); l = substr($0, RSTART, RLENGTH)
			match($0, /"send_lag_us":\{[^}]*\}/); s = substr($0, RSTART, RLENGTH)
			match(l, /"p50":[0-9]+/); p50 = substr(l, RSTART + 6, RLENGTH - 6)
			match(l, /"p99":[0-9]+/); p99 = substr(l, RSTART + 6, RLENGTH - 6)
			match(s, /"p99":[0-9]+/); lag = substr(s, RSTART + 6, RLENGTH - 6)
			print p50, p99, (lag == "" ? 0 : lag)
		}')
		[[ "$kind" == nginx ]] && np99="$p99"
		awk -v r="$rate" -v k="$kind" -v a="$p50" -v b="$p99" -v c="$lag" -v n="$np99" -v b0="$b0" -v b1="$b1" 'BEGIN {
			split(b0, x, " "); split(b1, y, " "); u = y[1] - x[1]; i = y[2] - x[2]
			printf "%8s  %-9s %10.2f %10.2f %12.2f %5.0f%%  %.1f\n", r, k, a / 1000, b / 1000, c / 1000, 100 * u / (u + i), b / n
		}'
	done
done
bin/flashgate sale close --config "$CONFIG" "$soldout" >/dev/null 2>&1 || true
bin/flashgate sale close --config "$CONFIG" "$buy" >/dev/null 2>&1 || true
