#!/usr/bin/env bash
# fuzz.sh: run every fuzz target of the module for FUZZTIME each (default 10s).
#
#   hack/fuzz.sh            # or: make fuzz
#   FUZZTIME=30s hack/fuzz.sh
#
# A target that finds a failing input fails the run (go test writes the input
# under the package's testdata/fuzz/ and prints "Failing input written to").
# On a loaded machine the fuzzing engine itself sometimes ends a run that
# found nothing with "context deadline exceeded" while it stops its workers;
# such a run, and only such a run, is tried once more.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-10s}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
count=0
# The targets are read from the sources (a `func FuzzName(` in a _test.go file of this module,
# tools/ being a module of its own), not listed by `go test -list`, which would compile every
# package's tests to find the few that fuzz.
targets=$(git ls-files '*_test.go' ':!:tools/**' | xargs grep -Ho '^func Fuzz[A-Za-z0-9_]*(' | sed 's/:func /:/; s/($//' | sort)
[[ -n $targets ]] || { echo "fuzz.sh: found no fuzz targets" >&2; exit 1; }
while IFS=: read -r file target; do
	pkg=./$(dirname "$file")
	count=$((count + 1))
	for try in 1 2; do
		echo "== $pkg $target ($fuzztime, try $try)"
		if go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg" >"$out" 2>&1 </dev/null; then
			tail -n 2 "$out"
			break
		fi
		cat "$out"
		if [[ $try == 1 ]] && grep -q 'context deadline exceeded' "$out" && ! grep -q 'Failing input written' "$out"; then
			echo "fuzz.sh: $target: the fuzzing engine timed out stopping its workers without a failing input; trying once more"
			continue
		fi
		echo "fuzz.sh: $target in $pkg failed" >&2
		exit 1
	done
done <<<"$targets"
echo "fuzz.sh: $count fuzz targets ran for $fuzztime each"
