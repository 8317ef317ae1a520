#!/usr/bin/env bash
# flashgate local stack (DESIGN.md §10).
#
# Starts the project's OWN servers on its own loopback ports, with all data, logs and pid files
# under var/ in the repository. It never touches services already running on the machine
# (a system redis on 6379, mariadb on 3306, nats on 4222, nginx on 80 ...): it only ever stops
# processes recorded in its own pid files.
#
#   scripts/stack.sh deps        install missing Debian packages, go mod download
#   scripts/stack.sh infra-up    Redis, Redis Cluster, NATS (JetStream), MariaDB
#   scripts/stack.sh up          infra-up, backend, gateway (bin/flashgate), nginx
#   scripts/stack.sh nginx-up    nginx alone (needs no gateway: /v1/ then answers a JSON 502)
#   scripts/stack.sh nginx-down  stop nginx
#   scripts/stack.sh nginx-reload  re-render nginx's config, test it, reload the running nginx
#   scripts/stack.sh apps-down [nginx gateway backend]  stop those (default all three), keep the infra
#   scripts/stack.sh down        stop everything of ours, in reverse order (idempotent)
#   scripts/stack.sh status      one line per part: up/down
#   scripts/stack.sh reset       down, then remove var/
#   scripts/stack.sh nginx-test  render nginx/nginx.conf into var/nginx/nginx.conf and nginx -t it
#   scripts/stack.sh nginx-conf [OUT]  only render it (into OUT) and print the path
#
# Environment: STACK_TIMEOUT (seconds to wait for each part, default 30), STACK_CONFIG (config
# file for the apps, default configs/flashgate.yaml),
# GO (go command), NGINX_RATE/NGINX_BURST/NGINX_CONN/NGINX_READ_TIMEOUT/NGINX_GATEWAYS (nginx's
# per-IP limits and upstream, see the nginx section), everything else is passed through to the
# app processes unchanged.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VAR="$ROOT/var"
RUN="$VAR/run"
LOG="$VAR/log"
BIN="$ROOT/bin/flashgate"
CONFIG="${STACK_CONFIG:-configs/flashgate.yaml}"
TIMEOUT="${STACK_TIMEOUT:-30}"

REDIS_PORT=16379
CLUSTER_PORTS=(17001 17002 17003)
NATS_PORT=14222
NATS_MON=18222
MYSQL_PORT=13306
NGINX_PORT=8000
GATEWAY_PORT=8080
GATEWAY_ADMIN=8081
BACKEND_ADMIN=8082

NGINX_TEMPLATE="$ROOT/nginx/nginx.conf"
NGINX_PREFIX="$VAR/nginx/"
NGINX_CONF="$VAR/nginx/nginx.conf"

MYSQL_DATA="$VAR/mysql/data"
MYSQL_PID="$RUN/mariadb.pid"
MYSQL_SOCK="$RUN/mysqld.sock"
# A unix socket path is limited to 107 bytes; fall back to /tmp for a deeply nested checkout.
if (( ${#MYSQL_SOCK} > 100 )); then
	MYSQL_SOCK="/tmp/flashgate-mysqld-$(printf '%s' "$ROOT" | md5sum | cut -c1-12).sock"
fi

DEB_PACKAGES=(redis-server redis-tools mariadb-server mariadb-client nats-server nginx gettext-base wrk curl gcc libc6-dev)

# Where Debian puts the daemons (/usr/sbin is not on every PATH).
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin:/usr/local/go/bin"

# ---------------------------------------------------------------------------------------------
# helpers

say() { printf 'stack: %s\n' "$*"; }
warn() { printf 'stack: %s\n' "$*" >&2; }

# die MESSAGE [LOGFILE]: fail with a clear message and the tail of the relevant log.
die() {
	warn "ERROR: $1"
	if [[ -n "${2:-}" && -f "$2" ]]; then
		warn "---- last 30 lines of $2 ----"
		tail -n 30 "$2" >&2 || true
		warn "----"
	fi
	exit 1
}

need() {
	local c
	for c in "$@"; do
		command -v "$c" >/dev/null 2>&1 || die "'$c' not found: run 'make deps' (or scripts/stack.sh deps) first"
	done
}

mkdirs() { mkdir -p "$RUN" "$LOG" "$@"; }

# pid_of PIDFILE: print the pid recorded in PIDFILE ("" if none).
pid_of() {
	local p=""
	[[ -f "$1" ]] && p="$(tr -dc '0-9' <"$1" 2>/dev/null || true)"
	printf '%s' "$p"
}

# alive PID: the process exists and is not a zombie (our daemons are reparented to PID 1, which
# may take a while to reap them).
alive() {
	local st
	kill -0 "$1" 2>/dev/null || return 1
	st="$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$1/status" 2>/dev/null || true)"
	[[ -n "$st" && "$st" != Z && "$st" != X ]]
}

# ours PIDFILE PATTERN: true when PIDFILE names a live process whose command line contains
# PATTERN (guards against a stale pid file whose pid was reused by something else).
ours() {
	local pid cmd
	pid="$(pid_of "$1")"
	[[ -n "$pid" ]] || return 1
	alive "$pid" || return 1
	cmd="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
	[[ "$cmd" == *"$2"* ]]
}

# wait_for SECONDS CHECK...: poll CHECK every 0.2 s until it succeeds; false on timeout.
wait_for() {
	local secs="$1"
	shift
	local deadline=$((SECONDS + secs))
	while ((SECONDS < deadline)); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.2
	done
	"$@" >/dev/null 2>&1
}

# wait_alive SECONDS PID CHECK...: like wait_for, but gives up at once (status 2) when process
# PID has exited.
wait_alive() {
	local secs="$1" pid="$2"
	shift 2
	local deadline=$((SECONDS + secs))
	until "$@" >/dev/null 2>&1; do
		alive "$pid" || return 2
		((SECONDS < deadline)) || return 1
		sleep 0.2
	done
}

# stop_pid NAME PIDFILE PATTERN SIGNAL GRACE: signal our process, wait GRACE s, then SIGKILL.
stop_pid() {
	local name="$1" pidfile="$2" pattern="$3" sig="$4" grace="$5" pid i
	if ! ours "$pidfile" "$pattern"; then
		rm -f "$pidfile"
		return 0
	fi
	pid="$(pid_of "$pidfile")"
	say "stopping $name (pid $pid)"
	kill "-$sig" "$pid" 2>/dev/null || true
	for ((i = 0; i < grace * 5; i++)); do
		alive "$pid" || break
		sleep 0.2
	done
	if alive "$pid"; then
		warn "$name (pid $pid) still running after ${grace}s: SIGKILL"
		kill -KILL "$pid" 2>/dev/null || true
		sleep 0.2
	fi
	rm -f "$pidfile"
}

tcp_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# spawn PIDFILE LOGFILE CMD...: run CMD in its own session, detached from this shell, output
# appended to LOGFILE, and record its pid. With no job control, setsid execs in place, so $!
# is the daemon's own pid.
spawn() {
	local pidfile="$1" logfile="$2"
	shift 2
	(cd "$ROOT" && exec setsid nohup "$@" </dev/null >>"$logfile" 2>&1) &
	echo "$!" >"$pidfile"
}

# ---------------------------------------------------------------------------------------------
# deps

cmd_deps() {
	local missing=() p
	for p in "${DEB_PACKAGES[@]}"; do
		if [[ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)" != "installed" ]]; then
			missing+=("$p")
		fi
	done
	if ((${#missing[@]})); then
		say "installing Debian packages: ${missing[*]}"
		local sudo=""
		[[ "$(id -u)" == 0 ]] || sudo="sudo"
		export DEBIAN_FRONTEND=noninteractive
		$sudo apt-get update -q
		$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
			-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${missing[@]}"
	fi
	for p in redis-server redis-cli mariadbd mariadb mariadb-install-db mariadb-admin nats-server nginx envsubst wrk curl; do
		command -v "$p" >/dev/null 2>&1 || die "'$p' still missing after installing packages"
	done
	local go="${GO:-go}"
	command -v "$go" >/dev/null 2>&1 || die "go not found (expected /usr/local/go/bin/go)"
	# Modules: only when go.mod/go.sum changed since the last download (go build fetches
	# anything missing anyway).
	mkdir -p "$VAR"
	local stamp="$VAR/.gomod-downloaded"
	if [[ ! -f "$stamp" || "$ROOT/go.mod" -nt "$stamp" || ( -f "$ROOT/go.sum" && "$ROOT/go.sum" -nt "$stamp" ) ]]; then
		say "go mod download"
		(cd "$ROOT" && "$go" mod download)
		touch "$stamp"
	fi
}

# ---------------------------------------------------------------------------------------------
# Redis

redis_pidfile() { printf '%s/redis-%s.pid' "$RUN" "$1"; }
redis_ping() { [[ "$(redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null)" == PONG ]]; }
cluster_field() {
	redis-cli -h 127.0.0.1 -p "$1" cluster info 2>/dev/null | tr -d '\r' | sed -n "s/^$2://p"
}
cluster_ok() { [[ "$(cluster_field "$1" cluster_state)" == ok ]]; }
cluster_all_ok() {
	local p
	for p in "${CLUSTER_PORTS[@]}"; do cluster_ok "$p" || return 1; done
}

# redis_start PORT [extra redis-server args...]
redis_start() {
	local port="$1"
	shift
	local dir="$VAR/redis/$port" pidfile logfile
	pidfile="$(redis_pidfile "$port")"
	logfile="$LOG/redis-$port.log"
	if redis_ping "$port"; then
		ours "$pidfile" "redis-server" || say "note: 127.0.0.1:$port already answers but not from our pid file: reusing it"
		return 0
	fi
	mkdirs "$dir"
	say "starting redis on 127.0.0.1:$port"
	redis-server --port "$port" --bind 127.0.0.1 --protected-mode yes \
		--daemonize yes --pidfile "$pidfile" --logfile "$logfile" --dir "$dir" \
		--appendonly yes --appendfsync everysec --save "" \
		--enable-debug-command local "$@" ||
		die "redis-server on port $port failed to start" "$logfile"
}

redis_wait() {
	local port="$1"
	wait_for "$TIMEOUT" redis_ping "$port" || die "redis on 127.0.0.1:$port did not answer PING within ${TIMEOUT}s" "$LOG/redis-$port.log"
}

redis_up() {
	redis_start "$REDIS_PORT"
	redis_wait "$REDIS_PORT"
}

cluster_up() {
	local p
	for p in "${CLUSTER_PORTS[@]}"; do
		redis_start "$p" --cluster-enabled yes --cluster-config-file "$VAR/redis/$p/nodes.conf" \
			--cluster-node-timeout 5000
	done
	for p in "${CLUSTER_PORTS[@]}"; do redis_wait "$p"; done
	cluster_all_ok && return 0

	# A cluster created before (nodes.conf kept in var/) converges by itself after a restart:
	# only create it when no slot is assigned anywhere yet.
	local assigned=0 n
	for p in "${CLUSTER_PORTS[@]}"; do
		n="$(cluster_field "$p" cluster_slots_assigned)"
		assigned=$((assigned + ${n:-0}))
	done
	if ((assigned == 0)); then
		say "creating redis cluster on ${CLUSTER_PORTS[*]}"
		local addrs=()
		for p in "${CLUSTER_PORTS[@]}"; do addrs+=("127.0.0.1:$p"); done
		redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes \
			>>"$LOG/redis-cluster-create.log" 2>&1 ||
			die "redis-cli --cluster create failed" "$LOG/redis-cluster-create.log"
	fi
	wait_for "$TIMEOUT" cluster_all_ok || {
		for p in "${CLUSTER_PORTS[@]}"; do warn "127.0.0.1:$p cluster_state=$(cluster_field "$p" cluster_state) slots_assigned=$(cluster_field "$p" cluster_slots_assigned) known_nodes=$(cluster_field "$p" cluster_known_nodes)"; done
		die "redis cluster not cluster_state:ok within ${TIMEOUT}s (a broken var/redis state can be cleared with 'scripts/stack.sh reset')" "$LOG/redis-${CLUSTER_PORTS[0]}.log"
	}
}

redis_down() {
	local port="$1" pidfile pid i
	pidfile="$(redis_pidfile "$port")"
	if ! ours "$pidfile" "redis-server"; then
		rm -f "$pidfile"
		return 0
	fi
	pid="$(pid_of "$pidfile")"
	say "stopping redis 127.0.0.1:$port (pid $pid)"
	# Plain SHUTDOWN: flushes and fsyncs the AOF (no RDB: save "").
	if [[ "$(redis-cli -h 127.0.0.1 -p "$port" info server 2>/dev/null | tr -d '\r' | sed -n 's/^process_id://p')" == "$pid" ]]; then
		redis-cli -h 127.0.0.1 -p "$port" shutdown >/dev/null 2>&1 || true
	else
		kill -TERM "$pid" 2>/dev/null || true
	fi
	for ((i = 0; i < 75; i++)); do
		alive "$pid" || break
		sleep 0.2
	done
	if alive "$pid"; then
		warn "redis $port (pid $pid) still running after 15s: SIGKILL"
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -f "$pidfile"
}

# ---------------------------------------------------------------------------------------------
# NATS

NATS_PID="$RUN/nats.pid"
nats_ok() { [[ "$(curl -fsS --max-time 2 "http://127.0.0.1:$NATS_MON/healthz" 2>/dev/null)" == *'"ok"'* ]]; }

nats_up() {
	if nats_ok; then
		ours "$NATS_PID" nats-server || say "note: NATS monitor 127.0.0.1:$NATS_MON already answers but not from our pid file: reusing it"
		return 0
	fi
	if ours "$NATS_PID" nats-server; then
		say "nats-server (pid $(pid_of "$NATS_PID")) running but not healthy yet: waiting"
	else
		mkdirs "$VAR/nats"
		say "starting nats-server (JetStream) on 127.0.0.1:$NATS_PORT, monitor $NATS_MON"
		spawn "$NATS_PID" "$LOG/nats.out" nats-server -a 127.0.0.1 -p "$NATS_PORT" -m "$NATS_MON" \
			-n flashgate-local -js -sd "$VAR/nats" -P "$NATS_PID" -l "$LOG/nats.log"
	fi
	local rc=0
	wait_alive "$TIMEOUT" "$(pid_of "$NATS_PID")" nats_ok || rc=$?
	if ((rc)); then
		[[ -s "$LOG/nats.out" ]] && tail -n 20 "$LOG/nats.out" >&2
		((rc == 2)) && die "nats-server exited during start-up" "$LOG/nats.log"
		die "NATS did not report healthy on http://127.0.0.1:$NATS_MON/healthz within ${TIMEOUT}s" "$LOG/nats.log"
	fi
}

nats_down() { stop_pid nats "$NATS_PID" nats-server TERM 15; }

# ---------------------------------------------------------------------------------------------
# MariaDB

mysql_cli() { mariadb --no-defaults -h127.0.0.1 -P"$MYSQL_PORT" -uroot --connect-timeout=2 "$@"; }
mysql_ok() { mysql_cli -e 'select 1' >/dev/null 2>&1; }

mysql_up() {
	if ! mysql_ok; then
		if ours "$MYSQL_PID" mariadbd; then
			say "mariadbd (pid $(pid_of "$MYSQL_PID")) running but not answering yet: waiting"
		else
			mkdirs "$VAR/mysql" "$VAR/mysql/tmp"
			local userarg=()
			[[ "$(id -u)" == 0 ]] && userarg=(--user=root)
			if [[ ! -d "$MYSQL_DATA/mysql" ]]; then
				say "initialising MariaDB data directory $MYSQL_DATA"
				rm -rf "$MYSQL_DATA"
				mkdir -p "$MYSQL_DATA"
				mariadb-install-db --no-defaults --datadir="$MYSQL_DATA" "${userarg[@]}" \
					--auth-root-authentication-method=normal --skip-test-db --skip-name-resolve \
					>"$LOG/mariadb-install-db.log" 2>&1 || {
					rm -rf "$MYSQL_DATA"
					die "mariadb-install-db failed" "$LOG/mariadb-install-db.log"
				}
			fi
			say "starting mariadbd on 127.0.0.1:$MYSQL_PORT"
			spawn "$MYSQL_PID" "$LOG/mariadb.out" mariadbd --no-defaults "${userarg[@]}" \
				--datadir="$MYSQL_DATA" --tmpdir="$VAR/mysql/tmp" \
				--socket="$MYSQL_SOCK" --pid-file="$MYSQL_PID" \
				--port="$MYSQL_PORT" --bind-address=127.0.0.1 --skip-name-resolve \
				--log-error="$LOG/mariadb.log" \
				--innodb-buffer-pool-size=256M --max-connections=500 \
				--character-set-server=utf8mb4 --collation-server=utf8mb4_unicode_ci
		fi
		local rc=0
		wait_alive "$TIMEOUT" "$(pid_of "$MYSQL_PID")" mysql_ok || rc=$?
		if ((rc)); then
			[[ -s "$LOG/mariadb.out" ]] && tail -n 20 "$LOG/mariadb.out" >&2
			((rc == 2)) && die "mariadbd exited during start-up" "$LOG/mariadb.log"
			die "MariaDB did not answer on 127.0.0.1:$MYSQL_PORT within ${TIMEOUT}s" "$LOG/mariadb.log"
		fi
	elif ! ours "$MYSQL_PID" mariadbd; then
		say "note: 127.0.0.1:$MYSQL_PORT already answers but not from our pid file: reusing it"
	fi
	mysql_cli -e 'CREATE DATABASE IF NOT EXISTS flashgate CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci' ||
		die "cannot create database flashgate on 127.0.0.1:$MYSQL_PORT" "$LOG/mariadb.log"
}

mysql_down() {
	# SIGTERM is mariadbd's normal shutdown (same as mariadb-admin shutdown); InnoDB may take
	# a while to flush, so give it longer than the others.
	stop_pid mariadb "$MYSQL_PID" mariadbd TERM 60
}

# ---------------------------------------------------------------------------------------------
# nginx
#
# nginx/nginx.conf is a template: nginx_render fills in the ${NGINX_*} names (and only those)
# with envsubst and writes var/nginx/nginx.conf, which is what nginx runs. The per-IP limits and
# the gateways can be set from the environment:
#   NGINX_RATE=20 NGINX_BURST=40 NGINX_CONN=32 NGINX_READ_TIMEOUT=5s
#   NGINX_GATEWAYS="127.0.0.1:8080 10.0.0.2:8080"   (space or comma separated)

NGINX_PID="$RUN/nginx.pid"
# shellcheck disable=SC2016 # literal ${...}: the names envsubst may substitute
NGINX_VARS='${NGINX_LISTEN} ${NGINX_UPSTREAM_SERVERS} ${NGINX_RATE} ${NGINX_BURST} ${NGINX_CONN} ${NGINX_READ_TIMEOUT} ${NGINX_HTML} ${NGINX_LOG_DIR} ${NGINX_PID} ${NGINX_RLIMIT_NOFILE} ${NGINX_WORKER_CONNECTIONS}'

# nginx_nofile: the open-file limit nginx's workers set themselves (worker_rlimit_nofile): our
# hard limit, at most 65535 (more buys nothing on one machine's ports).
nginx_nofile() {
	local hard
	hard="$(ulimit -Hn)"
	[[ "$hard" == unlimited ]] && hard=65535
	((hard > 65535)) && hard=65535
	echo "$hard"
}

# nginx_render OUT: render the template into OUT (atomically).
nginx_render() {
	local out="$1" rate="${NGINX_RATE:-20}" burst="${NGINX_BURST:-40}" conn="${NGINX_CONN:-32}"
	local rt="${NGINX_READ_TIMEOUT:-5s}" gws="${NGINX_GATEWAYS:-127.0.0.1:$GATEWAY_PORT}" servers="" gw
	local hostport='^[][A-Za-z0-9.:_-]+:[0-9]+$'
	need envsubst
	[[ "$rate" =~ ^[1-9][0-9]*$ ]] || die "NGINX_RATE must be a whole number of requests/s > 0, not '$rate'"
	[[ "$burst" =~ ^[0-9]+$ ]] || die "NGINX_BURST must be a whole number >= 0, not '$burst'"
	{ [[ "$conn" =~ ^[1-9][0-9]*$ ]] && ((conn <= 65535)); } || die "NGINX_CONN must be 1..65535, not '$conn'"
	[[ "$rt" =~ ^[1-9][0-9]*(ms|s|m)?$ ]] || die "NGINX_READ_TIMEOUT must be an nginx time such as 5s, not '$rt'"
	for gw in ${gws//,/ }; do
		[[ "$gw" =~ $hostport ]] || die "NGINX_GATEWAYS: '$gw' is not host:port"
		servers+="        server $gw max_fails=3 fail_timeout=5s;"$'\n'
	done
	[[ -n "$servers" ]] || die "NGINX_GATEWAYS is empty"
	# A proxied request holds two descriptors; 64 are left for listeners, logs and cache files.
	local nofile wconns
	nofile="$(nginx_nofile)"
	wconns=$(((nofile - 64) / 2))
	((wconns >= 256)) || die "the open-file hard limit ($nofile) is too low for nginx: raise ulimit -Hn"
	mkdir -p "$(dirname "$out")"
	NGINX_RLIMIT_NOFILE="$nofile" NGINX_WORKER_CONNECTIONS="$wconns" NGINX_LISTEN="127.0.0.1:$NGINX_PORT" NGINX_UPSTREAM_SERVERS="${servers%$'\n'}" \
		NGINX_RATE="$rate" NGINX_BURST="$burst" NGINX_CONN="$conn" NGINX_READ_TIMEOUT="$rt" \
		NGINX_HTML="$ROOT/nginx/html" NGINX_LOG_DIR="$LOG" NGINX_PID="$NGINX_PID" \
		envsubst "$NGINX_VARS" <"$NGINX_TEMPLATE" >"$out.tmp.$$" || die "cannot render $NGINX_TEMPLATE"
	sed -i "1i # GENERATED by scripts/stack.sh from nginx/nginx.conf: edit that file, not this one." "$out.tmp.$$"
	mv -f "$out.tmp.$$" "$out"
}

nginx_args() {
	local a=(-p "$NGINX_PREFIX" -c "$NGINX_CONF" -e "$LOG/nginx-error.log")
	# Workers run as the invoking user: the checkout may sit under a 0700 home directory that
	# "nobody" cannot read (the static page would then be a 403).
	# (worker_rlimit_nofile is in the rendered config: worker_connections is sized from it.)
	if [[ "$(id -u)" == 0 ]]; then
		a+=(-g "user root root;")
	fi
	printf '%s\n' "${a[@]}"
}
nginx_prep() {
	mkdirs "$VAR/nginx/tmp"
	nginx_render "$NGINX_CONF"
}
nginx_ok() { curl -sS -o /dev/null --max-time 2 "http://127.0.0.1:$NGINX_PORT/"; }

# nginx-conf [OUT]: render only (default var/nginx/nginx.conf) and print the file's path.
cmd_nginx_conf() {
	local out="${1:-$NGINX_CONF}"
	mkdirs
	nginx_render "$out"
	printf '%s\n' "$out"
}

cmd_nginx_test() {
	need nginx
	nginx_prep
	local args
	mapfile -t args < <(nginx_args)
	nginx "${args[@]}" -t
}

nginx_up() {
	need nginx curl
	local args
	if ours "$NGINX_PID" nginx; then
		say "nginx already running (pid $(pid_of "$NGINX_PID")); 'scripts/stack.sh nginx-reload' applies a changed config"
	else
		if tcp_open "$NGINX_PORT"; then
			die "127.0.0.1:$NGINX_PORT is already taken by a process that is not our nginx"
		fi
		nginx_prep
		mapfile -t args < <(nginx_args)
		nginx "${args[@]}" -t -q 2>>"$LOG/nginx-error.log" || die "nginx config test failed ($NGINX_CONF)" "$LOG/nginx-error.log"
		say "starting nginx on 127.0.0.1:$NGINX_PORT (per IP: ${NGINX_RATE:-20} r/s, burst ${NGINX_BURST:-40}, ${NGINX_CONN:-32} connections; gateways ${NGINX_GATEWAYS:-127.0.0.1:$GATEWAY_PORT})"
		(cd "$ROOT" && nginx "${args[@]}") || die "nginx failed to start" "$LOG/nginx-error.log"
	fi
	wait_for "$TIMEOUT" nginx_ok || die "nginx did not answer on 127.0.0.1:$NGINX_PORT within ${TIMEOUT}s" "$LOG/nginx-error.log"
}

# nginx-reload: re-render, test, and have the running nginx load it (workers finish their requests).
nginx_reload() {
	need nginx
	ours "$NGINX_PID" nginx || die "nginx is not running: 'scripts/stack.sh nginx-up' starts it"
	nginx_prep
	local args
	mapfile -t args < <(nginx_args)
	nginx "${args[@]}" -t -q 2>>"$LOG/nginx-error.log" || die "nginx config test failed ($NGINX_CONF): the running nginx keeps its config" "$LOG/nginx-error.log"
	nginx "${args[@]}" -s reload || die "nginx reload failed" "$LOG/nginx-error.log"
	say "nginx reloaded"
}

nginx_down() { stop_pid nginx "$NGINX_PID" nginx QUIT 15; }

# ---------------------------------------------------------------------------------------------
# app processes (bin/flashgate)

ready() { [[ "$(curl -sS -o /dev/null -w '%{http_code}' --max-time 2 "$1" 2>/dev/null)" == 200 ]]; }

# app_up NAME READYZ_URL
app_up() {
	local name="$1" url="$2" pidfile="$RUN/$1.pid" logfile="$LOG/$1.log"
	[[ -x "$BIN" ]] || die "$BIN not found: run 'make build' first"
	if ours "$pidfile" "$BIN $name"; then
		say "$name already running (pid $(pid_of "$pidfile"))"
	else
		say "starting $name: bin/flashgate $name --config $CONFIG"
		printf '\n==== %s start %s ====\n' "$name" "$(date -Is)" >>"$logfile"
		spawn "$pidfile" "$logfile" "$BIN" "$name" --config "$CONFIG"
	fi
	local pid deadline=$((SECONDS + TIMEOUT))
	pid="$(pid_of "$pidfile")"
	until ready "$url"; do
		alive "$pid" || { rm -f "$pidfile"; die "$name (pid $pid) exited before $url answered 200" "$logfile"; }
		((SECONDS < deadline)) || die "$name not ready: $url did not answer 200 within ${TIMEOUT}s (still running as pid $pid; 'scripts/stack.sh down' stops it)" "$logfile"
		sleep 0.2
	done
	say "$name ready ($url)"
}

app_down() { stop_pid "$1" "$RUN/$1.pid" "$BIN $1" TERM 15; }

# ---------------------------------------------------------------------------------------------
# commands

cmd_infra_up() {
	need redis-server redis-cli nats-server mariadbd mariadb mariadb-install-db curl
	mkdirs
	redis_up
	cluster_up
	nats_up
	mysql_up
	say "infra up: redis 127.0.0.1:$REDIS_PORT, cluster 127.0.0.1:${CLUSTER_PORTS[0]}-${CLUSTER_PORTS[-1]}, nats 127.0.0.1:$NATS_PORT (monitor $NATS_MON), mariadb 127.0.0.1:$MYSQL_PORT/flashgate"
}

cmd_up() {
	cmd_infra_up
	app_up backend "http://127.0.0.1:$BACKEND_ADMIN/readyz"
	app_up gateway "http://127.0.0.1:$GATEWAY_ADMIN/readyz"
	nginx_up
	say "up: nginx http://127.0.0.1:$NGINX_PORT -> gateway 127.0.0.1:$GATEWAY_PORT (admin $GATEWAY_ADMIN), backend admin 127.0.0.1:$BACKEND_ADMIN"
}

cmd_down() {
	nginx_down
	app_down gateway
	app_down backend
	nats_down
	mysql_down
	local p
	for p in "${CLUSTER_PORTS[@]}"; do redis_down "$p"; done
	redis_down "$REDIS_PORT"
	say "down"
}

# apps-down [nginx|gateway|backend ...]: stop those of our app processes (all three by default),
# nginx first, and leave the infra running.
cmd_apps_down() {
	local want=("$@") w
	((${#want[@]})) || want=(nginx gateway backend)
	for w in "${want[@]}"; do
		case "$w" in nginx | gateway | backend) ;; *) die "apps-down: unknown part '$w' (nginx, gateway, backend)" ;; esac
	done
	[[ " ${want[*]} " == *" nginx "* ]] && nginx_down
	[[ " ${want[*]} " == *" gateway "* ]] && app_down gateway
	[[ " ${want[*]} " == *" backend "* ]] && app_down backend
	say "apps down: ${want[*]} (infra left running)"
}

# part NAME DETAIL CHECK...: print "NAME up|down DETAIL" as CHECK succeeds.
part() {
	local name="$1" detail="$2" state=down
	shift 2
	if "$@" >/dev/null 2>&1; then state=up; fi
	printf '%-14s %-5s %s\n' "$name" "$state" "$detail"
}
nginx_ours_ok() { ours "$NGINX_PID" nginx && nginx_ok; }

cmd_status() {
	part redis "127.0.0.1:$REDIS_PORT" redis_ping "$REDIS_PORT"
	part redis-cluster "127.0.0.1:${CLUSTER_PORTS[0]}-${CLUSTER_PORTS[-1]}" cluster_all_ok
	part nats "127.0.0.1:$NATS_PORT (monitor $NATS_MON)" nats_ok
	part mariadb "127.0.0.1:$MYSQL_PORT" mysql_ok
	part backend "127.0.0.1:$BACKEND_ADMIN" ready "http://127.0.0.1:$BACKEND_ADMIN/readyz"
	part gateway "127.0.0.1:$GATEWAY_PORT (admin $GATEWAY_ADMIN)" ready "http://127.0.0.1:$GATEWAY_ADMIN/readyz"
	part nginx "127.0.0.1:$NGINX_PORT" nginx_ours_ok
}

cmd_reset() {
	cmd_down
	[[ -n "$VAR" && "$VAR" == "$ROOT/var" && -d "$VAR" ]] && rm -rf -- "$VAR"
	rm -f "/tmp/flashgate-mysqld-$(printf '%s' "$ROOT" | md5sum | cut -c1-12).sock"
	say "reset: removed $VAR"
}

usage() { sed -n '2,26s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }

case "${1:-}" in
deps) cmd_deps ;;
infra-up) cmd_infra_up ;;
up) cmd_up ;;
nginx-up) nginx_up ;;
nginx-down) nginx_down ;;
nginx-test) cmd_nginx_test ;;
nginx-conf) cmd_nginx_conf "${2:-}" ;;
nginx-reload) nginx_reload ;;
apps-down)
	shift
	cmd_apps_down "$@"
	;;
down) cmd_down ;;
status) cmd_status ;;
reset) cmd_reset ;;
-h | --help | help) usage ;;
*)
	usage >&2
	exit 2
	;;
esac
