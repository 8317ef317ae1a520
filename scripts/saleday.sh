#!/usr/bin/env bash
# The sale-day drill (make saleday): every sale-day command of docs/runbook.md (Routine tasks) run against a
# sale while, and after, `flashgate bench` floods it, on the local stack, each checked:
#
#   1. bench --create floods a new sale (SALEDAY_RATE requests/s for SALEDAY_DURATION, 1,000 units,
#      one per buyer); 3 s in `sale pause` (the flood's answers turn 503 paused and reserve
#      nothing), then `sale resume`. bench audits the invariants when its orders are written.
#   2. sale show, sale audit (exit 0), order list (the sale, then one buyer), order show,
#      order cancel --reason (the unit goes back), sale export (csv and json: one row per order).
#   3. dlq: a MariaDB trigger refuses one buyer's order (a bug standing in for poison); the buyer
#      buys the unit the cancel freed; the backend dead-letters it after backend.max_deliver tries
#      (order failed, unit back); `dlq list` shows it; the trigger dropped, `dlq redrive` (retried
#      while the orders stream's duplicate window, nats.dedup_window, still holds its id) gets it
#      confirmed.
#   4. audit-log shows who did each change; sale audit again (exit 0); sale close.
#
# Everything it runs and prints goes to var/log/saleday.out. It starts the stack if it is not up
# (and then stops it), else leaves it running. Exit 0 only if every step answered as it should.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-bin/flashgate}
STACK=scripts/stack.sh
OUT=var/log/saleday.out
RATE=${SALEDAY_RATE:-150} # slow enough that 1,000 units are still on sale when the pause comes
DURATION=${SALEDAY_DURATION:-20s}
mkdir -p var/log
: >"$OUT"

say() { printf '\n== %s\n' "$*" | tee -a "$OUT"; }
fail() {
	printf 'saleday: FAILED: %s\n' "$*" | tee -a "$OUT" >&2
	exit 1
}
# run CMD...: print the command and its output into the transcript; its exit code is run's.
run() {
	printf '$ %s\n' "$*" >>"$OUT"
	local rc=0
	"$@" >var/log/saleday.step 2>&1 || rc=$?
	tee -a "$OUT" <var/log/saleday.step
	[[ $rc == 0 ]] || printf '(exit %d)\n' "$rc" >>"$OUT"
	return $rc
}

started=0
if ! curl -fsS -o /dev/null "http://127.0.0.1:$((8082 + ${STACK_PORT_OFFSET:-0}))/readyz" 2>/dev/null; then
	$STACK up
	started=1
fi
cleanup() {
	[[ -n "${trigger:-}" ]] && $STACK sql -e "DROP TRIGGER IF EXISTS $trigger" >/dev/null 2>&1
	if [[ $started == 1 ]]; then $STACK down >var/log/down.log 2>&1 || true; fi
}
trap cleanup EXIT
# shellcheck disable=SC1091
. var/secrets.env
# The flood goes to the first gateway, as make demo's (bench gives each buyer an address of its own
# in X-Forwarded-For, which nginx would replace with this machine's); the poison buyer through nginx.
TARGET=${SALEDAY_TARGET:-http://127.0.0.1:$((8080 + ${STACK_PORT_OFFSET:-0}))}
GW=${FLASHGATE_PUBLIC_URL:-http://127.0.0.1:8000}
SALE=saleday-$(date +%s)

say "1. flood $SALE: bench --create, $RATE requests/s for $DURATION; pause at 3 s, resume 3 s later"
"$BIN" bench --create --sale "$SALE" --total 1000 --rate "$RATE" --duration "$DURATION" \
	--target "$TARGET" --label saleday --json var/log/saleday-bench.json >var/log/saleday-bench.out 2>&1 &
bench=$!
for _ in $(seq 50); do "$BIN" sale show "$SALE" >/dev/null 2>&1 && break; sleep 0.2; done
sleep 3
run "$BIN" sale pause "$SALE" || fail "sale pause"
sleep 3
run "$BIN" sale resume "$SALE" || fail "sale resume"
wait "$bench" || { cat var/log/saleday-bench.out >>"$OUT"; fail "bench (its audit or its run): var/log/saleday-bench.out"; }
cat var/log/saleday-bench.out >>"$OUT"
tail -n 12 var/log/saleday-bench.out
paused=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["load"]["by_code"].get("paused", 0))' var/log/saleday-bench.json)
accepted=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["load"]["by_code"].get("accepted", 0))' var/log/saleday-bench.json)
echo "the flood: $accepted accepted, $paused answered 503 paused" | tee -a "$OUT"
((paused > 0)) || fail "no purchase answered paused while the sale was paused"
((accepted > 0)) || fail "nothing accepted"

say "2. look, audit, cancel, export"
run "$BIN" sale show "$SALE" || fail "sale show"
run "$BIN" sale audit "$SALE" || fail "sale audit after the flood"
run "$BIN" order list --sale "$SALE" --limit 5 || fail "order list"
read -r ORDER BUYER < <("$BIN" order list --sale "$SALE" --limit 50 2>/dev/null | awk '$5 == "confirmed" {print $1, $2; exit}')
[[ -n "${ORDER:-}" ]] || fail "no confirmed order to look at"
run "$BIN" order list --sale "$SALE" --user "$BUYER" || fail "order list --user"
run "$BIN" order show "$ORDER" || fail "order show"
run "$BIN" order cancel "$ORDER" --reason "sale-day drill: the buyer called" || fail "order cancel"
grep -q canceled var/log/saleday.step || fail "the canceled order is not canceled"
printf '$ %s sale export %s --format csv | head -3\n' "$BIN" "$SALE" >>"$OUT"
"$BIN" sale export "$SALE" --format csv | head -3 | tee -a "$OUT" || true
rows=$("$BIN" sale export "$SALE" --format csv | tail -n +2 | wc -l)
jrows=$("$BIN" sale export "$SALE" --format json | python3 -c 'import json,sys; d=sys.stdin.read().strip(); print(len(json.loads(d)) if d.startswith("[") else len(d.splitlines()))')
mysqlrows=$($STACK sql -N -e "SELECT COUNT(*) FROM orders WHERE sale_id = '$SALE'")
echo "export: $rows csv rows, $jrows json orders, MySQL holds $mysqlrows" | tee -a "$OUT"
[[ $rows == "$mysqlrows" && $jrows == "$mysqlrows" ]] || fail "the export does not hold every order"

say "3. a poison order: dead-lettered, listed, redriven once its cause is gone"
trigger=fg_saleday_poison
$STACK sql >/dev/null <<SQL
DROP TRIGGER IF EXISTS $trigger;
DELIMITER //
CREATE TRIGGER $trigger BEFORE INSERT ON orders FOR EACH ROW BEGIN
	IF NEW.user_id = 'saleday-poison' AND NEW.status = 'confirmed' THEN
		SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'sale-day drill: the bug that makes this order poison';
	END IF;
END //
DELIMITER ;
SQL
tok=$("$BIN" token --user saleday-poison)
printf '$ curl -XPOST %s/v1/sales/%s/orders (user saleday-poison)\n' "$GW" "$SALE" >>"$OUT"
curl -sS -XPOST "$GW/v1/sales/$SALE/orders" -H "Authorization: Bearer $tok" -d '{"quantity":1}' | tee -a "$OUT"; echo | tee -a "$OUT"
grep -q '"accepted"' "$OUT" || fail "the poison buyer's purchase was not accepted (the cancel's unit)"
seq=""
for _ in $(seq 120); do
	seq=$("$BIN" dlq list --sale "$SALE" 2>/dev/null | awk '$6 == "saleday-poison" || $0 ~ /saleday-poison/ {print $1; exit}')
	[[ -n "$seq" ]] && break
	sleep 1
done
run "$BIN" dlq list --sale "$SALE" || fail "dlq list"
[[ -n "$seq" ]] || fail "the poison order never reached the dead-letter stream"
$STACK sql -e "DROP TRIGGER $trigger" >/dev/null
trigger=""
redriven=0
for _ in $(seq 200); do
	if "$BIN" dlq redrive "$seq" >var/log/saleday.step 2>&1; then
		printf '$ %s dlq redrive %s\n' "$BIN" "$seq" >>"$OUT"
		tee -a "$OUT" <var/log/saleday.step
		redriven=1
		break
	fi
	sleep 1 # 409 while the stream's duplicate window still holds the order id
done
((redriven)) || { cat var/log/saleday.step >>"$OUT"; fail "dlq redrive"; }
for _ in $(seq 60); do
	"$BIN" order list --sale "$SALE" --user saleday-poison 2>/dev/null | grep -q confirmed && break
	sleep 1
done
run "$BIN" order list --sale "$SALE" --user saleday-poison || fail "order list of the redriven buyer"
grep -q confirmed var/log/saleday.step || fail "the redriven order is not confirmed"

say "4. who did what; the invariants; close"
run "$BIN" audit-log --sale "$SALE" || fail "audit-log"
for a in create pause resume cancel redrive; do grep -q "$a" var/log/saleday.step || fail "audit-log has no $a"; done
run "$BIN" sale audit "$SALE" || fail "sale audit at the end"
run "$BIN" sale close "$SALE" || fail "sale close"
run "$BIN" sale audit "$SALE" || fail "sale audit after close"
say "saleday: every step answered as it should (transcript: $OUT)"
