#!/usr/bin/env bash
# flashgate against its yardsticks, side by side, in one run (`make bench`; flashgate issue 6).
#
# One after the other, never two at once, on this machine:
#   seeds_sync      scripts/bench-seedsync.sh: the seeds' synchronous design (bench/seedsync),
#                   driven by the project's load tool (orders/s)
#   redis_evalsha   scripts/bench-redis.sh: redis-benchmark running lua/admit.lua with EVALSHA on
#                   the gateway's Redis, unpipelined and -P 16 (calls/s)
#   then a bench gateway of its own (rate limits off), with the stack's backend behind it:
#   purchases       `flashgate bench --create` on a sale that cannot sell out: accepted/s, then
#                   the bench's invariant audit
#   sellout         a 1,000-unit sale sold out by the same tool (audited)
#   nginx_fixed     nginx (nginx/bench.conf, its own port) answering a fixed JSON 409 to every
#                   request, driven by `bin/flashgate bench --no-check` (the HTTP limit), right
#                   before the refusals it is compared with
#   refusals        the sold-out sale, `flashgate bench --no-check`: 409s/s from the sold-out
#                   mark; then refusals_audit: the sale audited again (nothing oversold)
#   p99_half_peak   `flashgate bench --create --rate <half the purchases rate>`: the 202s' p99
#                   (HDR histogram, from each request's due time) and the send lag, audited
#   backend_ingest  `flashgate-bench-ingest` (bench/ingest): a backend writing a pre-filled stream
#                   (orders/s), audited
#   rss_10k         `flashgate-bench-conns` (bench/conns): the bench gateway's RSS holding 10,000 idle
#                   connections, after all of the above
# Every HTTP load uses the same load tool, users, concurrency and duration. bench/report then
# writes bench/results.json and the generated section of BENCHMARKS.md, and prints one line per
# target, last: `target <name>: <figure> (goal <goal>) met|missed`.
#
# Raw outputs: var/bench/<part>.{json,out,err,cmd,rc}; profiles: var/bench/profiles/*.pprof and
# their `go tool pprof -top` in bench/profiles/*.txt. Exit status: non-zero when a part failed or
# an audit found a broken invariant (after the report is written); a missed target alone is not a
# failure unless BENCH_STRICT=1.
#
# It needs the infra (started if down: scripts/stack.sh infra-up, and left running, as the other
# bench scripts do) and a backend (if none runs, `scripts/stack.sh up` starts the apps, and the
# ones it started are stopped again at the end). The bench gateway and nginx are its own, on their
# own ports, and always stopped.
#
# Environment: BENCH_DURATION (10s: each HTTP load; whole seconds or minutes), BENCH_CONCURRENCY
# (256), BENCH_USERS (200000: distinct users, one token each; the purchase runs need one per
# request, so keep it above the purchases' requests), BENCH_INGEST_ORDERS (50000), BENCH_CONNS
# (10000), BENCH_PROFILE (1: CPU and allocation profiles of the bench gateway during purchases and
# of the ingesting backend; 0: none), BENCH_SELLOUT_TOTAL (1000), BENCH_PURCHASE_TOTAL (10000000),
# BENCH_NGINX_PORT (18090), BENCH_GATEWAY_PORT (18080), BENCH_GATEWAY_ADMIN_PORT (18081),
# BENCH_SEEDSYNC_PORT (18095), BENCH_EDGE_PORT (18091: nginx/nginx.conf in front of the bench gateway)
# (each of these five plus STACK_PORT_OFFSET, which shifts the stack's ports too), BENCH_STRICT=1 (exit 1 when a target is missed), BENCH_RESULTS
# (bench/results.json), BENCH_MARKDOWN (BENCHMARKS.md), STACK_CONFIG (configs/flashgate.yaml),
# GO (go). The parts' own scripts read their own variables too (bench/README.md).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin:/usr/local/go/bin"
# shellcheck source=scripts/goruntime.sh
. "$ROOT/scripts/goruntime.sh"

DURATION="${BENCH_DURATION:-10s}"
CONC="${BENCH_CONCURRENCY:-256}"
USERS="${BENCH_USERS:-200000}"
INGEST_ORDERS="${BENCH_INGEST_ORDERS:-50000}"
CONNS="${BENCH_CONNS:-10000}"
PROFILE="${BENCH_PROFILE:-1}"
SELLOUT_TOTAL="${BENCH_SELLOUT_TOTAL:-1000}"
PURCHASE_TOTAL="${BENCH_PURCHASE_TOTAL:-10000000}"
# STACK_PORT_OFFSET, as scripts/stack.sh reads it: the stack's ports and the bench's own defaults
# below are shifted by it, so a bench can run beside another stack.
OFFSET="${STACK_PORT_OFFSET:-0}"
[[ "$OFFSET" =~ ^[0-9]+$ ]] && ((OFFSET <= 40000)) || {
	printf 'bench: STACK_PORT_OFFSET must be a whole number 0..40000, not %s\n' "$OFFSET" >&2
	exit 1
}
export STACK_PORT_OFFSET="$OFFSET"
NGINX_PORT="${BENCH_NGINX_PORT:-$((18090 + OFFSET))}"
GW_PORT="${BENCH_GATEWAY_PORT:-$((18080 + OFFSET))}"
GW_ADMIN="${BENCH_GATEWAY_ADMIN_PORT:-$((18081 + OFFSET))}"
SEEDS_PORT="${BENCH_SEEDSYNC_PORT:-$((18095 + OFFSET))}"
EDGE_PORT="${BENCH_EDGE_PORT:-$((18091 + OFFSET))}"
RESULTS="${BENCH_RESULTS:-bench/results.json}"
MARKDOWN="${BENCH_MARKDOWN:-BENCHMARKS.md}"
CONFIG="${STACK_CONFIG:-configs/flashgate.yaml}"
GO="${GO:-go}"
BIN="$ROOT/bin/flashgate"
REPORT="$ROOT/bin/bench-report"
INGEST_BIN="$ROOT/bin/flashgate-bench-ingest"
CONNS_BIN="$ROOT/bin/flashgate-bench-conns"
STACK="$ROOT/scripts/stack.sh"
OUT="$ROOT/var/bench"
PROF="$OUT/profiles"
PROF_TXT="$ROOT/bench/profiles"
LOG="$ROOT/var/log"
RUN="$ROOT/var/run"
NGINX_PREFIX="$OUT/nginx"
NGINX_PID="$RUN/bench-nginx.pid"
GW_PIDFILE="$RUN/bench-gateway.pid"
# The secrets are the stack's (var/secrets.env, read after infra-up below), or the environment's.
# Dev mode, as the Makefile sets it for the local stack (docs/security.md).
export FLASHGATE_DEV="${FLASHGATE_DEV:-1}"

T0="$(date +%s)"
say() { printf 'bench: [%4ss] %s\n' "$(($(date +%s) - T0))" "$*" >&2; }
die() {
	printf 'bench: ERROR: %s\n' "$1" >&2
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
posint() { [[ "$1" =~ ^[1-9][0-9]*$ ]]; }
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

# ---------------------------------------------------------------------------------------------
# settings

for v in CONC USERS INGEST_ORDERS CONNS SELLOUT_TOTAL PURCHASE_TOTAL NGINX_PORT GW_PORT GW_ADMIN SEEDS_PORT EDGE_PORT; do
	posint "${!v}" || die "$v (BENCH_*) must be a positive whole number, not '${!v}'"
done
if [[ "$DURATION" =~ ^([1-9][0-9]*)s?$ ]]; then
	DSECS="${BASH_REMATCH[1]}"
elif [[ "$DURATION" =~ ^([1-9][0-9]*)m$ ]]; then
	DSECS=$((BASH_REMATCH[1] * 60))
else
	die "BENCH_DURATION must be whole seconds or minutes (10s, 2m), not '$DURATION'"
fi
DURATION="${DSECS}s"
[[ "$PROFILE" == 0 || "$PROFILE" == 1 ]] || die "BENCH_PROFILE must be 0 or 1"

need "$GO" nginx envsubst curl awk redis-benchmark redis-cli
for p in "$NGINX_PORT" "$GW_PORT" "$GW_ADMIN" "$SEEDS_PORT" "$EDGE_PORT"; do
	tcp_open "$p" && die "127.0.0.1:$p is taken (BENCH_NGINX_PORT / BENCH_GATEWAY_PORT / BENCH_GATEWAY_ADMIN_PORT / BENCH_SEEDSYNC_PORT choose others)"
done

PARTS=(seeds_sync redis_evalsha purchases sellout nginx_fixed refusals refusals_audit refusals_nginx p99_half_peak nginx_half_peak backend_ingest rss_10k)
mkdir -p "$OUT" "$LOG" "$RUN" "$NGINX_PREFIX/tmp" "$PROF" "$PROF_TXT"
for p in "${PARTS[@]}"; do
	rm -f "$OUT/$p".{json,out,err,cmd,rc,skip,cpu}
done
rm -f "$OUT/run.json" "$PROF"/*.pprof
STARTED="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
LOAD_START="$(cut -d' ' -f1-3 /proc/loadavg)"

# ---------------------------------------------------------------------------------------------
# clean-up: the current part, the bench gateway and nginx; the stack's apps only if this run
# started them; the bench's sales closed.

PART_PID=""
PROF_PID=""
GW_PID=""
STARTED_APPS=()
SALES=()
stop_pid() { # stop_pid PID SIGNAL GRACE_TENTHS
	local pid="$1" i
	[[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 0
	kill "-$2" "$pid" 2>/dev/null || true
	for ((i = 0; i < $3; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
	wait "$pid" 2>/dev/null || true
}
stop_gateway() {
	stop_pid "$GW_PID" TERM 150
	GW_PID=""
	rm -f "$GW_PIDFILE"
}
stop_nginx() {
	[[ -f "$NGINX_PID" ]] || return 0
	local np
	np="$(tr -dc '0-9' <"$NGINX_PID")"
	if [[ -n "$np" ]] && tr '\0' ' ' <"/proc/$np/cmdline" 2>/dev/null | grep -q "$NGINX_PREFIX"; then
		stop_pid "$np" QUIT 100
	fi
	rm -f "$NGINX_PID"
}
close_sales() {
	local s
	for s in "${SALES[@]}"; do
		"$BIN" sale close --config "$CONFIG" "$s" >>"$LOG/bench.log" 2>&1 || true
	done
	SALES=()
}
cleanup() {
	local rc=$?
	rm -f "$OUT/admin.hdr"
	stop_pid "$PROF_PID" TERM 20
	stop_pid "$PART_PID" TERM 300 # the first SIGTERM ends a load and lets a script clean up
	stop_nginx
	[[ "$(type -t stop_edge)" == function ]] && stop_edge
	stop_gateway
	((${#SALES[@]} == 0)) || close_sales
	if ((${#STARTED_APPS[@]})); then
		say "stopping what this run started: ${STARTED_APPS[*]}"
		"$STACK" apps-down "${STARTED_APPS[@]}" >>"$LOG/bench-stack.log" 2>&1 ||
			printf 'bench: scripts/stack.sh apps-down %s failed (see %s)\n' "${STARTED_APPS[*]}" "$LOG/bench-stack.log" >&2
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------------------------
# parts: each command's stdout in var/bench/NAME.out, stderr in NAME.err, the command line in
# NAME.cmd, its exit code in NAME.rc; the JSON result in NAME.json (written by the tool, or the
# last line of a script's stdout).

# rel ARGS...: the command line as a person would type it from the repository: paths relative,
# arguments with spaces or shell characters in single quotes.
rel() {
	local a out=()
	for a in "$@"; do
		a="${a//"$ROOT/"/}"
		[[ "$a" =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]] || a="'${a//\'/\'\\\'\'}'"
		out+=("$a")
	done
	printf '%s' "${out[*]}"
}
# note NAME CMD...: record a command of NAME (a part may have several: they accumulate).
note() {
	local name="$1"
	shift
	rel "$@" >>"$OUT/$name.cmd"
	printf '\n' >>"$OUT/$name.cmd"
}
# run NAME CMD...: run CMD in the background (so that a signal reaches this script at once),
# wait for it; returns its exit code, recorded in NAME.rc.
run() {
	local name="$1" rc=0
	shift
	note "$name" "$@"
	"$@" >"$OUT/$name.out" 2>"$OUT/$name.err" </dev/null &
	PART_PID=$!
	wait "$PART_PID" || rc=$?
	PART_PID=""
	echo "$rc" >"$OUT/$name.rc"
	if ((rc != 0)); then
		say "$name FAILED (exit $rc): last lines of var/bench/$name.err and .out:"
		tail -n 8 "$OUT/$name.err" >&2 || true
		tail -n 8 "$OUT/$name.out" >&2 || true
	fi
	return "$rc"
}
# skip NAME WHY: a part that could not run.
skip() {
	printf '%s\n' "$2" >"$OUT/$1.skip"
	say "$1 skipped: $2"
}
# show NAME: the load tool's summary lines of NAME, on stderr.
show() {
	grep -E '^(requests|status|latency|  +202|audit|orders|redis|checks|drained|ingest|backend|conns|gateway) ' "$OUT/$1.out" 2>/dev/null |
		sed "s/^/bench:        $1 | /" >&2 || true
}

# CPU per answer (issue 13): utime + stime of each process of the chain, in clock ticks, from
# /proc/<pid>/stat, read right before and right after a part (its audit and drain included: the
# backend's writes and MariaDB's commits of the part's orders are part of what a purchase costs).
# cpu_snap PART before|after NGINX_PIDFILE: appends "<when> <process> <ticks>" lines to
# var/bench/PART.cpu; nginx (master and workers) only when a pid file is given. bench/report
# divides the difference by the part's answers.
CLK_TCK="$(getconf CLK_TCK 2>/dev/null || echo 100)"
ticks_of() { # ticks_of PID...: the sum of utime+stime of those processes (and nothing for a gone one)
	local p sum=0 st rest
	local -a f
	for p in "$@"; do
		[[ -n "$p" && -r "/proc/$p/stat" ]] || continue
		st="$(cat "/proc/$p/stat" 2>/dev/null)" || continue
		rest="${st##*) }" # the fields after the command name (which may hold spaces)
		read -r -a f <<<"$rest"
		sum=$((sum + f[11] + f[12])) # fields 14 and 15 of proc(5): utime, stime
	done
	echo "$sum"
}
pid_in() { [[ -f "$1" ]] && tr -dc '0-9' <"$1" || true; } # "" when there is none (never fails: cleanup runs under set -e)
nginx_pids() { # the master named by the pid file and its workers
	local m
	m="$(pid_in "$1")"
	[[ -n "$m" ]] || return 0
	echo "$m"
	pgrep -P "$m" 2>/dev/null || true
}
cpu_snap() {
	local part="$1" when="$2" rp=() f
	for f in "$RUN"/redis-*.pid; do rp+=("$(pid_in "$f")"); done
	{
		[[ "$when" == before ]] && echo "clk_tck $CLK_TCK"
		echo "$when gateway $(ticks_of "$GW_PID")"
		echo "$when redis $(ticks_of "${rp[@]}")"
		echo "$when nats $(ticks_of "$(pid_in "$RUN/nats.pid")")"
		echo "$when backend $(ticks_of "$(pid_in "$RUN/backend.pid")")"
		echo "$when mariadb $(ticks_of "$(pid_in "$RUN/mariadb.pid")")"
		if [[ -n "${3:-}" ]]; then
			# shellcheck disable=SC2046 # one pid per word
			echo "$when nginx $(ticks_of $(nginx_pids "$3"))"
		fi
		echo "$when at $(date +%s.%N)"
	} >>"$OUT/$part.cpu"
}

FAILED=0
step=0
steps=12
next() {
	step=$((step + 1))
	say "[$step/$steps] $*"
}

say "settings: duration $DURATION, concurrency $CONC, users $USERS, ingest orders $INGEST_ORDERS, conns $CONNS, profile $PROFILE; $(nproc) cores, load average $LOAD_START"

say "building bin/flashgate, bin/flashgate-bench-ingest, bin/flashgate-bench-conns and bin/bench-report"
"$GO" build -o "$BIN" ./cmd/flashgate || die "go build ./cmd/flashgate failed"
"$GO" build -o "$INGEST_BIN" ./bench/ingest || die "go build ./bench/ingest failed"
"$GO" build -o "$CONNS_BIN" ./bench/conns || die "go build ./bench/conns failed"
"$GO" build -o "$REPORT" ./bench/report || die "go build ./bench/report failed"

# ---------------------------------------------------------------------------------------------
# the stack: infra, and a backend behind the bench gateway

"$STACK" infra-up >>"$LOG/bench-stack.log" 2>&1 || die "scripts/stack.sh infra-up failed" "$LOG/bench-stack.log"
# The operator's credentials (docs/credentials.md): the CLI and the bench's own processes log in.
# shellcheck disable=SC1091 # written by scripts/stack.sh
. "$ROOT/var/secrets.env"
# The admin API's bearer token (pprof needs it), in a file curl reads (-H @file): never on a
# command line the report shows.
ADMIN_HDR="$OUT/admin.hdr"
(umask 077 && printf 'Authorization: Bearer %s\n' "${FLASHGATE_ADMIN_TOKEN:-}" >"$ADMIN_HDR")
if [[ "$(status_of backend)" != up ]]; then
	before=()
	for p in nginx gateway backend; do
		[[ "$(status_of "$p")" == up ]] || before+=("$p")
	done
	say "no backend running: scripts/stack.sh up (will stop ${before[*]} again at the end)"
	STARTED_APPS=("${before[@]}")
	"$STACK" up >>"$LOG/bench-stack.log" 2>&1 || die "scripts/stack.sh up failed" "$LOG/bench-stack.log"
	STACK_NOTE="started by the bench (scripts/stack.sh up), stopped afterwards: ${before[*]}"
else
	STACK_NOTE="running before the bench, left running"
fi

LOADGEN=(--users "$USERS" --concurrency "$CONC" --duration "$DURATION")

# ---------------------------------------------------------------------------------------------
# 1. the seeds' synchronous design

next "seeds_sync: scripts/bench-seedsync.sh"
if run seeds_sync env BENCH_USERS="$USERS" BENCH_CONCURRENCY="$CONC" BENCH_DURATION="$DURATION" \
	BENCH_SEEDSYNC_PORT="$SEEDS_PORT" scripts/bench-seedsync.sh; then
	tail -n 1 "$OUT/seeds_sync.out" >"$OUT/seeds_sync.json"
	sed -n 's/^bench-seedsync: \(bin\/flashgate bench .*\)/\1/p' "$OUT/seeds_sync.err" >>"$OUT/seeds_sync.cmd"
	grep '^bench-seedsync: seeds_sync:' "$OUT/seeds_sync.err" | sed 's/^/bench:        /' >&2 || true
else
	FAILED=1
fi

# ---------------------------------------------------------------------------------------------
# 2. Redis's limit

next "redis_evalsha: scripts/bench-redis.sh"
if run redis_evalsha env BENCH_REDIS_PORT="${BENCH_REDIS_PORT:-$((16379 + OFFSET))}" scripts/bench-redis.sh; then
	tail -n 1 "$OUT/redis_evalsha.out" >"$OUT/redis_evalsha.json"
	grep '^redis:' "$OUT/redis_evalsha.err" | sed 's/^/bench:        /' >&2 || true
else
	FAILED=1
fi

# ---------------------------------------------------------------------------------------------
# 3. flashgate: a bench gateway of its own, rate limits off, the stack's backend behind it

# Its sold-out marks go where the edge nginx of refusals_nginx looks (docs/gateway.md).
EDGE_MARKS="$OUT/nginx-edge/marks"
say "starting the bench gateway on 127.0.0.1:$GW_PORT (admin $GW_ADMIN), rate limits off"
printf '\n==== bench gateway %s ====\n' "$(date -Is)" >>"$LOG/bench-gateway.log"
(
	export FLASHGATE_GATEWAY_LISTEN="127.0.0.1:$GW_PORT" FLASHGATE_GATEWAY_ADMIN_LISTEN="127.0.0.1:$GW_ADMIN"
	export FLASHGATE_RATELIMIT_PER_IP_RATE=0 FLASHGATE_RATELIMIT_PER_USER_RATE=0 FLASHGATE_RATELIMIT_PER_SALE_RATE=0
	export FLASHGATE_GATEWAY_EDGE_MARKS_DIR="$EDGE_MARKS"
	exec setsid "$BIN" gateway --config "$CONFIG" --log-level warn
) </dev/null >>"$LOG/bench-gateway.log" 2>&1 &
GW_PID=$!
echo "$GW_PID" >"$GW_PIDFILE"
# The command as it ran, with what else of FLASHGATE_* the environment gave it (secrets left out).
# redact: a secret's value out of NAME=value lines (passwords, tokens, the DSN's password); bench/report
# redacts what it writes again.
redact() {
	sed -E -e 's/^(FLASHGATE_[A-Z0-9_]*(PASSWORD|SECRET|TOKEN|_KEY)[A-Z0-9_]*)=.*/\1=<redacted>/' \
		-e 's#^(FLASHGATE_[A-Z0-9_]*DSN=[^:@/]*):[^@]*@#\1:<redacted>@#'
}
GW_ENV="$(env | grep -E '^FLASHGATE_[A-Z0-9_]+=' | grep -vE '^FLASHGATE_(JWT_SECRET|ADMIN_TOKEN|GATEWAY_LISTEN|GATEWAY_ADMIN_LISTEN|GATEWAY_EDGE_MARKS_DIR|RATELIMIT_PER_(IP|USER|SALE)_RATE)=' |
	sort | redact | tr '\n' ' ' || true)"
GW_ENV+="FLASHGATE_GATEWAY_EDGE_MARKS_DIR=${EDGE_MARKS#"$ROOT"/} FLASHGATE_GATEWAY_LISTEN=127.0.0.1:$GW_PORT FLASHGATE_GATEWAY_ADMIN_LISTEN=127.0.0.1:$GW_ADMIN FLASHGATE_RATELIMIT_PER_IP_RATE=0 FLASHGATE_RATELIMIT_PER_USER_RATE=0 FLASHGATE_RATELIMIT_PER_SALE_RATE=0"
GW_CMD="$GW_ENV bin/flashgate gateway --config $CONFIG --log-level warn"
GW_URL="http://127.0.0.1:$GW_PORT"
gw_ready() { [[ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "http://127.0.0.1:$GW_ADMIN/readyz")" == 200 ]]; }
GW_OK=1
gw_starting() { kill -0 "$GW_PID" 2>/dev/null && ! gw_ready; }
for ((i = 0; i < 300; i++)); do gw_starting || break; sleep 0.1; done
if gw_ready; then
	say "bench gateway pid $GW_PID ready"
else
	GW_OK=0
	FAILED=1
	say "the bench gateway did not get ready on 127.0.0.1:$GW_ADMIN: the flashgate parts are skipped; last lines of var/log/bench-gateway.log:"
	tail -n 5 "$LOG/bench-gateway.log" >&2 || true
	stop_gateway
fi
GW_WHY="the bench gateway did not start (var/log/bench-gateway.log)"

STAMP="$(date +%Y%m%d%H%M%S)"

# 3a. purchases while stock lasts, with the audit; the gateway's profiles meanwhile
purchases() {
	local rc=0 i psecs
	SALE_P="bench-purchases-$STAMP"
	SALES+=("$SALE_P")
	note purchases "$BIN" bench --config "$CONFIG" --label purchases --create --sale "$SALE_P" --total "$PURCHASE_TOTAL" \
		--per-user-limit 1 --target "$GW_URL" "${LOADGEN[@]}" --json "$OUT/purchases.json"
	cpu_snap purchases before
	"$BIN" bench --config "$CONFIG" --label purchases --create --sale "$SALE_P" --total "$PURCHASE_TOTAL" \
		--per-user-limit 1 --target "$GW_URL" "${LOADGEN[@]}" --json "$OUT/purchases.json" \
		>"$OUT/purchases.out" 2>"$OUT/purchases.err" </dev/null &
	PART_PID=$!
	if [[ "$PROFILE" == 1 ]]; then
		# The CPU profile starts with the load (its first progress line, a second in) and ends a
		# second before it; idle time adds no samples.
		for ((i = 0; i < 1200; i++)); do
			grep -q 'req/s' "$OUT/purchases.err" 2>/dev/null && break
			kill -0 "$PART_PID" 2>/dev/null || break
			sleep 0.1
		done
		psecs=$((DSECS > 3 ? DSECS - 2 : 1))
		note purchases curl -s -H @"$ADMIN_HDR" -o "$PROF/gateway-cpu.pprof" "http://127.0.0.1:$GW_ADMIN/debug/pprof/profile?seconds=$psecs"
		curl -s -f -H @"$ADMIN_HDR" --max-time $((psecs + 30)) -o "$PROF/gateway-cpu.pprof" "http://127.0.0.1:$GW_ADMIN/debug/pprof/profile?seconds=$psecs" &
		PROF_PID=$!
	fi
	# The load's end (the tool then waits for the backend to write every order and audits):
	# the CPU of the load alone, beside that of load + drain.
	while kill -0 "$PART_PID" 2>/dev/null && ! grep -q 'waiting up to' "$OUT/purchases.err" 2>/dev/null; do sleep 0.05; done
	kill -0 "$PART_PID" 2>/dev/null && cpu_snap purchases load
	wait "$PART_PID" || rc=$?
	PART_PID=""
	if [[ -n "$PROF_PID" ]]; then
		wait "$PROF_PID" || say "warning: the gateway's CPU profile failed"
		PROF_PID=""
	fi
	cpu_snap purchases after
	if [[ "$PROFILE" == 1 ]]; then
		note purchases curl -s -H @"$ADMIN_HDR" -o "$PROF/gateway-allocs.pprof" "http://127.0.0.1:$GW_ADMIN/debug/pprof/allocs"
		curl -s -f -H @"$ADMIN_HDR" --max-time 30 -o "$PROF/gateway-allocs.pprof" "http://127.0.0.1:$GW_ADMIN/debug/pprof/allocs" ||
			say "warning: the gateway's allocation profile failed"
	fi
	echo "$rc" >"$OUT/purchases.rc"
	show purchases
	if ((rc != 0)); then
		say "purchases FAILED (exit $rc)"
		tail -n 5 "$OUT/purchases.err" >&2 || true
		FAILED=1
	fi
	[[ -f "$OUT/purchases.json" ]] && PURCHASE_RATE="$("$REPORT" rate "$OUT/purchases.json" 2>/dev/null || true)"
	return 0
}
PURCHASE_RATE=""
next "purchases: bin/flashgate bench --create (total $PURCHASE_TOTAL, 1 per user), audited"
if ((GW_OK)); then purchases; else skip purchases "$GW_WHY"; fi

# 3b. refusals after sell-out: sell a small sale out (audited); nginx's fixed answer (the
# yardstick, measured right before, so that both see the same machine); the sold-out sale's 409s;
# then the sale audited again.
next "sellout: a $SELLOUT_TOTAL-unit sale sold out by bin/flashgate bench, audited"
SALE_R="bench-refusals-$STAMP"
SOLD_OUT=0
if ((GW_OK)); then
	SALES+=("$SALE_R")
	if run sellout "$BIN" bench --config "$CONFIG" --label sellout --create --sale "$SALE_R" --total "$SELLOUT_TOTAL" \
		--per-user-limit 1 --target "$GW_URL" --users 20000 --concurrency "$CONC" --requests 20000 --json "$OUT/sellout.json"; then
		SOLD_OUT=1
	else
		FAILED=1
	fi
	show sellout
else
	skip sellout "$GW_WHY"
fi

# the HTTP limit: nginx answering a fixed 409, driven by the load tool
# nginx/bench.conf on its own port: the fixed 409, the HTTP limit of this machine
# shellcheck disable=SC2016 # literal ${...}: the names envsubst may substitute
BENCH_LISTEN="127.0.0.1:$NGINX_PORT" BENCH_LOG_DIR="$LOG" BENCH_PID="$NGINX_PID" \
	envsubst '${BENCH_LISTEN} ${BENCH_LOG_DIR} ${BENCH_PID}' <"$ROOT/nginx/bench.conf" >"$NGINX_PREFIX/nginx.conf"
hard="$(ulimit -Hn)"
[[ "$hard" == unlimited ]] && hard=65535
((hard > 65535)) && hard=65535
g="worker_rlimit_nofile $hard;"
[[ "$(id -u)" == 0 ]] && g+=" user root root;"
nginx_args=(-p "$NGINX_PREFIX/" -c "$NGINX_PREFIX/nginx.conf" -e "$LOG/nginx-bench-error.log" -g "$g")
start_nginx() { # start_nginx PART: the fixed-answer nginx, for PART
	if nginx "${nginx_args[@]}" -t -q 2>>"$LOG/nginx-bench-error.log" && nginx "${nginx_args[@]}" &&
		wait_for 10 tcp_open "$NGINX_PORT"; then
		note "$1" nginx "${nginx_args[@]}"
		return 0
	fi
	echo 1 >"$OUT/$1.rc"
	say "$1 FAILED: the bench nginx did not start (see $LOG/nginx-bench-error.log)"
	tail -n 5 "$LOG/nginx-bench-error.log" >&2 || true
	FAILED=1
	return 1
}

next "nginx_fixed: nginx/bench.conf on 127.0.0.1:$NGINX_PORT, bin/flashgate bench --no-check"
if start_nginx nginx_fixed; then
	cpu_snap nginx_fixed before "$NGINX_PID"
	run nginx_fixed "$BIN" bench --config "$CONFIG" --label nginx --no-check --sale bench-nginx-fixed \
		--target "http://127.0.0.1:$NGINX_PORT" "${LOADGEN[@]}" --json "$OUT/nginx_fixed.json" || FAILED=1
	cpu_snap nginx_fixed after "$NGINX_PID"
	show nginx_fixed
fi
stop_nginx

# the gateway's purchase requests so far (its metric), to show what reached it
gw_purchases() {
	curl -s --max-time 5 "http://127.0.0.1:$GW_ADMIN/metrics" |
		awk '/^flashgate_gateway_requests_total\{/ && /route="purchase"/ { n += $NF } END { printf "%d\n", n }'
}

next "refusals: bin/flashgate bench --no-check on the sold-out sale, then its audit"
if ((SOLD_OUT)); then
	cpu_snap refusals before
	run refusals "$BIN" bench --config "$CONFIG" --label refusals --no-check --sale "$SALE_R" --target "$GW_URL" \
		"${LOADGEN[@]}" --json "$OUT/refusals.json" || FAILED=1
	cpu_snap refusals after
	show refusals
	run refusals_audit "$BIN" bench --config "$CONFIG" --label refusals-audit --sale "$SALE_R" --target "$GW_URL" \
		--users 1000 --concurrency 64 --requests 1000 --json "$OUT/refusals_audit.json" || FAILED=1
	show refusals_audit
else
	skip refusals "no sold-out sale (see sellout)"
	skip refusals_audit "no refusals run"
fi

# the same sold-out sale through nginx with its production config (nginx/nginx.conf, rendered as
# scripts/stack.sh renders it) in front of the bench gateway, its per-IP limits (limit_req, the
# two limit_conn) lifted as the gateway's are (every request comes from this one address): nginx answers the sold-out 409s from
# the bench gateway's sold-out marks (docs/gateway.md), and the gateway's metric shows how many still reached it.
next "refusals_nginx: nginx/nginx.conf on 127.0.0.1:$EDGE_PORT in front of the bench gateway, the sold-out sale"
EDGE_PREFIX="$OUT/nginx-edge"
EDGE_PID="$RUN/bench-nginx-edge.pid"
stop_edge() {
	local np
	np="$(pid_in "$EDGE_PID")"
	if [[ -n "$np" ]] && tr '\0' ' ' <"/proc/$np/cmdline" 2>/dev/null | grep -q "$EDGE_PREFIX"; then
		stop_pid "$np" QUIT 100
	fi
	rm -f "$EDGE_PID"
}
if ((SOLD_OUT)); then
	mkdir -p "$EDGE_PREFIX/tmp" "$EDGE_PREFIX/log"
	# shellcheck disable=SC2016 # literal ${...}: the names envsubst may substitute
	NGINX_LISTEN="127.0.0.1:$EDGE_PORT" NGINX_LISTEN_EXTRA="" NGINX_UPSTREAM_SERVERS="        server 127.0.0.1:$GW_PORT max_fails=3 fail_timeout=5s;" \
		NGINX_RATE=1000000 NGINX_BURST=1000000 NGINX_CONN=65535 NGINX_BODY_CONN=65535 NGINX_READ_TIMEOUT=5s NGINX_HTML="$ROOT/nginx/html" \
		NGINX_NET_RATE=1000000 NGINX_NET_BURST=1000000 NGINX_NET_CONN=65535 NGINX_NET_BODY_CONN=65535 \
		NGINX_LOG_DIR="$EDGE_PREFIX/log" NGINX_PID="$EDGE_PID" NGINX_MARKS="$EDGE_MARKS" NGINX_RLIMIT_NOFILE="$hard" NGINX_WORKER_CONNECTIONS=$(((hard - 64) / 2)) \
		envsubst '${NGINX_LISTEN} ${NGINX_LISTEN_EXTRA} ${NGINX_UPSTREAM_SERVERS} ${NGINX_RATE} ${NGINX_BURST} ${NGINX_CONN} ${NGINX_BODY_CONN} ${NGINX_NET_RATE} ${NGINX_NET_BURST} ${NGINX_NET_CONN} ${NGINX_NET_BODY_CONN} ${NGINX_READ_TIMEOUT} ${NGINX_HTML} ${NGINX_LOG_DIR} ${NGINX_PID} ${NGINX_RLIMIT_NOFILE} ${NGINX_WORKER_CONNECTIONS} ${NGINX_MARKS}' \
		<"$ROOT/nginx/nginx.conf" >"$EDGE_PREFIX/nginx.conf"
	eg=""
	[[ "$(id -u)" == 0 ]] && eg="user root root;"
	edge_args=(-p "$EDGE_PREFIX/" -c "$EDGE_PREFIX/nginx.conf" -e "$EDGE_PREFIX/log/nginx-error.log")
	[[ -n "$eg" ]] && edge_args+=(-g "$eg")
	if nginx "${edge_args[@]}" -t -q 2>>"$LOG/nginx-bench-error.log" && nginx "${edge_args[@]}" &&
		wait_for 10 tcp_open "$EDGE_PORT"; then
		echo "# nginx/nginx.conf rendered as scripts/stack.sh does, with NGINX_RATE=1000000 NGINX_BURST=1000000 NGINX_CONN=65535 NGINX_BODY_CONN=65535 and the NGINX_NET_* as high (one load-tool address)" >>"$OUT/refusals_nginx.cmd"
		note refusals_nginx nginx "${edge_args[@]}"
		gwb="$(gw_purchases)"
		cpu_snap refusals_nginx before "$EDGE_PID"
		run refusals_nginx "$BIN" bench --config "$CONFIG" --label refusals-nginx --no-check --sale "$SALE_R" \
			--target "http://127.0.0.1:$EDGE_PORT" "${LOADGEN[@]}" --json "$OUT/refusals_nginx.json" || FAILED=1
		cpu_snap refusals_nginx after "$EDGE_PID"
		printf 'gateway_purchases_before %s\ngateway_purchases_after %s\n' "$gwb" "$(gw_purchases)" >>"$OUT/refusals_nginx.cpu"
		show refusals_nginx
	else
		echo 1 >"$OUT/refusals_nginx.rc"
		say "refusals_nginx FAILED: nginx did not start (see $EDGE_PREFIX/log/nginx-error.log)"
		FAILED=1
	fi
	stop_edge
else
	skip refusals_nginx "no sold-out sale (see sellout)"
fi

# 3c. p99 of accepted purchases at half the peak rate, audited; then nginx's fixed answer paced at
# the same rate (the yardstick of the tail)
if posint "${PURCHASE_RATE:-x}" && ((GW_OK)); then
	HALF=$(((PURCHASE_RATE + 1) / 2))
	next "p99_half_peak: bin/flashgate bench --create --rate $HALF (half of $PURCHASE_RATE accepted/s), audited"
	SALE_H="bench-p99-$STAMP"
	SALES+=("$SALE_H")
	cpu_snap p99_half_peak before
	run p99_half_peak "$BIN" bench --config "$CONFIG" --label p99-half-peak --create --sale "$SALE_H" \
		--total "$PURCHASE_TOTAL" --per-user-limit 1 --target "$GW_URL" "${LOADGEN[@]}" --rate "$HALF" \
		--json "$OUT/p99_half_peak.json" || FAILED=1
	cpu_snap p99_half_peak after
	show p99_half_peak
	next "nginx_half_peak: nginx/bench.conf paced at $HALF req/s"
	if start_nginx nginx_half_peak; then
		run nginx_half_peak "$BIN" bench --config "$CONFIG" --label nginx-half-peak --no-check --sale bench-nginx-fixed \
			--target "http://127.0.0.1:$NGINX_PORT" "${LOADGEN[@]}" --rate "$HALF" --json "$OUT/nginx_half_peak.json" || FAILED=1
		show nginx_half_peak
	fi
	stop_nginx
else
	next "p99_half_peak"
	skip p99_half_peak "no purchase rate measured (see purchases)"
	skip nginx_half_peak "no purchase rate measured (see purchases)"
fi

# 3d. the backend's ingestion from a pre-filled stream (its own backend process, database, stream)
next "backend_ingest: bin/flashgate-bench-ingest --orders $INGEST_ORDERS, audited"
ING_ARGS=()
[[ "$PROFILE" == 1 ]] && ING_ARGS=(--profile "$PROF")
run backend_ingest "$INGEST_BIN" --config "$CONFIG" --backend-bin "$BIN" --orders "$INGEST_ORDERS" "${ING_ARGS[@]}" \
	--json "$OUT/backend_ingest.json" || FAILED=1
show backend_ingest

# 3e. the bench gateway's resident memory holding 10,000 idle connections
next "rss_10k: bin/flashgate-bench-conns --conns $CONNS on the bench gateway"
if ((GW_OK)); then
	run rss_10k "$CONNS_BIN" --config "$CONFIG" --pid-file "$GW_PIDFILE" --target "$GW_URL" --sale "$SALE_R" \
		--conns "$CONNS" --json "$OUT/rss_10k.json" || FAILED=1
	show rss_10k
else
	skip rss_10k "$GW_WHY"
fi

stop_gateway
close_sales

# ---------------------------------------------------------------------------------------------
# profiles as text

if [[ "$PROFILE" == 1 ]]; then
	for f in gateway-cpu gateway-allocs backend-cpu backend-allocs; do
		rm -f "$PROF_TXT/$f.txt" "$PROF_TXT/$f-objects.txt"
		[[ -s "$PROF/$f.pprof" ]] || { say "warning: no $f profile"; continue; }
		"$GO" tool pprof -top -nodecount=25 "$PROF/$f.pprof" >"$PROF_TXT/$f.txt" 2>>"$LOG/bench.log" ||
			say "warning: go tool pprof on $f.pprof failed"
		if [[ "$f" == *allocs ]]; then
			"$GO" tool pprof -top -nodecount=25 -sample_index=alloc_objects "$PROF/$f.pprof" >"$PROF_TXT/$f-objects.txt" 2>>"$LOG/bench.log" ||
				say "warning: go tool pprof on $f.pprof (alloc_objects) failed"
		fi
	done
	say "profiles: var/bench/profiles/*.pprof, top 25 in bench/profiles/*.txt"
fi

# ---------------------------------------------------------------------------------------------
# the report

jstr() { local v="${1//\\/\\\\}"; printf '%s' "${v//\"/\\\"}"; } # JSON string body
FINISHED="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
cat >"$OUT/run.json" <<EOF
{
  "started": "$STARTED",
  "finished": "$FINISHED",
  "elapsed_s": $(($(date +%s) - T0)),
  "loadavg_start": "$LOAD_START",
  "loadavg_end": "$(cut -d' ' -f1-3 /proc/loadavg)",
  "stack": "$(jstr "$STACK_NOTE")",
  "gateway": "$(jstr "$GW_CMD")",
  "settings": {
    "duration": "$DURATION",
    "concurrency": $CONC,
    "users": $USERS,
    "ingest_orders": $INGEST_ORDERS,
    "conns": $CONNS,
    "profile": $PROFILE,
    "sellout_total": $SELLOUT_TOTAL,
    "purchase_total": $PURCHASE_TOTAL
  }
}
EOF
say "writing $RESULTS and $MARKDOWN"
rargs=(--dir "$OUT" --results "$RESULTS" --markdown "$MARKDOWN")
[[ "$PROFILE" == 1 ]] && rargs+=(--profiles "${PROF_TXT#"$ROOT/"}")
[[ "${BENCH_STRICT:-}" == 1 ]] && rargs+=(--strict)
rc=0
"$REPORT" "${rargs[@]}" || rc=$?
((rc != 0 || FAILED == 0)) || rc=1
exit "$rc"
