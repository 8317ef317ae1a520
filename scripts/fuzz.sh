#!/usr/bin/env bash
# Runs every fuzz target of the module (every func FuzzXxx in a _test.go file), one after another,
# each for FUZZTIME (default 60s), and prints one line per target with the executions it made:
#   fuzz <package> <target>: <execs> execs in <time>  ok|FAIL
# The raw output of each run is kept in var/fuzz/<target>.log. A failing input is written by go
# test under the package's testdata/fuzz/<target>/ and replays as a plain test case from then on.
# The exit status is non-zero if any target failed. Not part of `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
GO="${GO:-go}"
FUZZTIME="${FUZZTIME:-60s}"
mkdir -p var/fuzz
summary=var/fuzz/summary.txt
: > "$summary"
rc=0
n=0
# package directory and target name of every fuzz target, in a stable order
while read -r file name; do
	dir="./$(dirname "$file")"
	n=$((n + 1))
	log="var/fuzz/${name}.log"
	status=ok
	if ! "$GO" test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" "$dir" > "$log" 2>&1; then
		status=FAIL
		rc=1
	fi
	# go test -fuzz reports progress as "fuzz: elapsed: 10s, execs: 123456 (12345/sec), ...".
	last="$(grep -E '^fuzz: elapsed: .*execs: [0-9]+' "$log" | tail -n 1 || true)"
	execs="$(sed -E 's/.*execs: ([0-9]+).*/\1/' <<< "$last")"
	elapsed="$(sed -E 's/^fuzz: elapsed: ([^,]+),.*/\1/' <<< "$last")"
	line="fuzz ${dir#./} ${name}: ${execs:-?} execs in ${elapsed:-?}  ${status}"
	echo "$line" | tee -a "$summary"
	if [[ "$status" == FAIL ]]; then
		grep -E -- '--- FAIL|Failing input|testdata/fuzz|\.go:[0-9]+:' "$log" | head -n 10 >&2 || true
	fi
done < <(grep -rE --include='*_test.go' -o '^func (Fuzz[A-Za-z0-9_]+)\(' . \
	| grep -v '^./var/' | sed -E 's/^\.\/(.*):func (Fuzz[A-Za-z0-9_]+)\(/\1 \2/' | sort)
echo "fuzz: $n targets, FUZZTIME=$FUZZTIME each, $([[ $rc == 0 ]] && echo 'all passed' || echo 'FAILURES above')" | tee -a "$summary"
exit $rc
