#!/usr/bin/env bash
# flashgate local stack (docs/design.md §10).
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
#
# Shapes (docs/recovery.md "The local stack's shapes"), given to up/infra-up/status (remembered in
# var/run/stack.shape, so a later status or down without them sees the same stack):
#   REDIS=single|cluster   the apps' Redis: the standalone one (default) or the Cluster, whose three
#                          masters (17001-17003) always run with a replica each (17004-17006)
#   NATS=single|cluster    one nats-server (default) or a 3-node JetStream cluster (14222-14224,
#                          monitors 18222-18224, routes 16248-16250): streams at R3, every app
#                          given all three seeds
#   GATEWAYS=N BACKENDS=N  1..5 each (default 1): the first gateway keeps 8080/8081, the k-th
#                          (k >= 2) listens on 8100+2k / 8101+2k; the first backend keeps 8082,
#                          the k-th 8110+k; nginx's upstream is every gateway
#   e.g. REDIS=cluster NATS=cluster GATEWAYS=3 BACKENDS=2 scripts/stack.sh up
#   scripts/stack.sh nginx-test  render nginx/nginx.conf into var/nginx/nginx.conf and nginx -t it
#   scripts/stack.sh nginx-conf [OUT]  only render it (into OUT) and print the path
#   scripts/stack.sh sql [ARGS]  the mariadb client, as root, on the stack's flashgate database
#                                (e.g. sql -e 'SHOW TRIGGERS'): for drills and debugging only
#   scripts/stack.sh auth-conf   only generate the secrets and render var/secrets/redis-users.acl
#                                and var/secrets/nats.conf (the tests start servers with them)
#
# Every client authenticates (docs/credentials.md): infra-up generates the secrets into
# var/secrets/ (kept across restarts), a Redis ACL user, a NATS user and a MariaDB user per role,
# and writes the operator's set to var/secrets.env (`. var/secrets.env` and the CLI and tests
# log in). The gateway and backend it starts get their own role's credentials only.
#
# Environment: STACK_TIMEOUT (seconds to wait for each part, default 30), STACK_CONFIG (config
# file for the apps, default configs/flashgate.yaml), STACK_PORT_OFFSET (added to every port of
# the stack, default 0: a second stack beside the first, e.g. 5000 for 21379, 22001-22003,
# 19222/23222, 18306, 13000, 13080-13082; keep the Cluster's bus ports, +10000, below the
# kernel's ephemeral ports (32768 and up), where a client connection may hold one), STACK_VAR
# (the data directory, default var/ of the checkout),
# FLASHGATE_JWT_SECRET, FLASHGATE_ADMIN_TOKEN, FLASHGATE_PAYMENTS_SECRET, FLASHGATE_REDIS_PASSWORD, FLASHGATE_NATS_PASSWORD
# (given at infra-up/up, they replace the generated ones: the operator's passwords),
# GO (go command), NGINX_RATE/NGINX_BURST/NGINX_CONN/NGINX_READ_TIMEOUT/NGINX_GATEWAYS (nginx's
# per-IP limits and upstream, see the nginx section), everything else is passed through to the
# app processes unchanged (but for their logins, which are their role's).
set -euo pipefail
# Everything the stack writes (Redis's append-only files and dumps, MariaDB's and NATS's data, the
# logs, the secrets) is its operator's alone: files 0600, directories 0700.
umask 077

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VAR="${STACK_VAR:-$ROOT/var}"
RUN="$VAR/run"
LOG="$VAR/log"
BIN="$ROOT/bin/flashgate"
CONFIG="${STACK_CONFIG:-configs/flashgate.yaml}"
TIMEOUT="${STACK_TIMEOUT:-30}"
# shellcheck source=scripts/goruntime.sh
. "$ROOT/scripts/goruntime.sh"

OFFSET="${STACK_PORT_OFFSET:-0}"
[[ "$OFFSET" =~ ^[0-9]+$ ]] && ((OFFSET <= 40000)) || {
	printf 'stack: STACK_PORT_OFFSET must be a whole number 0..40000, not %s\n' "$OFFSET" >&2
	exit 2
}
REDIS_PORT=$((16379 + OFFSET))
CLUSTER_PORTS=($((17001 + OFFSET)) $((17002 + OFFSET)) $((17003 + OFFSET)))
# A replica per master (Cluster bus ports +10000: 27004-27006, below 32768 up to an offset of 5000).
REPLICA_PORTS=($((17004 + OFFSET)) $((17005 + OFFSET)) $((17006 + OFFSET)))
NATS_PORT=$((14222 + OFFSET))
NATS_MON=$((18222 + OFFSET))
# NATS=cluster: node i (1..3) on NATS_PORT+i-1, monitor NATS_MON+i-1, routes NATS_ROUTE+i-1.
NATS_ROUTE=$((16248 + OFFSET))
MYSQL_PORT=$((13306 + OFFSET))
NGINX_PORT=$((8000 + OFFSET))
GATEWAY_PORT=$((8080 + OFFSET))
GATEWAY_ADMIN=$((8081 + OFFSET))
BACKEND_ADMIN=$((8082 + OFFSET))

NGINX_TEMPLATE="$ROOT/nginx/nginx.conf"
NGINX_PREFIX="$VAR/nginx/"
NGINX_CONF="$VAR/nginx/nginx.conf"
# The gateways' sold-out marks, which nginx answers from (docs/gateway.md): gateway.edge_marks_dir.
NGINX_MARKS_DIR="$VAR/nginx/marks"

MYSQL_DATA="$VAR/mysql/data"
MYSQL_PID="$RUN/mariadb.pid"
MYSQL_SOCK="$RUN/mysqld.sock"
# A unix socket path is limited to 107 bytes; fall back to /tmp for a deeply nested checkout.
if (( ${#MYSQL_SOCK} > 100 )); then
	MYSQL_SOCK="/tmp/flashgate-mysqld-$(printf '%s' "$ROOT" | md5sum | cut -c1-12).sock"
fi

# ---------------------------------------------------------------------------------------------
# shape: REDIS, NATS, GATEWAYS, BACKENDS (see the top). Given ones win; otherwise those the stack
# was last started with (var/run/stack.shape); otherwise the defaults, today's single stack.

SHAPE_FILE="$VAR/run/stack.shape"
shape_load() {
	local r="" n="" g="" b=""
	if [[ -f "$SHAPE_FILE" ]]; then
		r="$(sed -n 's/^REDIS=//p' "$SHAPE_FILE")" n="$(sed -n 's/^NATS=//p' "$SHAPE_FILE")"
		g="$(sed -n 's/^GATEWAYS=//p' "$SHAPE_FILE")" b="$(sed -n 's/^BACKENDS=//p' "$SHAPE_FILE")"
	fi
	REDIS_MODE="${REDIS:-${r:-single}}" NATS_MODE="${NATS:-${n:-single}}"
	N_GATEWAYS="${GATEWAYS:-${g:-1}}" N_BACKENDS="${BACKENDS:-${b:-1}}"
	[[ "$REDIS_MODE" == single || "$REDIS_MODE" == cluster ]] || { printf 'stack: REDIS must be single or cluster, not %s\n' "$REDIS_MODE" >&2; exit 2; }
	[[ "$NATS_MODE" == single || "$NATS_MODE" == cluster ]] || { printf 'stack: NATS must be single or cluster, not %s\n' "$NATS_MODE" >&2; exit 2; }
	[[ "$N_GATEWAYS" =~ ^[1-5]$ ]] || { printf 'stack: GATEWAYS must be 1..5, not %s\n' "$N_GATEWAYS" >&2; exit 2; }
	[[ "$N_BACKENDS" =~ ^[1-5]$ ]] || { printf 'stack: BACKENDS must be 1..5, not %s\n' "$N_BACKENDS" >&2; exit 2; }
}
shape_save() {
	mkdir -p "$VAR/run"
	printf 'REDIS=%s\nNATS=%s\nGATEWAYS=%s\nBACKENDS=%s\n' "$REDIS_MODE" "$NATS_MODE" "$N_GATEWAYS" "$N_BACKENDS" >"$SHAPE_FILE"
}
shape_load

# App instances: "gateway" and "backend" are the first (today's names, pid and log files),
# "gateway-2", "backend-3"... the others.
app_name() { if (($2 == 1)); then printf '%s' "$1"; else printf '%s-%s' "$1" "$2"; fi; }
gw_port() { if (($1 == 1)); then echo "$GATEWAY_PORT"; else echo $((8100 + 2 * $1 + OFFSET)); fi; }
gw_admin() { if (($1 == 1)); then echo "$GATEWAY_ADMIN"; else echo $((8101 + 2 * $1 + OFFSET)); fi; }
be_admin() { if (($1 == 1)); then echo "$BACKEND_ADMIN"; else echo $((8110 + $1 + OFFSET)); fi; }

# The apps' Redis and NATS addresses for the shape.
apps_redis_addrs() {
	local a=() p
	if [[ "$REDIS_MODE" == cluster ]]; then
		for p in "${CLUSTER_PORTS[@]}" "${REPLICA_PORTS[@]}"; do a+=("127.0.0.1:$p"); done
	else
		a=("127.0.0.1:$REDIS_PORT")
	fi
	(IFS=,; echo "${a[*]}")
}
apps_nats_url() {
	local a=() i
	if [[ "$NATS_MODE" == cluster ]]; then
		for i in 1 2 3; do a+=("nats://127.0.0.1:$((NATS_PORT + i - 1))"); done
	else
		a=("nats://127.0.0.1:$NATS_PORT")
	fi
	(IFS=,; echo "${a[*]}")
}
# The stack's shape differs from the defaults (the apps are then told where things are).
shaped() { [[ "$REDIS_MODE" != single || "$NATS_MODE" != single || $N_GATEWAYS != 1 || $N_BACKENDS != 1 ]]; }

# prometheus brings promtool (the alert rules' tests), chromium the live view's browser test, spin
# the protocol's model checker (make verify)
# (docs/observability.md).
DEB_PACKAGES=(redis-server redis-tools mariadb-server mariadb-client nats-server nginx gettext-base wrk curl gcc libc6-dev prometheus chromium spin)

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

mkdirs() {
	mkdir -p "$RUN" "$LOG" "$@"
	# A var/ made before the umask above (or by another tool) is closed too: what is under it is
	# then out of other users' reach whatever its own mode.
	chmod 700 "$VAR"
}

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
	for p in redis-server redis-cli mariadbd mariadb mariadb-install-db mariadb-admin nats-server nginx envsubst wrk curl promtool chromium spin; do
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
# credentials (docs/credentials.md)
#
# One user per role on each server: admin (the operator, the CLI, migrations by hand and the
# tests), gateway, backend; Redis also has a replication user for replicas. The secrets are
# generated once into var/secrets/generated.env (0600) and kept, so a restart keeps them;
# var/secrets.env is the operator's set as FLASHGATE_* variables.

SECRETS_DIR="$VAR/secrets"
SECRETS_STATE="$SECRETS_DIR/generated.env"
SECRETS_ENV="$VAR/secrets.env"
REDIS_ACL="$SECRETS_DIR/redis-users.acl"
REDIS_AUTH_CONF="$SECRETS_DIR/redis-auth.conf"
NATS_CONF="$SECRETS_DIR/nats.conf"

U_ADMIN=flashgate_admin
U_GATEWAY=flashgate_gateway
U_BACKEND=flashgate_backend
U_REPLICA=flashgate_replica
U_ROUTE=flashgate_route
U_CONSUMER=flashgate_consumer
U_MIGRATOR=flashgate_migrator

# roles_render KIND [ARGS...]: the users and permissions of roles/roles.go for one server kind
# (redis-acl, nats-users, mysql-sql), with this stack's passwords (flashgate roles render).
roles_render() {
	local bin=("$BIN")
	# A binary older than the roles it would render (or none yet): from the sources.
	if [[ ! -x "$BIN" || -n "$(find "$ROOT/roles" "$ROOT/config" -name '*.go' -newer "$BIN" 2>/dev/null | head -n1)" ]]; then
		bin=(go run "$ROOT/cmd/flashgate")
	fi
	(cd "$ROOT" && "${bin[@]}" roles render "$@" --config "$ROOT/configs/flashgate.yaml" --secrets "$SECRETS_STATE")
}

# The stream and subjects of configs/flashgate.yaml (nats.*): the NATS permissions name them.
NATS_STREAM=FLASHGATE_ORDERS
NATS_ORDERS=flashgate.orders
NATS_EVENTS=flashgate.events.sale
NATS_CMD=flashgate.cmd.orders
NATS_ORDER_EVENTS_STREAM=FLASHGATE_ORDER_EVENTS
NATS_ORDER_EVENTS=flashgate.order_events

SECRET_NAMES=(JWT_SECRET ADMIN_TOKEN PAYMENTS_SECRET REDIS_ADMIN REDIS_GATEWAY REDIS_BACKEND REDIS_REPLICA REDIS_DEFAULT
	NATS_ADMIN NATS_GATEWAY NATS_BACKEND NATS_ROUTE NATS_CONSUMER MYSQL_ROOT MYSQL_ADMIN MYSQL_BACKEND MYSQL_MIGRATOR)

gen_secret() { od -An -N24 -tx1 /dev/urandom | tr -d ' \n'; }
sha256() { printf '%s' "$1" | sha256sum | cut -c1-64; }

# override NAME VALUE LABEL: a value given in the environment replaces a generated one.
override() {
	local name="$1" value="$2" label="$3" v="S_$1"
	[[ -n "$value" && "$value" != "${!v}" ]] || return 1
	if [[ "$name" != JWT_SECRET && "$name" != ADMIN_TOKEN && "$name" != PAYMENTS_SECRET && ! "$value" =~ ^[A-Za-z0-9._~+/=-]{16,}$ ]]; then
		die "$label: 16 or more of A-Z a-z 0-9 . _ ~ + / = - (it goes into ACL, NATS and DSN syntax)"
	fi
	printf -v "$v" '%s' "$value"
}

secrets_load() {
	[[ -n "${SECRETS_LOADED:-}" ]] && return 0
	(umask 077 && mkdir -p "$SECRETS_DIR")
	chmod 700 "$SECRETS_DIR"
	local n v changed=0
	# shellcheck disable=SC1090 # generated by this script
	[[ -f "$SECRETS_STATE" ]] && source "$SECRETS_STATE"
	for n in "${SECRET_NAMES[@]}"; do
		v="S_$n"
		if [[ -z "${!v:-}" ]]; then
			printf -v "$v" '%s' "$(gen_secret)"
			changed=1
		fi
	done
	override JWT_SECRET "${FLASHGATE_JWT_SECRET:-}" FLASHGATE_JWT_SECRET && changed=1
	override ADMIN_TOKEN "${FLASHGATE_ADMIN_TOKEN:-}" FLASHGATE_ADMIN_TOKEN && changed=1
	override PAYMENTS_SECRET "${FLASHGATE_PAYMENTS_SECRET:-}" FLASHGATE_PAYMENTS_SECRET && changed=1
	override REDIS_ADMIN "${FLASHGATE_REDIS_PASSWORD:-}" FLASHGATE_REDIS_PASSWORD && changed=1
	override NATS_ADMIN "${FLASHGATE_NATS_PASSWORD:-}" FLASHGATE_NATS_PASSWORD && changed=1
	if ((changed)) || [[ ! -f "$SECRETS_STATE" ]]; then
		(
			umask 077
			{
				echo "# GENERATED by scripts/stack.sh: the local stack's secrets, every role's. Keep it private."
				for n in "${SECRET_NAMES[@]}"; do
					v="S_$n"
					printf 'S_%s=%q\n' "$n" "${!v}"
				done
			} >"$SECRETS_STATE.tmp.$$"
			mv -f "$SECRETS_STATE.tmp.$$" "$SECRETS_STATE"
		)
	fi
	SECRETS_LOADED=1
}

mysql_dsn() {
	if [[ -z "$1" ]]; then printf 'tcp(127.0.0.1:%s)/flashgate' "$MYSQL_PORT"; else printf '%s:%s@tcp(127.0.0.1:%s)/flashgate' "$1" "$2" "$MYSQL_PORT"; fi
}

# role_env ROLE [K]: the FLASHGATE_* variables of a role's credentials (one per line), for the
# gateway and backend processes (K: which one of them, default 1); "admin" is the operator's set.
role_env() {
	local k="${2:-1}"
	local ru rp nu np mu mp inbox=""
	case "$1" in
	admin) ru=$U_ADMIN rp=$S_REDIS_ADMIN nu=$U_ADMIN np=$S_NATS_ADMIN mu=$U_ADMIN mp=$S_MYSQL_ADMIN ;;
	# The gateway has no MySQL login (roles/roles.go); its DSN names no user.
	gateway) ru=$U_GATEWAY rp=$S_REDIS_GATEWAY nu=$U_GATEWAY np=$S_NATS_GATEWAY mu="" mp="" inbox=_INBOX_gateway ;;
	backend) ru=$U_BACKEND rp=$S_REDIS_BACKEND nu=$U_BACKEND np=$S_NATS_BACKEND mu=$U_BACKEND mp=$S_MYSQL_BACKEND inbox=_INBOX_backend ;;
	# flashgate migrate up, before the backends start: the one role with DDL.
	migrator) ru=$U_BACKEND rp=$S_REDIS_BACKEND nu=$U_BACKEND np=$S_NATS_BACKEND mu=$U_MIGRATOR mp=$S_MYSQL_MIGRATOR ;;
	*) die "role_env: unknown role $1" ;;
	esac
	# The buyers' token secret: the gateways verify with it, the operator mints with it (flashgate
	# token); a backend verifies no token and mints none, so it is not given it (docs/security.md).
	if [[ "$1" != backend ]]; then printf '%s\n' "FLASHGATE_JWT_SECRET=$S_JWT_SECRET"; fi
	printf '%s\n' "FLASHGATE_ADMIN_TOKEN=$S_ADMIN_TOKEN" \
		"FLASHGATE_REDIS_USERNAME=$ru" "FLASHGATE_REDIS_PASSWORD=$rp" \
		"FLASHGATE_NATS_USER=$nu" "FLASHGATE_NATS_PASSWORD=$np" "FLASHGATE_NATS_INBOX_PREFIX=$inbox" \
		"FLASHGATE_MYSQL_DSN=$(mysql_dsn "$mu" "$mp")"
	# The payment service's secret (docs/payments.md): the gateways verify with it, the operator
	# signs with it (flashgate payment sign); a backend has no use for it.
	if [[ "$1" != backend ]]; then printf '%s\n' "FLASHGATE_PAYMENTS_SECRET=$S_PAYMENTS_SECRET"; fi
	# The gateways run beside the stack's nginx: they keep their sold-out marks where it looks.
	if [[ "$1" == gateway ]]; then printf '%s\n' "FLASHGATE_GATEWAY_EDGE_MARKS_DIR=$NGINX_MARKS_DIR"; fi
	# The backend has no DDL: the stack migrates as the migrator before starting it (app_up).
	# Where this stack is, when it is not on the default ports or not of the default shape (the
	# config file names those).
	if ((OFFSET)) || shaped; then
		printf '%s\n' "FLASHGATE_REDIS_ADDRS=$(apps_redis_addrs)" "FLASHGATE_NATS_URL=$(apps_nats_url)" \
			"FLASHGATE_ADMIN_URL=http://127.0.0.1:$BACKEND_ADMIN"
		# The apps' own listeners (not the operator's business: tests source the operator's set).
		[[ "$1" == admin ]] || printf '%s\n' "FLASHGATE_GATEWAY_LISTEN=127.0.0.1:$(gw_port "$k")" \
			"FLASHGATE_GATEWAY_ADMIN_LISTEN=127.0.0.1:$(gw_admin "$k")" "FLASHGATE_BACKEND_ADMIN_LISTEN=127.0.0.1:$(be_admin "$k")"
	fi
	# Three NATS nodes keep three copies of each stream (the backend creates them); one cannot.
	if [[ "$NATS_MODE" == cluster ]]; then
		printf '%s\n' "FLASHGATE_NATS_REPLICAS=3"
	elif ((OFFSET)) || shaped; then
		printf '%s\n' "FLASHGATE_NATS_REPLICAS=1"
	fi
}

# squote VALUE: VALUE for the inside of single quotes (' becomes '\'').
squote() { printf '%s' "${1//\'/\'\\\'\'}"; }

write_secrets_env() {
	local kv cl=() p
	for p in "${CLUSTER_PORTS[@]}"; do cl+=("127.0.0.1:$p"); done
	(
		umask 077
		{
			echo "# GENERATED by scripts/stack.sh: the operator's credentials of the local stack."
			echo "# '. var/secrets.env' and the CLI, the tests and redis-cli/nats/mariadb clients log in."
			while IFS= read -r kv; do printf "export %s='%s'\n" "${kv%%=*}" "$(squote "${kv#*=}")"; done < <(role_env admin)
			if ((!OFFSET)) && ! shaped; then
				printf 'export FLASHGATE_REDIS_ADDRS=127.0.0.1:%s\nexport FLASHGATE_NATS_URL=nats://127.0.0.1:%s\n' "$REDIS_PORT" "$NATS_PORT"
			fi
			printf 'export FLASHGATE_REDIS_CLUSTER_ADDRS=%s\n' "$(IFS=,; echo "${cl[*]}")"
			# The public API through nginx (the README's curl examples use it).
			printf 'export FLASHGATE_PUBLIC_URL=http://127.0.0.1:%s\n' "$NGINX_PORT"
			# redis-cli reads its password here (with --user $FLASHGATE_REDIS_USERNAME).
			printf "export REDISCLI_AUTH='%s'\n" "$S_REDIS_ADMIN"
		} >"$SECRETS_ENV.tmp.$$"
		mv -f "$SECRETS_ENV.tmp.$$" "$SECRETS_ENV"
	)
}

# Redis ACL: roles/roles.go says what each user may run, on which keys (docs/credentials.md);
# the file holds the passwords hashed. Every node loads it, and logs in to its master as the
# replication user.
render_redis_acl() {
	local extra=()
	# CLIENT SETINFO exists from Redis 7.2 (rueidis sends it and tolerates a refusal).
	if [[ "$(redis-server --version | sed -n 's/.* v=\([0-9]*\)\.\([0-9]*\).*/\1\2/p')" -ge 72 ]]; then
		extra=(--redis-setinfo)
	fi
	(
		umask 077
		roles_render redis-acl "${extra[@]}" >"$REDIS_ACL.tmp.$$" || die "cannot render the Redis users (flashgate roles render)"
		mv -f "$REDIS_ACL.tmp.$$" "$REDIS_ACL"
		# Every node's own login to its master (a replica's), kept off the command line.
		printf 'aclfile %s\nmasteruser %s\nmasterauth %s\n' "$REDIS_ACL" "$U_REPLICA" "$S_REDIS_REPLICA" >"$REDIS_AUTH_CONF.tmp.$$"
		mv -f "$REDIS_AUTH_CONF.tmp.$$" "$REDIS_AUTH_CONF"
	)
}

# NATS users: roles/roles.go says what each may publish and subscribe to (docs/credentials.md).
#
# NATS=cluster runs three servers, each with its own file (var/secrets/nats-<i>.conf): the same
# users, a JetStream store of its own, and routes to the other two that log in as their own user.
nats_node_conf() { printf '%s/nats-%s.conf' "$SECRETS_DIR" "$1"; }

render_nats_conf() {
	NATS_USERS="$(roles_render nats-users)" || die "cannot render the NATS users (flashgate roles render)"
	write_nats_conf "$NATS_CONF" "$NATS_PORT" "$NATS_MON" flashgate-local "$VAR/nats" ""
	local i j routes cl
	for i in 1 2 3; do
		routes=""
		for j in 1 2 3; do
			((j == i)) || routes+="\"nats-route://$U_ROUTE:$S_NATS_ROUTE@127.0.0.1:$((NATS_ROUTE + j - 1))\", "
		done
		cl="cluster {
  name: flashgate-local
  listen: \"127.0.0.1:$((NATS_ROUTE + i - 1))\"
  authorization { user: \"$U_ROUTE\", password: \"$S_NATS_ROUTE\" }
  routes = [ ${routes%, } ]
}"
		write_nats_conf "$(nats_node_conf "$i")" $((NATS_PORT + i - 1)) $((NATS_MON + i - 1)) "flashgate-n$i" "$VAR/nats-cluster/n$i" "$cl"
	done
}

# write_nats_conf FILE PORT MONITOR SERVER_NAME STORE_DIR CLUSTER_BLOCK
write_nats_conf() {
	local f="$1"
	(
		umask 077
		cat >"$f.tmp.$$" <<-CONF
			# GENERATED by scripts/stack.sh (docs/credentials.md)
			listen: "127.0.0.1:$2"
			http: "127.0.0.1:$3"
			server_name: $4
			jetstream { store_dir: "$5" }
			$6
			authorization {
			$NATS_USERS
			}
		CONF
		mv -f "$f.tmp.$$" "$f"
	)
}

# ---------------------------------------------------------------------------------------------
# Redis

redis_pidfile() { printf '%s/redis-%s.pid' "$RUN" "$1"; }
# rcli PORT ARGS...: redis-cli as the admin user (the password through the environment, not argv).
rcli() {
	local port="$1"
	shift
	REDISCLI_AUTH="$S_REDIS_ADMIN" redis-cli --no-auth-warning --user "$U_ADMIN" -h 127.0.0.1 -p "$port" "$@"
}
redis_ping() { [[ "$(rcli "$1" ping 2>/dev/null)" == PONG ]]; }
# A server that answers without a login was started before the stack authenticated its clients.
redis_open() { [[ "$(redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null)" == PONG ]]; }
cluster_field() {
	rcli "$1" cluster info 2>/dev/null | tr -d '\r' | sed -n "s/^$2://p"
}
cluster_ok() { [[ "$(cluster_field "$1" cluster_state)" == ok ]]; }
cluster_all_ok() {
	local p
	for p in "${CLUSTER_PORTS[@]}" "${REPLICA_PORTS[@]}"; do cluster_ok "$p" || return 1; done
}
# cluster_node_id PORT: the node's id in the Cluster.
cluster_node_id() { rcli "$1" cluster myid 2>/dev/null | tr -d '\r'; }
# cluster_synced: every replica's link to its master is up (a replica restarts with a full
# resync; until then WAIT counts it out, and redis.wait_replicas would refuse every admission).
cluster_synced() {
	local p info
	for p in "${CLUSTER_PORTS[@]}" "${REPLICA_PORTS[@]}"; do
		info="$(rcli "$p" info replication 2>/dev/null | tr -d '\r')" || return 1
		[[ "$info" == *role:master* || "$info" == *master_link_status:up* ]] || return 1
	done
}
# A replica has joined when it knows more nodes than itself.
cluster_joined() { [[ "$(cluster_field "$1" cluster_known_nodes)" -gt 1 ]]; }

# redis_start PORT [extra redis-server args...]
# hash-max-listpack-entries 128 (redis.conf's value; the binary's own default is 512): a hash in
# listpack encoding is scanned end to end by every HSET/HINCRBY, and a sale's buyers' hashes (and
# each stock bucket's, K times more of them) pay that scan for their first entries (docs/redis.md).
redis_start() {
	local port="$1"
	shift
	local dir="$VAR/redis/$port" pidfile logfile
	pidfile="$(redis_pidfile "$port")"
	logfile="$LOG/redis-$port.log"
	if redis_ping "$port"; then
		ours "$pidfile" "redis-server" || say "note: 127.0.0.1:$port already answers but not from our pid file: reusing it"
		# The users may have changed (a password given in the environment): load them.
		rcli "$port" acl load >/dev/null 2>&1 || warn "redis $port: ACL LOAD failed (restart it to apply $REDIS_ACL)"
		return 0
	fi
	if redis_open "$port"; then
		die "redis on 127.0.0.1:$port answers without authentication (started by an older stack.sh): stop it ('scripts/stack.sh down') and run infra-up again"
	fi
	mkdirs "$dir"
	say "starting redis on 127.0.0.1:$port"
	redis-server "$REDIS_AUTH_CONF" --port "$port" --bind 127.0.0.1 --protected-mode yes \
		--daemonize yes --pidfile "$pidfile" --logfile "$logfile" --dir "$dir" \
		--appendonly yes --appendfsync everysec --save "" \
		--hash-max-listpack-entries 128 \
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

# The Cluster: three masters, and a replica behind each (docs/recovery.md): a master that dies is
# replaced by its replica after cluster-node-timeout (5 s) without anyone's help.
cluster_up() {
	local p
	for p in "${CLUSTER_PORTS[@]}" "${REPLICA_PORTS[@]}"; do
		redis_start "$p" --cluster-enabled yes --cluster-config-file "$VAR/redis/$p/nodes.conf" \
			--cluster-node-timeout 5000
	done
	for p in "${CLUSTER_PORTS[@]}" "${REPLICA_PORTS[@]}"; do redis_wait "$p"; done
	cluster_all_ok && wait_for "$TIMEOUT" cluster_synced && return 0

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
		REDISCLI_AUTH="$S_REDIS_ADMIN" redis-cli --no-auth-warning --user "$U_ADMIN" \
			--cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes \
			>>"$LOG/redis-cluster-create.log" 2>&1 ||
			die "redis-cli --cluster create failed" "$LOG/redis-cluster-create.log"
	fi
	# Each replica behind its master (a Cluster of an older stack.sh had none: they join now).
	local i master
	for i in 0 1 2; do
		cluster_joined "${REPLICA_PORTS[$i]}" && continue
		master="$(cluster_node_id "${CLUSTER_PORTS[$i]}")"
		say "adding redis 127.0.0.1:${REPLICA_PORTS[$i]} as the replica of 127.0.0.1:${CLUSTER_PORTS[$i]}"
		REDISCLI_AUTH="$S_REDIS_ADMIN" redis-cli --no-auth-warning --user "$U_ADMIN" \
			--cluster add-node "127.0.0.1:${REPLICA_PORTS[$i]}" "127.0.0.1:${CLUSTER_PORTS[$i]}" \
			--cluster-slave --cluster-master-id "$master" >>"$LOG/redis-cluster-create.log" 2>&1 ||
			die "redis-cli --cluster add-node failed" "$LOG/redis-cluster-create.log"
	done
	wait_for "$TIMEOUT" cluster_all_ok && wait_for "$TIMEOUT" cluster_synced || {
		for p in "${CLUSTER_PORTS[@]}" "${REPLICA_PORTS[@]}"; do warn "127.0.0.1:$p cluster_state=$(cluster_field "$p" cluster_state) slots_assigned=$(cluster_field "$p" cluster_slots_assigned) known_nodes=$(cluster_field "$p" cluster_known_nodes)"; done
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
	if [[ "$(rcli "$port" info server 2>/dev/null | tr -d '\r' | sed -n 's/^process_id://p')" == "$pid" ]]; then
		rcli "$port" shutdown >/dev/null 2>&1 || true
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
	if ours "$(nats_node_pid 1)" nats-server; then
		die "the NATS cluster runs (node 1 on 127.0.0.1:$NATS_PORT): 'scripts/stack.sh down' first, or NATS=cluster"
	fi
	if nats_ok; then
		if ours "$NATS_PID" nats-server; then
			# Users or passwords may have changed: have it re-read its configuration.
			if [[ "$(tr '\0' ' ' <"/proc/$(pid_of "$NATS_PID")/cmdline")" != *"$NATS_CONF"* ]]; then
				die "nats-server (pid $(pid_of "$NATS_PID")) runs without authentication (started by an older stack.sh): stop it ('scripts/stack.sh down') and run infra-up again"
			fi
			kill -HUP "$(pid_of "$NATS_PID")" 2>/dev/null || true
		else
			say "note: NATS monitor 127.0.0.1:$NATS_MON already answers but not from our pid file: reusing it"
		fi
		return 0
	fi
	if ours "$NATS_PID" nats-server; then
		say "nats-server (pid $(pid_of "$NATS_PID")) running but not healthy yet: waiting"
	else
		mkdirs "$VAR/nats"
		say "starting nats-server (JetStream) on 127.0.0.1:$NATS_PORT, monitor $NATS_MON"
		spawn "$NATS_PID" "$LOG/nats.out" nats-server -c "$NATS_CONF" -P "$NATS_PID" -l "$LOG/nats.log"
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

# NATS=cluster: three nodes, each with its pid file var/run/nats-<i>.pid and log var/log/nats-<i>.log.
nats_node_pid() { printf '%s/nats-%s.pid' "$RUN" "$1"; }
nats_node_ok() { [[ "$(curl -fsS --max-time 2 "http://127.0.0.1:$((NATS_MON + $1 - 1))/healthz" 2>/dev/null)" == *'"ok"'* ]]; }
nats_cluster_ok() { nats_node_ok 1 && nats_node_ok 2 && nats_node_ok 3; }

nats_cluster_up() {
	local i pid
	if ours "$NATS_PID" nats-server; then
		die "the single nats-server (pid $(pid_of "$NATS_PID")) runs on 127.0.0.1:$NATS_PORT: 'scripts/stack.sh down' first, then NATS=cluster"
	fi
	for i in 1 2 3; do
		pid="$(nats_node_pid "$i")"
		if ours "$pid" nats-server; then
			kill -HUP "$(pid_of "$pid")" 2>/dev/null || true
			continue
		fi
		tcp_open $((NATS_PORT + i - 1)) && die "127.0.0.1:$((NATS_PORT + i - 1)) is already taken by a process that is not our NATS node $i"
		mkdirs "$VAR/nats-cluster/n$i"
		say "starting nats-server node $i (JetStream cluster) on 127.0.0.1:$((NATS_PORT + i - 1)), monitor $((NATS_MON + i - 1)), routes $((NATS_ROUTE + i - 1))"
		spawn "$pid" "$LOG/nats-$i.out" nats-server -c "$(nats_node_conf "$i")" -P "$pid" -l "$LOG/nats-$i.log"
	done
	wait_for "$((TIMEOUT * 2))" nats_cluster_ok || {
		for i in 1 2 3; do nats_node_ok "$i" || warn "nats node $i not healthy (monitor $((NATS_MON + i - 1)))"; done
		die "the NATS cluster did not report healthy within $((TIMEOUT * 2))s" "$LOG/nats-1.log"
	}
}

nats_cluster_down() {
	local i
	for i in 3 2 1; do stop_pid "nats node $i" "$(nats_node_pid "$i")" nats-server TERM 15; done
}

# ---------------------------------------------------------------------------------------------
# MariaDB

# root has a password too (anyone on the host could otherwise log in as root on loopback).
mysql_cli() { MYSQL_PWD="$S_MYSQL_ROOT" mariadb --no-defaults -h127.0.0.1 -P"$MYSQL_PORT" -uroot --connect-timeout=2 "$@"; }
# A data directory made before the stack authenticated its clients has a root without one.
mysql_cli_nopass() { mariadb --no-defaults -h127.0.0.1 -P"$MYSQL_PORT" -uroot --connect-timeout=2 "$@"; }
mysql_ok() { mysql_cli -e 'select 1' >/dev/null 2>&1 || mysql_cli_nopass -e 'select 1' >/dev/null 2>&1; }

# mysql_users: root's password, then a user per role (idempotent; a changed password is applied):
# admin (operator, tests: every right on flashgate* and the tests' fgtest_*), migrator (the schema,
# flashgate migrate up), backend (rows only); no gateway account (docs/credentials.md).
mysql_users() {
	local q u
	if ! mysql_cli -e 'select 1' >/dev/null 2>&1; then
		mysql_cli_nopass -e 'select 1' >/dev/null 2>&1 || die "cannot log in to MariaDB 127.0.0.1:$MYSQL_PORT as root" "$LOG/mariadb.log"
		say "setting MariaDB root's password"
		q=""
		while IFS= read -r u; do
			[[ -n "$u" ]] && q+="ALTER USER $u IDENTIFIED BY '$S_MYSQL_ROOT';"
		done < <(mysql_cli_nopass -N -e "SELECT CONCAT(QUOTE(user), '@', QUOTE(host)) FROM mysql.user WHERE user = 'root'")
		# --force: an account of another host name (root@<hostname>, which --skip-name-resolve
		# ignores) may refuse; what counts is that root logs in with the password afterwards.
		# The statements carry passwords: on stdin, never on a command line (ps shows those to
		# every user of the host).
		printf '%s\n' "$q FLUSH PRIVILEGES;" | mysql_cli_nopass --force >>"$LOG/mariadb-users.log" 2>&1 || true
		mysql_cli -e 'select 1' >/dev/null 2>&1 || die "cannot set MariaDB root's password" "$LOG/mariadb-users.log"
	fi
	q=""
	while IFS= read -r u; do
		[[ -n "$u" ]] && q+="DROP USER $u;"
	done < <(mysql_cli -N -e "SELECT CONCAT(QUOTE(user), '@', QUOTE(host)) FROM mysql.user WHERE user = ''")
	printf '%s\n' "$q" | mysql_cli || die "cannot drop MariaDB's anonymous users" "$LOG/mariadb.log"
	# The role accounts and their grants (roles/roles.go), on stdin: no password on a command line.
	# The tests' databases (fgtest_*) get the same rights, so that a test runs a backend with the
	# backend's login.
	roles_render mysql-sql --mysql-extra 'fgtest\_%' | mysql_cli || die "cannot create MariaDB's users" "$LOG/mariadb.log"
}

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
	mysql_users
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
# with envsubst and writes var/nginx/nginx.conf, which is what nginx runs. The per-client limits
# (a client: an IPv4 address or an IPv6 /64), the per-network ones (an IPv6 /48) and the
# gateways can be set from the environment (docs/hostile.md, "nginx's connection settings"):
#   NGINX_RATE=20 NGINX_BURST=40 NGINX_CONN=32 NGINX_BODY_CONN=8 NGINX_READ_TIMEOUT=5s
#   NGINX_NET_RATE=320 NGINX_NET_BURST=640 NGINX_NET_CONN=512 NGINX_NET_BODY_CONN=128
#   NGINX_GATEWAYS="127.0.0.1:8080 10.0.0.2:8080"   (space or comma separated)

NGINX_PID="$RUN/nginx.pid"
# shellcheck disable=SC2016 # literal ${...}: the names envsubst may substitute
NGINX_VARS='${NGINX_LISTEN} ${NGINX_LISTEN_EXTRA} ${NGINX_UPSTREAM_SERVERS} ${NGINX_RATE} ${NGINX_BURST} ${NGINX_CONN} ${NGINX_BODY_CONN} ${NGINX_NET_RATE} ${NGINX_NET_BURST} ${NGINX_NET_CONN} ${NGINX_NET_BODY_CONN} ${NGINX_READ_TIMEOUT} ${NGINX_HTML} ${NGINX_LOG_DIR} ${NGINX_PID} ${NGINX_RLIMIT_NOFILE} ${NGINX_WORKER_CONNECTIONS} ${NGINX_MARKS}'

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
	local rt="${NGINX_READ_TIMEOUT:-5s}" gws="${NGINX_GATEWAYS:-$(all_gateways)}" servers="" gw
	local body="${NGINX_BODY_CONN:-8}" nrate="${NGINX_NET_RATE:-320}" nburst="${NGINX_NET_BURST:-640}"
	local nconn="${NGINX_NET_CONN:-512}" nbody="${NGINX_NET_BODY_CONN:-128}" v
	local hostport='^[][A-Za-z0-9.:_-]+:[0-9]+$'
	need envsubst
	[[ "$rate" =~ ^[1-9][0-9]*$ ]] || die "NGINX_RATE must be a whole number of requests/s > 0, not '$rate'"
	[[ "$burst" =~ ^[1-9][0-9]*$ ]] || die "NGINX_BURST must be a whole number > 0 (nginx refuses burst=0), not '$burst'"
	{ [[ "$conn" =~ ^[1-9][0-9]*$ ]] && ((conn <= 65535)); } || die "NGINX_CONN must be 1..65535, not '$conn'"
	[[ "$nrate" =~ ^[1-9][0-9]*$ ]] || die "NGINX_NET_RATE must be a whole number of requests/s > 0, not '$nrate'"
	[[ "$nburst" =~ ^[1-9][0-9]*$ ]] || die "NGINX_NET_BURST must be a whole number > 0, not '$nburst'"
	for v in NGINX_BODY_CONN="$body" NGINX_NET_CONN="$nconn" NGINX_NET_BODY_CONN="$nbody"; do
		{ [[ "${v#*=}" =~ ^[1-9][0-9]*$ ]] && ((${v#*=} <= 65535)); } || die "${v%%=*} must be 1..65535, not '${v#*=}'"
	done
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
	# IPv6 clients too, on the loopback (make hostile's /64 attack), when the host has ::1.
	local listen6="        # no IPv6 loopback on this host"
	if grep -qs '^0\{31\}1 ' /proc/net/if_inet6; then
		listen6="        listen [::1]:$NGINX_PORT backlog=4096 reuseport;"
	fi
	mkdir -p "$(dirname "$out")"
	NGINX_RLIMIT_NOFILE="$nofile" NGINX_WORKER_CONNECTIONS="$wconns" NGINX_LISTEN="127.0.0.1:$NGINX_PORT" NGINX_LISTEN_EXTRA="$listen6" NGINX_UPSTREAM_SERVERS="${servers%$'\n'}" \
		NGINX_RATE="$rate" NGINX_BURST="$burst" NGINX_CONN="$conn" NGINX_READ_TIMEOUT="$rt" NGINX_BODY_CONN="$body" \
		NGINX_NET_RATE="$nrate" NGINX_NET_BURST="$nburst" NGINX_NET_CONN="$nconn" NGINX_NET_BODY_CONN="$nbody" \
		NGINX_HTML="$ROOT/nginx/html" NGINX_LOG_DIR="$LOG" NGINX_PID="$NGINX_PID" NGINX_MARKS="$NGINX_MARKS_DIR" \
		envsubst "$NGINX_VARS" <"$NGINX_TEMPLATE" >"$out.tmp.$$" || die "cannot render $NGINX_TEMPLATE"
	sed -i "1i # GENERATED by scripts/stack.sh from nginx/nginx.conf: edit that file, not this one." "$out.tmp.$$"
	mv -f "$out.tmp.$$" "$out"
}

# all_gateways: the shape's gateways, host:port, space separated (nginx's default upstream).
all_gateways() {
	local k a=()
	for ((k = 1; k <= N_GATEWAYS; k++)); do a+=("127.0.0.1:$(gw_port "$k")"); done
	echo "${a[*]}"
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
		say "starting nginx on 127.0.0.1:$NGINX_PORT (per client: ${NGINX_RATE:-20} r/s, burst ${NGINX_BURST:-40}, ${NGINX_CONN:-32} connections, ${NGINX_BODY_CONN:-8} purchases; per IPv6 /48: ${NGINX_NET_RATE:-320} r/s, burst ${NGINX_NET_BURST:-640}, ${NGINX_NET_CONN:-512}, ${NGINX_NET_BODY_CONN:-128}; gateways ${NGINX_GATEWAYS:-$(all_gateways)})"
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

# app_up ROLE K READYZ_URL: the K-th gateway or backend (app_name names its files).
app_up() {
	local role="$1" k="$2" url="$3" name
	name="$(app_name "$role" "$k")"
	local pidfile="$RUN/$name.pid" logfile="$LOG/$name.log"
	[[ -x "$BIN" ]] || die "$BIN not found: run 'make build' first"
	if ours "$pidfile" "$BIN $role"; then
		say "$name already running (pid $(pid_of "$pidfile"))"
	else
		say "starting $name: bin/flashgate $role --config $CONFIG"
		printf '\n==== %s start %s ====\n' "$name" "$(date -Is)" >>"$logfile"
		local envs
		if [[ "$role" == backend ]]; then
			# The schema, as the migrator: the backend has no DDL (docs/credentials.md).
			mapfile -t envs < <(role_env migrator)
			(export "${envs[@]}" && "$BIN" migrate up --config "$CONFIG" >>"$logfile" 2>&1) ||
				die "flashgate migrate up (as $U_MIGRATOR) failed" "$logfile"
		fi
		mapfile -t envs < <(role_env "$role" "$k")
		# Exported, not on the command line, where any user of the host could read them.
		(export "${envs[@]}" && spawn "$pidfile" "$logfile" "$BIN" "$role" --config "$CONFIG")
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

# app_down NAME: NAME is gateway, backend, gateway-2 ...
app_down() { stop_pid "$1" "$RUN/$1.pid" "$BIN ${1%%-*}" TERM 15; }

# apps_of ROLE: the names of ROLE's instances that have a pid file or belong to the shape,
# the last first (every one is stopped, whatever the shape now says).
apps_of() {
	local n=1 f k names=()
	[[ "$1" == gateway ]] && n=$N_GATEWAYS || n=$N_BACKENDS
	for ((k = 5; k >= 1; k--)); do
		f="$(app_name "$1" "$k")"
		if ((k <= n)) || [[ -f "$RUN/$f.pid" ]]; then names+=("$f"); fi
	done
	printf '%s\n' "${names[@]}"
}

# ---------------------------------------------------------------------------------------------
# commands

cmd_infra_up() {
	need redis-server redis-cli nats-server mariadbd mariadb mariadb-install-db curl
	mkdirs
	secrets_load
	render_redis_acl
	render_nats_conf
	shape_save
	redis_up
	cluster_up
	if [[ "$NATS_MODE" == cluster ]]; then nats_cluster_up; else nats_up; fi
	mysql_up
	write_secrets_env
	local nats="nats 127.0.0.1:$NATS_PORT (monitor $NATS_MON)"
	[[ "$NATS_MODE" == cluster ]] && nats="nats cluster 127.0.0.1:$NATS_PORT-$((NATS_PORT + 2)) (monitors $NATS_MON-$((NATS_MON + 2)))"
	say "infra up: redis 127.0.0.1:$REDIS_PORT, cluster 127.0.0.1:${CLUSTER_PORTS[0]}-${CLUSTER_PORTS[-1]} (replicas ${REPLICA_PORTS[0]}-${REPLICA_PORTS[-1]}), $nats, mariadb 127.0.0.1:$MYSQL_PORT/flashgate"
	say "credentials: '. var/secrets.env' logs you in as the operator (docs/credentials.md)"
}

cmd_up() {
	cmd_infra_up
	local k
	for ((k = 1; k <= N_BACKENDS; k++)); do app_up backend "$k" "http://127.0.0.1:$(be_admin "$k")/readyz"; done
	for ((k = 1; k <= N_GATEWAYS; k++)); do app_up gateway "$k" "http://127.0.0.1:$(gw_admin "$k")/readyz"; done
	nginx_up
	if ((N_GATEWAYS == 1 && N_BACKENDS == 1)); then
		say "up: nginx http://127.0.0.1:$NGINX_PORT -> gateway 127.0.0.1:$GATEWAY_PORT (admin $GATEWAY_ADMIN), backend admin 127.0.0.1:$BACKEND_ADMIN"
	else
		say "up: nginx http://127.0.0.1:$NGINX_PORT -> $N_GATEWAYS gateways ($(all_gateways)), $N_BACKENDS backends (admin $BACKEND_ADMIN first); redis $REDIS_MODE, nats $NATS_MODE"
	fi
}

cmd_down() {
	secrets_load
	nginx_down
	local a p
	for a in $(apps_of gateway) $(apps_of backend); do app_down "$a"; done
	nats_down
	nats_cluster_down
	mysql_down
	for p in "${REPLICA_PORTS[@]}" "${CLUSTER_PORTS[@]}"; do redis_down "$p"; done
	redis_down "$REDIS_PORT"
	rm -f "$SHAPE_FILE"
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
	local a
	if [[ " ${want[*]} " == *" gateway "* ]]; then for a in $(apps_of gateway); do app_down "$a"; done; fi
	if [[ " ${want[*]} " == *" backend "* ]]; then for a in $(apps_of backend); do app_down "$a"; done; fi
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
	secrets_load
	part redis "127.0.0.1:$REDIS_PORT" redis_ping "$REDIS_PORT"
	part redis-cluster "127.0.0.1:${CLUSTER_PORTS[0]}-${CLUSTER_PORTS[-1]}, replicas ${REPLICA_PORTS[0]}-${REPLICA_PORTS[-1]}" cluster_all_ok
	local p i k
	if [[ "$REDIS_MODE" == cluster ]]; then
		# Which node is what now (a failover swaps a master and its replica).
		for p in "${CLUSTER_PORTS[@]}" "${REPLICA_PORTS[@]}"; do
			part "  redis-$p" "127.0.0.1:$p $(rcli "$p" role 2>/dev/null | head -n1 | tr -d '\r')" redis_ping "$p"
		done
	fi
	if [[ "$NATS_MODE" == cluster ]]; then
		for i in 1 2 3; do part "nats-$i" "127.0.0.1:$((NATS_PORT + i - 1)) (monitor $((NATS_MON + i - 1)))" nats_node_ok "$i"; done
	else
		part nats "127.0.0.1:$NATS_PORT (monitor $NATS_MON)" nats_ok
	fi
	part mariadb "127.0.0.1:$MYSQL_PORT" mysql_ok
	for ((k = 1; k <= N_BACKENDS; k++)); do
		part "$(app_name backend "$k")" "127.0.0.1:$(be_admin "$k")" ready "http://127.0.0.1:$(be_admin "$k")/readyz"
	done
	for ((k = 1; k <= N_GATEWAYS; k++)); do
		part "$(app_name gateway "$k")" "127.0.0.1:$(gw_port "$k") (admin $(gw_admin "$k"))" ready "http://127.0.0.1:$(gw_admin "$k")/readyz"
	done
	part nginx "127.0.0.1:$NGINX_PORT" nginx_ours_ok
}

cmd_reset() {
	cmd_down
	[[ -n "$VAR" && "$VAR" == "$ROOT/var" && -d "$VAR" ]] && rm -rf -- "$VAR"
	rm -f "/tmp/flashgate-mysqld-$(printf '%s' "$ROOT" | md5sum | cut -c1-12).sock"
	say "reset: removed $VAR"
}

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"; }

case "${1:-}" in
deps) cmd_deps ;;
infra-up) cmd_infra_up ;;
up) cmd_up ;;
nginx-up) nginx_up ;;
nginx-down) nginx_down ;;
nginx-test) cmd_nginx_test ;;
nginx-conf) cmd_nginx_conf "${2:-}" ;;
nginx-reload) nginx_reload ;;
auth-conf)
	mkdirs
	secrets_load
	render_redis_acl
	render_nats_conf
	;;
apps-down)
	shift
	cmd_apps_down "$@"
	;;
sql)
	shift
	secrets_load
	mysql_cli flashgate "$@"
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
