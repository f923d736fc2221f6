# shellcheck shell=bash
# procs.sh - the processes a hack/*-up.sh script starts and stops, each recorded as DIR/NAME.pid and
# logging to DIR/NAME.log. Sourced by hack/kube-up.sh and hack/node-up.sh, which set DIR (absolute)
# and define say and fail before they call any of it.

# pid_of NAME: print the PID recorded in DIR/NAME.pid if that process is alive, not a zombie, and
# was started for this DIR (its command line mentions DIR). A recycled PID or a process of another
# DIR is never reported, so never signalled.
pid_of() {
	local file=$DIR/$1.pid pid state
	[[ -s $file ]] || return 1
	pid=$(<"$file")
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
	[[ -n $state && $state != Z ]] || return 1
	tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$DIR/" || return 1
	printf '%s\n' "$pid"
}

# halt NAME GRACE: SIGTERM, up to GRACE tenths of a second, then SIGKILL (GRACE 0: SIGKILL at once);
# returns once it is gone.
halt() {
	local name=$1 grace=$2 pid i
	if ! pid=$(pid_of "$name"); then rm -f "$DIR/$name.pid"; return 0; fi
	if [[ $pid == "$$" ]]; then rm -f "$DIR/$name.pid"; return 0; fi # the watchdog, exec'd into this script
	if ((grace > 0)); then
		kill -TERM "$pid" 2>/dev/null || true
		for ((i = 0; i < grace; i++)); do pid_of "$name" >/dev/null || break; sleep 0.1; done
	fi
	if pid_of "$name" >/dev/null; then
		((grace == 0)) || say "$name ($pid) ignored SIGTERM for $((grace / 10)) s; killing it"
		kill -KILL "$pid" 2>/dev/null || true
		for ((i = 0; i < 100; i++)); do pid_of "$name" >/dev/null || break; sleep 0.05; done
	fi
	rm -f "$DIR/$name.pid"
}

# spawn NAME CMD...: run CMD in a session of its own, stdin from /dev/null, output appended to
# DIR/NAME.log, no file descriptor of ours inherited (the lock, the caller's pipes). The child
# writes its own PID before it execs, so the file is right however setsid forks.
spawn() {
	local name=$1 i
	shift
	rm -f "$DIR/$name.pid"
	# shellcheck disable=SC2016 # expanded by the inner shell
	setsid bash -c 'printf "%s\n" "$$" >"$0.partial" && mv "$0.partial" "$0" && exec "$@"' \
		"$DIR/$name.pid" "$@" </dev/null >>"$DIR/$name.log" 2>&1 9>&- &
	disown "$!" 2>/dev/null || true
	for ((i = 0; i < 200; i++)); do [[ -s $DIR/$name.pid ]] && return 0; sleep 0.01; done
	fail "$name did not start"
}

# wait_for NAME SECONDS INTERVAL PROBE...: run PROBE every INTERVAL seconds until it succeeds; fail,
# with the last lines of DIR/NAME.log, when NAME exits or SECONDS pass.
wait_for() {
	local name=$1 secs=$2 interval=$3 end
	shift 3
	end=$((SECONDS + secs))
	until "$@"; do
		if ! pid_of "$name" >/dev/null; then
			tail -n 25 "$DIR/$name.log" >&2 || true
			fail "$name exited during start (log: $DIR/$name.log)"
		fi
		((SECONDS < end)) || { tail -n 25 "$DIR/$name.log" >&2 || true; fail "$name not ready after $secs s (log: $DIR/$name.log)"; }
		sleep "$interval"
	done
}
