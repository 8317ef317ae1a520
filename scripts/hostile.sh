#!/usr/bin/env bash
# The hostile-client suite (`make hostile`): bench/hostile plays slowloris, silent connections,
# slow bodies, pipelining, connection churn, request smuggling, oversized bodies, junk commands (a
# buyer's cancels of made-up order ids beside real payments, gateway port only) and fd
# exhaustion against the gateway's port (:8080) and nginx's (:8000) of the local stack, with a
# probe beside each attack, and prints one line per attack and port, then its targets:
#   target <name>: <figure> (goal <goal>) met|missed
# It writes bench/hostile-results.json and the make hostile section of BENCHMARKS.md. See
# docs/hostile.md.
#
# The stack: the infra is started if down (scripts/stack.sh infra-up) and left running; if the
# backend, gateway or nginx is not running, `scripts/stack.sh up` starts them and the ones it
# started are stopped again at the end (scripts/stack.sh apps-down). A stack that was running is
# left running. The sale the probes read is created for the run and closed afterwards.
#
# Environment: HOSTILE_DURATION (12s: each attack), HOSTILE_ARGS (more flags for bench/hostile,
# e.g. "--attacks smuggling,oversize --ports nginx"; `bin/hostile -h` lists them),
# HOSTILE_STRICT=1 (exit 1 when a target is missed), HOSTILE_SLOW_BODY_NET (fd66:6c61:7465:1::/64:
# the /64 the slow bodies through nginx come from), STACK_CONFIG (configs/flashgate.yaml), GO,
# STACK_PORT_OFFSET (the stack's ports: nginx 8000 + offset, the gateway 8080 + offset).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin:/usr/local/go/bin"
# shellcheck source=scripts/goruntime.sh
. "$ROOT/scripts/goruntime.sh"

DURATION="${HOSTILE_DURATION:-12s}"
CONFIG="${STACK_CONFIG:-configs/flashgate.yaml}"
GO="${GO:-go}"
BIN="$ROOT/bin/flashgate"
TOOL="$ROOT/bin/hostile"
STACK="$ROOT/scripts/stack.sh"
LOG="$ROOT/var/log"
OUT="$ROOT/var/hostile"
# The ports of this stack (scripts/stack.sh adds STACK_PORT_OFFSET to every port): the suite
# attacks this checkout's nginx and gateway, never another stack's.
OFFSET="${STACK_PORT_OFFSET:-0}"
[[ "$OFFSET" =~ ^[0-9]+$ ]] || { printf 'hostile: STACK_PORT_OFFSET must be a whole number, not %s\n' "$OFFSET" >&2; exit 1; }
NGINX_ADDR="127.0.0.1:$((8000 + OFFSET))"
GATEWAY_ADDR="127.0.0.1:$((8080 + OFFSET))"
# Dev mode, as the Makefile sets it for the local stack (docs/security.md). The secrets are the
# stack's (var/secrets.env, read once the stack is up) or the environment's.
export FLASHGATE_DEV="${FLASHGATE_DEV:-1}"

say() { printf 'hostile: %s\n' "$*" >&2; }
die() {
	printf 'hostile: ERROR: %s\n' "$1" >&2
	if [[ -n "${2:-}" && -f "$2" ]]; then
		printf -- '---- last 20 lines of %s ----\n' "$2" >&2
		tail -n 20 "$2" >&2 || true
	fi
	exit 1
}
status_of() { "$STACK" status 2>/dev/null | awk -v p="$1" '$1 == p { print $2 }'; }

[[ "$DURATION" =~ ^[1-9][0-9]*s$ ]] || die "HOSTILE_DURATION must be whole seconds such as 12s, not '$DURATION'"
mkdir -p "$LOG" "$OUT"

STARTED_APPS=()
SALE=""
ROUTE_ADDED=""
cleanup() {
	local rc=$?
	if [[ -n "$SALE" ]]; then
		"$BIN" sale close --config "$CONFIG" "$SALE" >>"$LOG/hostile.log" 2>&1 || true
	fi
	if [[ -n "$ROUTE_ADDED" ]]; then
		ip -6 route del local "$ROUTE_ADDED" dev lo 2>/dev/null || true
	fi
	if ((${#STARTED_APPS[@]})); then
		say "stopping what this run started: ${STARTED_APPS[*]}"
		"$STACK" apps-down "${STARTED_APPS[@]}" >>"$LOG/hostile-stack.log" 2>&1 ||
			say "scripts/stack.sh apps-down ${STARTED_APPS[*]} failed (see $LOG/hostile-stack.log)"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$GO" build -o "$BIN" ./cmd/flashgate || die "go build ./cmd/flashgate failed"
"$GO" build -o "$TOOL" ./bench/hostile || die "go build ./bench/hostile failed"

before=()
for p in nginx gateway backend; do
	[[ "$(status_of "$p")" == up ]] || before+=("$p")
done
if ((${#before[@]})); then
	say "not running: ${before[*]}: scripts/stack.sh up (they are stopped again at the end)"
	STARTED_APPS=("${before[@]}")
	"$STACK" up >>"$LOG/hostile-stack.log" 2>&1 || die "scripts/stack.sh up failed" "$LOG/hostile-stack.log"
else
	"$STACK" infra-up >>"$LOG/hostile-stack.log" 2>&1 || die "scripts/stack.sh infra-up failed" "$LOG/hostile-stack.log"
	say "the stack was running: left running"
fi
# The operator's credentials (docs/credentials.md): the CLI and the probes' tokens.
# shellcheck disable=SC1091 # written by scripts/stack.sh
. "$ROOT/var/secrets.env"

SALE="hostile-$(date +%s)"
# It opens 15 s after it is created (and warmed), as a real sale opens after its warm: the junk
# commands' made-up ids then all fall where the buyers' records decide (docs/hostile.md).
"$BIN" sale create --config "$CONFIG" --id "$SALE" --total 1000000 --per-user-limit 1 --price-cents 100 --starts-at +15s --duration 1h \
	>>"$LOG/hostile.log" 2>&1 || die "creating sale $SALE failed" "$LOG/hostile.log"
say "sale $SALE created; gateway pid $(cat var/run/gateway.pid 2>/dev/null || echo ?), open-file limit $(awk '/Max open files/ {print $4}' "/proc/$(cat var/run/gateway.pid 2>/dev/null || echo self)/limits" 2>/dev/null || echo ?)"

# The slow bodies through nginx come from 2,000 addresses of one IPv6 /64 (one host's block) to
# nginx's [::1] port: the /64 is routed to lo (a "local" route: every address of it is this
# host's, none configured), which takes root (CAP_NET_ADMIN). Without it they come from IPv4
# loopback addresses, as every other attack's.
SLOW_NET="${HOSTILE_SLOW_BODY_NET:-fd66:6c61:7465:1::/64}"
NGINX6=()
if grep -q "listen \[::1\]:$((8000 + OFFSET)) " var/nginx/nginx.conf 2>/dev/null; then
	if ip -6 route show table local | grep -q "^local ${SLOW_NET} "; then
		NGINX6=(--nginx6 "[::1]:$((8000 + OFFSET))" --slow-body-net "$SLOW_NET")
	elif ip -6 route add local "$SLOW_NET" dev lo 2>>"$LOG/hostile.log"; then
		ROUTE_ADDED="$SLOW_NET"
		NGINX6=(--nginx6 "[::1]:$((8000 + OFFSET))" --slow-body-net "$SLOW_NET")
	fi
fi
if ((${#NGINX6[@]})); then
	say "slow bodies through nginx: from $SLOW_NET to [::1]:$((8000 + OFFSET))"
else
	say "slow bodies through nginx: from IPv4 addresses (no IPv6 listener, or 'ip -6 route add local $SLOW_NET dev lo' refused: run as root)"
fi

NOTE="commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
[[ -z "$(git status --porcelain --untracked-files=no -- . ':!BENCHMARKS.md' ':!bench/hostile-results.json' 2>/dev/null)" ]] || NOTE+=" with local changes"
# shellcheck disable=SC2086 # HOSTILE_ARGS is a list of flags
"$TOOL" --config "$CONFIG" --sale "$SALE" --nginx "$NGINX_ADDR" --gateway "$GATEWAY_ADDR" --duration "$DURATION" --note "$NOTE" \
	"${NGINX6[@]}" ${HOSTILE_ARGS:-} | tee "$OUT/last.out"
rc=${PIPESTATUS[0]}
((rc == 0)) || exit "$rc"
if [[ "${HOSTILE_STRICT:-}" == 1 ]] && grep -q '^target .* missed$' "$OUT/last.out"; then
	exit 1
fi
