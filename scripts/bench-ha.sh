#!/usr/bin/env bash
# What replication costs (docs/recovery.md "Losing one node"): purchases/s, p99 and CPU per
# purchase of the same load (`bin/flashgate bench`) on four shapes of the local stack, in one run:
#
#   R1           REDIS=cluster NATS=single   (the stream at R1), redis.wait_replicas 0
#   R3           REDIS=cluster NATS=cluster  (the streams at R3), redis.wait_replicas 0
#   R1 + wait 1  as R1, each admission waiting for its master's replica (WAIT 1)
#   R3 + wait 1  as R3, likewise
#
# CPU is read from /proc/<pid>/stat (utime + stime) of every process of the stack before and after
# each bench (the drain of the accepted orders included) and divided by the purchases; the rows
# split it by part: gateway, backend, Redis (all six Cluster nodes), NATS (every node), MariaDB.
# Each shape is a fresh stack (`scripts/stack.sh down` then `up`), so run it on a stack of your
# own: it stops whatever the stack of this checkout and STACK_PORT_OFFSET was running, and leaves
# it down. Writes var/bench/ha-<shape>.json (the bench's own JSON) and prints a markdown table.
#
# Settings: HA_REQUESTS (purchases per shape, default 10000), HA_CONCURRENCY (64), HA_USERS (20000).
# A fixed number, not a duration: every shape's orders must drain into MariaDB before the audit.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STACK="$ROOT/scripts/stack.sh"
OUT="$ROOT/var/bench"
OFFSET="${STACK_PORT_OFFSET:-0}"
REQUESTS="${HA_REQUESTS:-10000}"
CONC="${HA_CONCURRENCY:-64}"
USERS="${HA_USERS:-20000}"
TICK="$(getconf CLK_TCK)"
mkdir -p "$OUT" "$ROOT/var/log"

say() { printf 'bench-ha: %s\n' "$*" >&2; }

# ticks PID...: utime + stime of those processes, in clock ticks.
ticks() {
	local p sum=0 f
	for p in "$@"; do
		[[ -r "/proc/$p/stat" ]] || continue
		# The command name (field 2) may hold spaces: count fields after its closing parenthesis.
		f="$(sed 's/^.*) //' "/proc/$p/stat")"
		read -r -a a <<<"$f"
		sum=$((sum + a[11] + a[12]))
	done
	echo "$sum"
}

pids_of() { local f; for f in "$@"; do [[ -f "$f" ]] && tr -dc '0-9\n' <"$f"; echo; done | grep -v '^$' || true; }

# run_shape SLUG LABEL NATS WAIT
run_shape() {
	local slug="$1" name="$2" nats="$3" wait="$4"
	say "shape $name: NATS=$nats wait_replicas=$wait"
	"$STACK" down >>"$ROOT/var/log/bench-ha.log" 2>&1
	REDIS=cluster NATS="$nats" FLASHGATE_REDIS_WAIT_REPLICAS="$wait" "$STACK" up >>"$ROOT/var/log/bench-ha.log" 2>&1 ||
		{ say "stack up failed: var/log/bench-ha.log"; exit 1; }
	local run="$ROOT/var/run" gw be rd nt my
	gw="$(pids_of "$run/gateway.pid")"
	be="$(pids_of "$run/backend.pid")"
	rd="$(pids_of "$run"/redis-$((17001 + OFFSET)).pid "$run"/redis-$((17002 + OFFSET)).pid "$run"/redis-$((17003 + OFFSET)).pid \
		"$run"/redis-$((17004 + OFFSET)).pid "$run"/redis-$((17005 + OFFSET)).pid "$run"/redis-$((17006 + OFFSET)).pid)"
	nt="$(pids_of "$run/nats.pid" "$run/nats-1.pid" "$run/nats-2.pid" "$run/nats-3.pid")"
	my="$(pids_of "$run/mariadb.pid")"
	local t0g t0b t0r t0n t0m
	# shellcheck disable=SC2086 # word splitting of the pid lists is meant
	{ t0g=$(ticks $gw); t0b=$(ticks $be); t0r=$(ticks $rd); t0n=$(ticks $nt); t0m=$(ticks $my); }
	# shellcheck disable=SC1091 # written by scripts/stack.sh; in a subshell: the next shape's own
	(. "$ROOT/var/secrets.env" && bin/flashgate bench --create --label "ha-$slug" --total 10000000 --per-user-limit 100000 \
		--users "$USERS" --concurrency "$CONC" --requests "$REQUESTS" --drain-timeout 5m \
		--target "http://127.0.0.1:$((8080 + OFFSET))" --json "$OUT/ha-$slug.json" >"$OUT/ha-$slug.out" 2>&1) ||
		{ say "bench failed: $OUT/ha-$slug.out"; tail -n 20 "$OUT/ha-$slug.out" >&2; exit 1; }
	local g b r n m
	# shellcheck disable=SC2086
	{ g=$(($(ticks $gw) - t0g)); b=$(($(ticks $be) - t0b)); r=$(($(ticks $rd) - t0r)); n=$(($(ticks $nt) - t0n)); m=$(($(ticks $my) - t0m)); }
	python3 - "$OUT/ha-$slug.json" "$name" "$TICK" "$g" "$b" "$r" "$n" "$m" <<-'PY'
		import json, sys
		path, name, tick = sys.argv[1], sys.argv[2], int(sys.argv[3])
		g, b, r, n, m = (int(x) for x in sys.argv[4:9])
		d = json.load(open(path))
		load = d["load"]
		acc = load["accepted"]
		us = lambda t: t * 1e6 / tick / acc if acc else float("nan")
		p99 = load["accepted_latency_us"]["p99"] / 1000
		audit = d.get("audit") or {}
		ok = "ok" if audit.get("ok") else "NOT OK"
		print(f"| {name} | {acc} | {acc / load['elapsed_s']:,.0f} | {p99:.1f} | {us(g):.0f} | {us(b):.0f} | {us(r):.0f} | {us(n):.0f} | {us(m):.0f} | {us(g + b + r + n + m):.0f} | {ok} |")
	PY
}

echo "| shape | purchases | purchases/s | p99 of a 202 (ms) | gateway µs | backend µs | Redis µs | NATS µs | MariaDB µs | total CPU µs / purchase | audit |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
run_shape r1 "R1" single 0
run_shape r3 "R3" cluster 0
run_shape r1-wait1 "R1 + wait 1" single 1
run_shape r3-wait1 "R3 + wait 1" cluster 1
"$STACK" down >>"$ROOT/var/log/bench-ha.log" 2>&1
say "done: $OUT/ha-*.json; the stack is down"
