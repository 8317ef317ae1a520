#!/usr/bin/env bash
# make verify: spec/admission.pml checked by spin (docs/verification.md).
#
#   1. each configuration (CFG_KEYS, CFG_CANCEL), with replicas and without (NO_REPLICAS),
#      exhaustively: no violation expected;
#   2. each bug switch, in the configuration that shows it: a violation expected;
#   3. the price without replicas (NO_REPLICAS PRICE): a violation expected (the documented price).
#
# One line per run: what, the verdict, states stored, seconds; the table also goes to
# var/verify/summary.txt. Exit 1 if any run surprised (a violation where none was expected, none
# where one was, a search that did not finish). VERIFY_ONLY=CFG_KEYS (a space-separated list of
# configurations or switches) runs those alone.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v spin >/dev/null || { echo "verify: spin is missing (scripts/stack.sh deps installs it)" >&2; exit 1; }
command -v gcc >/dev/null || { echo "verify: gcc is missing (scripts/stack.sh deps installs it)" >&2; exit 1; }
MODEL=$PWD/spec/admission.pml
OUT=var/verify
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
# Memory for pan's state store (MB) and the depth bound; an exhaustive search must not hit either.
MEMLIM=${VERIFY_MEMLIM:-16000}
DEPTH=${VERIFY_DEPTH:-200000}

# run NAME EXPECT DEFINES...: EXPECT is pass or fail.
surprises=0
run() {
	local name=$1 expect=$2
	shift 2
	if [[ -n "${VERIFY_ONLY:-}" && " $VERIFY_ONLY " != *" $name "* ]]; then return 0; fi
	local dir
	dir=$(mktemp -d "$OUT/run.XXXXXX")
	cp "$MODEL" "$dir/admission.pml"
	local defs=()
	for d in "$@"; do defs+=("-D$d"); done
	local start=$SECONDS
	(cd "$dir" && spin -a "${defs[@]}" admission.pml >spin.out 2>&1 &&
		gcc -O2 -DSAFETY -DCOLLAPSE -DMEMLIM="$MEMLIM" -o pan pan.c >gcc.out 2>&1 &&
		./pan -m"$DEPTH" >pan.out 2>&1) || true
	local secs=$((SECONDS - start))
	local errors states verdict ok=1
	errors=$(grep -o 'errors: [0-9]*' "$dir/pan.out" 2>/dev/null | head -1 | awk '{print $2}')
	states=$(awk '/states, stored/ {print $1; exit}' "$dir/pan.out" 2>/dev/null)
	if [[ -z "$errors" ]]; then
		verdict="did not finish (see $dir)"
		ok=0
	elif grep -q 'max search depth too small\|out of memory' "$dir/pan.out"; then
		verdict="incomplete search (depth or memory; see $dir)"
		ok=0
	elif ((errors == 0)); then
		verdict="no violation"
		[[ $expect == pass ]] || ok=0
	else
		verdict="violation: $(grep -m1 -o 'assertion violated .*' "$dir/pan.out" | cut -c1-90)"
		[[ $expect == fail ]] || ok=0
	fi
	local line
	line=$(printf '%-26s %-5s %-10s %7ss  %s' "$name" "$expect" "${states:-?}" "$secs" "$verdict")
	if ((ok)); then
		rm -rf "$dir"
	else
		line+="  <- SURPRISE"
		surprises=$((surprises + 1))
		mv "$dir/pan.out" "$OUT/$name.pan.out" 2>/dev/null || true
	fi
	echo "$line" | tee -a "$SUMMARY"
}

printf '%-26s %-5s %-10s %8s  %s\n' run want states time verdict | tee -a "$SUMMARY"
# With replicas (the default), then without (the price's assertions off, -DPRICE on).
run CFG_KEYS pass CFG_KEYS
run CFG_CANCEL pass CFG_CANCEL
run CFG_KEYS/NO_REPLICAS pass CFG_KEYS NO_REPLICAS
run CFG_CANCEL/NO_REPLICAS pass CFG_CANCEL NO_REPLICAS
for b in BUG_NO_TOMBSTONE BUG_NO_INFLIGHT_CHARGES BUG_CLAIM_NO_WAIT BUG_RELEASE_NO_WAIT BUG_TRUST_UNKNOWN \
	BUG_NO_CLAIM_EPOCH BUG_NO_FAILOVER_REBUILD; do
	run "$b" fail CFG_KEYS "$b"
done
run BUG_NO_RESTOCKED fail CFG_CANCEL BUG_NO_RESTOCKED
for b in BUG_KEEP_DECIDED BUG_STREAM_IDEM BUG_HOLD_LOST; do
	run "$b/NO_REPLICAS" fail CFG_KEYS NO_REPLICAS "$b"
done
run PRICE/NO_REPLICAS fail CFG_KEYS NO_REPLICAS PRICE
if ((surprises > 0)); then
	echo "verify: $surprises surprise(s); the pan output of each is in $OUT/" >&2
	exit 1
fi
echo "verify: every configuration passed and every bug switch was found"
