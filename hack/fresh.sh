#!/usr/bin/env bash
# fresh.sh - make this machine look, to .ci/run, like a machine it has never run on: remove
# everything the repository's scripts and suites put on the host, so that a developer can rehearse
# CI's first run (the cold tool builds, the package installs, every first-start-only path) before
# calling an issue resolved.
#
# Usage (as root): hack/fresh.sh [-go] [-n]
#   -go   also empty Go's build, test, fuzz and module caches (go clean -cache -fuzzcache -modcache):
#         the first `go vet` then downloads and compiles every module, as on a new machine
#   -n    print what would be removed and do nothing
#
# What it removes:
#   - the caches of hack/kube-tools.sh and hack/criu.sh (FIBERD_KUBE_CACHE, FIBERD_CRIU_CACHE, and
#     ~/.cache/fiberd around them) and what fiberd itself keeps outside a state directory
#     (/var/cache/fiberd, the example copies; /dev/shm/fiberd-criu, CRIU's kernel-data cache; /dev/shm/fiberd-isolation, the covers' empty directory and the shelf's mount point);
#     fiberd's default state and run directories (/var/lib/fiberd, /run/fiberd);
#   - what a kubelet, containerd, runc and the CNI plugins keep in their default places (a node of
#     hack/node-up.sh keeps its own under its directory; these are what they use whatever they are
#     told, or what an older node-up.sh let them use), libmount's /run/mount when its utab is
#     empty, and a node's bridge, nftables table and cgroup when nothing runs in them, and the
#     endpoint guard's nftables tables of fiberd processes that are gone;
#   - the Debian packages that .ci/run and hack/criu.sh installed, as hack/lib/packages.sh recorded
#     them (apt-get purge); a package the machine had before is never in the record. Packages those
#     scripts use that are installed without a record (an install from before the record existed)
#     are named, not removed.
#
# Refuses (exit 1) while a kubelet, containerd, etcd, kube-apiserver or fiberd runs: stop them first
# (hack/node-up.sh stop, hack/kube-up.sh stop), or they would lose files they use.
set -euo pipefail

say() { printf 'fresh: %s\n' "$*" >&2; }
fail() { say "error: $*"; exit 1; }
usage() { sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0" >&2; exit 2; }

GO_CACHES=0 DRY=0
for a in "$@"; do
	case $a in
	-go) GO_CACHES=1 ;;
	-n) DRY=1 ;;
	*) usage ;;
	esac
done
((EUID == 0)) || fail "must run as root: it removes packages and files root's suites made"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=lib/packages.sh
. "$ROOT/hack/lib/packages.sh"
export PATH=/usr/local/go/bin:$PATH

# run CMD...: run it, or only print it under -n.
run() {
	if ((DRY)); then printf 'would run: %s\n' "$*"; else "$@"; fi
}
# remove PATH...: remove each that exists, saying so.
remove() {
	local p
	for p in "$@"; do
		[[ -e $p || -L $p ]] || continue
		if ((DRY)); then printf 'would remove: %s\n' "$p"; else say "removing $p"; rm -rf -- "$p"; fi
	done
}

# ------------------------------------------------------------------------------------ refuse

busy=()
for name in kubelet containerd etcd kube-apiserver fiberd; do
	for pid in $(pgrep -x "$name" || true); do busy+=("$name ($pid)"); done
done
((${#busy[@]} == 0)) || fail "still running: ${busy[*]}; stop them first (hack/node-up.sh stop DIR, hack/kube-up.sh stop DIR, SIGTERM to fiberd)"

# ------------------------------------------------------------------------------------ caches and state

kube_cache=${FIBERD_KUBE_CACHE:-$HOME/.cache/fiberd/kube}
criu_cache=${FIBERD_CRIU_CACHE:-$HOME/.cache/fiberd/criu}
remove "$kube_cache" "$criu_cache" "$HOME/.cache/fiberd" /var/cache/fiberd /dev/shm/fiberd-criu /dev/shm/fiberd-isolation \
	/var/lib/fiberd /run/fiberd
# kubectl's discovery cache, which suites of older checkouts filled with every test cluster's port,
# and ~/.kube itself when that was all it held.
remove "$HOME/.kube/cache"
if ((!DRY)) && [[ -d $HOME/.kube ]]; then rmdir "$HOME/.kube" 2>/dev/null || true; fi

# The places a kubelet, containerd, runc, libcni and the flexvolume prober use by default.
remove /var/lib/kubelet /var/lib/containerd /run/containerd /run/runc /var/lib/cni /etc/cni /opt/cni \
	/var/log/containers /var/log/pods /usr/libexec/kubernetes /etc/kubernetes

# libmount's runtime directory, which the first mount(8) on a machine makes, when it holds nothing.
if [[ -d /run/mount && ! -s /run/mount/utab ]]; then remove /run/mount; fi

# A node's network and cgroups (defaults of hack/node-up.sh), when a stop did not run.
if ip link show fiberd0 >/dev/null 2>&1; then run ip link delete fiberd0; fi
if command -v nft >/dev/null; then
	for fam in ip ip6; do
		if nft list table "$fam" kube-proxy >/dev/null 2>&1; then run nft delete table "$fam" kube-proxy; fi
	done
	# The endpoint guard's tables (inet fiberd_<pid namespace>_<pid>_<n>) of processes of this PID
	# namespace that are gone; a live backend's is its own (fiberd deletes a dead one's at its next
	# start too), and another PID namespace's pids mean nothing here.
	pidns=$(stat -L -c %i /proc/self/ns/pid)
	for t in $(nft list tables inet 2>/dev/null | awk -v ns="$pidns" '$1 == "table" && $3 ~ ("^fiberd_" ns "_[0-9]+_[0-9]+$") {print $3}'); do
		pid=${t#fiberd_"$pidns"_}
		pid=${pid%%_*}
		if ! kill -0 "$pid" 2>/dev/null; then run nft delete table inet "$t"; fi
	done
fi
for h in $(awk '$3 == "cgroup" || $3 == "cgroup2" {print $2}' /proc/self/mounts); do
	[[ -d $h/fiberd-node ]] || continue
	if [[ -n $(find "$h/fiberd-node" -name cgroup.procs -size +0c 2>/dev/null | head -n 1) ]]; then
		say "warning: $h/fiberd-node still holds processes; left alone"
	elif ((DRY)); then
		printf 'would remove: %s\n' "$h/fiberd-node"
	else
		find "$h/fiberd-node" -depth -type d -exec rmdir {} \; 2>/dev/null || say "warning: could not remove $h/fiberd-node"
	fi
done

# ------------------------------------------------------------------------------------ packages

if [[ -s $FIBERD_PACKAGES_RECORD ]]; then
	mapfile -t recorded < <(grep -v '^$' "$FIBERD_PACKAGES_RECORD")
	mapfile -t present < <(comm -12 <(printf '%s\n' "${recorded[@]}" | sort -u) <(pkg_installed_set))
	if ((${#present[@]})); then
		((DRY)) || say "purging ${#present[@]} packages our scripts installed: ${present[*]}"
		run env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 purge -y -qq "${present[@]}"
	fi
fi
remove "$(dirname "$FIBERD_PACKAGES_RECORD")"
# What .ci/run and hack/criu.sh install, installed here without a record.
known=(containerd runc containernetworking-plugins nftables criu libbsd-dev libcap-dev libnet1-dev
	libnl-3-dev libnl-route-3-dev libprotobuf-c-dev libprotobuf-dev protobuf-c-compiler protobuf-compiler)
mapfile -t unrecorded < <(comm -12 <(printf '%s\n' "${known[@]}" | sort -u) <(pkg_installed_set))
if ((${#unrecorded[@]})) && ! ((DRY)); then
	say "note: installed, but not recorded as installed by our scripts (left alone): ${unrecorded[*]}"
	say "      a new machine of this kind has none of them; apt-get purge them to rehearse its first run"
fi

# ------------------------------------------------------------------------------------ Go

if ((GO_CACHES)); then
	command -v go >/dev/null || fail "go is not on PATH"
	if ((DRY)); then
		printf 'would empty: %s %s\n' "$(go env GOCACHE)" "$(go env GOMODCACHE)"
	else
		say "emptying $(go env GOCACHE) and $(go env GOMODCACHE)"
		go clean -cache -fuzzcache -modcache
		remove "$(go env GOPATH)/pkg/sumdb" # the checksum database's cache, beside the modules
	fi
fi
((DRY)) || say "done: this machine now looks new to .ci/run"
