#!/usr/bin/env bash
# demo.sh: the README's first command path, end to end. It builds fiberd and
# fiberctl, starts `fiberd -dev` (a local issuer, the example templates and a
# grant for each), clones fibers of the warm templates (forked from a zygote)
# and of their cold twins (fork+exec, paying the template's init per fiber),
# prints how long each clone took and how long until the fiber answered HTTP,
# and stops fiberd with SIGTERM (exit status 0, nothing left running).
#
#   hack/demo.sh            # or: make demo
#   DEMO_CLONES=10 hack/demo.sh
#
# Needs: go, cc, python3 (the Python templates are skipped without it), curl.
set -euo pipefail
cd "$(dirname "$0")/.."

clones=${DEMO_CLONES:-5}
for tool in go curl; do
	command -v "$tool" >/dev/null || { echo "demo: $tool is not on PATH" >&2; exit 1; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/fiberd-demo.XXXXXX")
fiberd_pid=
cleanup() {
	if [[ -n $fiberd_pid ]] && kill -0 "$fiberd_pid" 2>/dev/null; then
		kill -TERM "$fiberd_pid" 2>/dev/null || true
		wait "$fiberd_pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

echo "== building fiberd and fiberctl"
go build -o "$work/bin/" ./cmd/fiberd ./cmd/fiberctl
fiberctl=("$work/bin/fiberctl" -addr "unix://$work/state/fiberd.sock")

echo "== starting: fiberd -dev (log in $work/fiberd.log)"
"$work/bin/fiberd" -dev -state "$work/state" -listen 127.0.0.1:0 >"$work/fiberd.out" 2>"$work/fiberd.log" &
fiberd_pid=$!
for _ in $(seq 1 600); do
	grep -q "fiberd -dev is serving" "$work/fiberd.out" 2>/dev/null && break
	if ! kill -0 "$fiberd_pid" 2>/dev/null; then
		echo "demo: fiberd exited early:" >&2
		tail -20 "$work/fiberd.log" >&2
		exit 1
	fi
	sleep 0.2
done
grep -q "fiberd -dev is serving" "$work/fiberd.out" || { echo "demo: fiberd not ready after 2 minutes" >&2; exit 1; }
cat "$work/fiberd.out"

# uid_of TEMPLATE: the UID of the grant -dev minted for TEMPLATE.
uid_of() { awk -v t="$1" '$2 == t { print $1; exit }' "$work/fiberd.out"; }

now_ns() { date +%s%N; }

# measure TEMPLATE: clone it $clones times; print the mean clone time and the
# mean time from the clone request to the fiber's first HTTP answer.
measure() {
	local tmpl=$1 uid out endpoint start cloned answered
	local clone_total=0 answer_total=0
	uid=$(uid_of "$tmpl")
	[[ -n $uid ]] || return 1
	for i in $(seq 1 "$clones"); do
		start=$(now_ns)
		out=$("${fiberctl[@]}" clone -grant-uid "$uid" -payload "demo-$i")
		cloned=$(now_ns)
		endpoint=$(awk '$1 == "endpoint" { print $2 }' <<<"$out")
		curl -fsS --max-time 30 "http://${endpoint#tcp://}/" >/dev/null
		answered=$(now_ns)
		clone_total=$((clone_total + cloned - start))
		answer_total=$((answer_total + answered - start))
		"${fiberctl[@]}" release "$(awk '$1 == "fiber" { print $2 }' <<<"$out")" >/dev/null
	done
	printf "%-16s %-6s %12.1f %16.1f\n" "$tmpl" "$2" \
		"$(awk -v t="$clone_total" -v n="$clones" 'BEGIN { print t / n / 1e6 }')" \
		"$(awk -v t="$answer_total" -v n="$clones" 'BEGIN { print t / n / 1e6 }')"
}

echo
echo "== $clones clones per template (times include fiberctl's own start-up)"
printf "%-16s %-6s %12s %16s\n" TEMPLATE TIER "CLONE (ms)" "FIRST ANSWER (ms)"
for pair in "counter-c WARM" "counter-c-cold BASIC" "counter-py WARM" "counter-py-cold BASIC"; do
	# shellcheck disable=SC2086
	measure $pair || echo "${pair%% *}: not offered (toolchain missing?)"
done
echo
echo "WARM fibers are forked from a zygote that paid the template's init once;"
echo "BASIC (cold) fibers are exec'd and pay it per fiber (--init-ms 200 here)."

echo
echo "== stopping fiberd (SIGTERM)"
kill -TERM "$fiberd_pid"
status=0
wait "$fiberd_pid" || status=$?
fiberd_pid=
if [[ $status -ne 0 ]]; then
	echo "demo: fiberd exited with status $status" >&2
	tail -20 "$work/fiberd.log" >&2
	exit 1
fi
echo "fiberd exited 0: every fiber released, every zygote stopped."
