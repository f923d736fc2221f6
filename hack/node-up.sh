#!/usr/bin/env bash
# node-up.sh - a throw-away Kubernetes node on this machine, joined to a control plane of
# hack/kube-up.sh: containerd and runc (Debian packages) run the Pods, the Debian CNI plugins wire
# them to a bridge, a kubelet runs the node, CoreDNS serves its cluster DNS. The primary node of a
# control plane also runs what a cluster runs once: kube-scheduler, kube-controller-manager
# (ServiceAccounts, namespace deletion, garbage collection, EndpointSlices) and kube-proxy
# (Services' virtual IPs, in nftables). Images are never pulled: import them (hack/images.sh).
#
# Usage (as root):
#   hack/node-up.sh start  KUBEDIR DIR   start the node with everything it writes under DIR (made if
#                                        needed). KUBEDIR is a running kube-up.sh directory started
#                                        with FIBERD_KUBE_NODE_ADDRESS (see kube-up.sh). Returns once
#                                        the Node is Ready; prints the node's name.
#   hack/node-up.sh import DIR TAR...    import image tarballs into the node's containerd (k8s.io).
#   hack/node-up.sh status DIR           print the node's processes; exit 0 only when they all run.
#   hack/node-up.sh stop   DIR           stop everything the node started, the Pods it still runs
#                                        included: no process, mount, bridge, cgroup, nftables
#                                        table, kernel setting or file outside DIR is left behind.
#                                        DIR keeps its files and configuration; the Node object
#                                        stays in the API. Stopping a stopped DIR does nothing.
#   hack/node-up.sh clean  DIR           stop, then remove DIR.
#
# Environment, read by the first start of a DIR and kept in DIR/node.env for every later action:
#   FIBERD_NODE_NAME      node name, also its cgroup root /NAME in every hierarchy (default
#                         fiberd-node)
#   FIBERD_NODE_CIDR      the node's Pod network, an IPv4 /24 (default 10.244.0.0/24); the node's
#                         own address is its .1, on the bridge
#   FIBERD_NODE_BRIDGE    the bridge's name, at most 15 characters (default fiberd0)
#   FIBERD_NODE_PRIMARY   1 (default): also run kube-scheduler, kube-controller-manager and
#                         kube-proxy. One node per control plane does; a second node of the same
#                         control plane sets 0. kube-proxy owns the machine's nftables table
#                         "kube-proxy", so one primary node runs per machine at a time.
#   FIBERD_NODE_CLUSTER_CIDR  every node's Pod networks, for kube-proxy (default 10.244.0.0/16)
# Environment read by every start:
#   FIBERD_NODE_BIN       directory with kubelet, kube-scheduler, kube-controller-manager,
#                         kube-proxy, coredns and kubectl (default
#                         ${FIBERD_KUBE_CACHE:-$HOME/.cache/fiberd/kube}/bin: hack/kube-tools.sh -node)
#   FIBERD_NODE_RUNTIME   directory with containerd, containerd-shim-runc-v2, ctr and runc
#                         (default ${FIBERD_RUNTIME_CACHE:-$HOME/.cache/fiberd/runtime}/bin when it
#                         holds them: hack/runtime.sh's containerd 2.x and runc 1.5, which run
#                         user-namespaced Pods, hostUsers: false; else the Debian packages' on PATH,
#                         containerd 1.6 and runc 1.1, which cannot). "system" forces the latter.
#   FIBERD_NODE_IMAGES    directory with pause.tar, the sandbox image fiberd.local/pause:3.10
#                         (default DIR/images, built there by hack/images.sh when missing)
#   FIBERD_NODE_READY_TIMEOUT  seconds to wait for each process and for the Node (default 90)
#   FIBERD_NODE_WATCH_PID the process whose end cleans the node (DIR removed), so a caller that dies
#                         leaves nothing running (default: the parent of this script, the one that
#                         ran "start"); 0 means no watchdog
#
# Files in DIR: node.env, host.env (the kernel settings found at the first start, put back by
# stop), pki/ (the kubelet's client certificate, CN=system:node:NAME, O=system:nodes, signed by
# KUBEDIR's CA), containerd/ (root and state), runc/, cni/ (configuration, IP allocations),
# kubelet/ (its root directory), pod-logs/, *.yaml/*.toml/Corefile (configurations), *.log, *.pid.
#
# User-namespaced Pods (hostUsers: false) need the runtime of hack/runtime.sh: Kubernetes 1.37 has
# them on by default (UserNamespacesSupport and ProcMountType are GA), the kubelet asks the runtime
# whether it supports them, and containerd 2.x with runc 1.5 give each such Pod 65536 ids of its
# own on idmapped mounts (this kernel idmaps the overlay root file system, the tmpfs and ext4 of the
# volumes). With Debian's containerd 1.6 such a Pod fails to start; every other Pod runs on both.
#
# Needs root, containerd, containerd-shim-runc-v2, runc, ctr, /usr/lib/cni/{bridge,host-local,loopback},
# ip, nft, openssl, setsid, flock (apt-get install containerd runc containernetworking-plugins
# nftables iproute2 openssl). Fails (exit 1, reason on stderr, the last lines of the log of what
# failed) and stops what it started when a start does not complete.
set -euo pipefail

say() { printf 'node-up: %s\n' "$*" >&2; }
fail() { say "error: $*"; exit 1; }
usage() { sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0" >&2; exit 2; }

ACTION=${1:-}
case $ACTION in
start) (($# == 3)) || usage; [[ -d $2 ]] || fail "$2 is not a directory (a kube-up.sh DIR)"; KUBEDIR=$(cd "$2" && pwd); DIR=$3 ;;
import) (($# >= 3)) || usage; DIR=$2 ;;
status | stop | clean) (($# == 2)) || usage; DIR=$2 ;;
*) usage ;;
esac
((EUID == 0)) || fail "must run as root: containerd, runc, the bridge, cgroups and mounts need it"
if [[ $ACTION == start ]]; then
	mkdir -p "$DIR"
elif [[ ! -d $DIR ]]; then
	[[ $ACTION == status ]] && { echo "$DIR does not exist"; exit 1; }
	[[ $ACTION == import ]] && fail "$DIR does not exist"
	exit 0
fi
DIR=$(cd "$DIR" && pwd)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${FIBERD_NODE_BIN:-${FIBERD_KUBE_CACHE:-$HOME/.cache/fiberd/kube}/bin}
TIMEOUT=${FIBERD_NODE_READY_TIMEOUT:-90}
SOCK=$DIR/containerd.sock

# The runtime: what a start chose is kept in DIR/runtime.env, so that stop talks to the
# containerd that runs with the ctr of its own version.
runtime_choose() {
	local d=${FIBERD_NODE_RUNTIME:-${FIBERD_RUNTIME_CACHE:-$HOME/.cache/fiberd/runtime}/bin} t
	RUNTIME=
	if [[ $d != system ]]; then
		for t in containerd containerd-shim-runc-v2 ctr runc; do [[ -x $d/$t ]] || break; done
		if [[ -x $d/$t ]]; then
			RUNTIME=$(cd "$d" && pwd)
		elif [[ -n ${FIBERD_NODE_RUNTIME:-} ]]; then
			fail "FIBERD_NODE_RUNTIME=$d lacks $t (hack/runtime.sh builds the four)"
		fi
	fi
	printf 'RUNTIME=%q\n' "$RUNTIME" >"$DIR/runtime.env"
}
# runtime_vars: CONTAINERD and CTR for RUNTIME.
runtime_vars() {
	CONTAINERD=${RUNTIME:+$RUNTIME/}containerd
	CTR=("${RUNTIME:+$RUNTIME/}ctr" --address "$SOCK" --namespace k8s.io)
}
RUNTIME=
# shellcheck disable=SC1091
[[ -s $DIR/runtime.env ]] && source "$DIR/runtime.env"
runtime_vars

if [[ -s $DIR/node.env ]]; then
	# shellcheck disable=SC1091
	source "$DIR/node.env"
elif [[ $ACTION == start ]]; then
	NAME=${FIBERD_NODE_NAME:-fiberd-node}
	CIDR=${FIBERD_NODE_CIDR:-10.244.0.0/24}
	BRIDGE=${FIBERD_NODE_BRIDGE:-fiberd0}
	PRIMARY=${FIBERD_NODE_PRIMARY:-1}
	CLUSTER_CIDR=${FIBERD_NODE_CLUSTER_CIDR:-10.244.0.0/16}
	[[ $NAME =~ ^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$ ]] || fail "FIBERD_NODE_NAME=$NAME: want a DNS label of at most 42 characters"
	[[ $CIDR =~ ^([0-9]+\.[0-9]+\.[0-9]+)\.0/24$ ]] || fail "FIBERD_NODE_CIDR=$CIDR: want an IPv4 /24 such as 10.244.0.0/24"
	[[ $BRIDGE =~ ^[a-zA-Z0-9_-]{1,15}$ ]] || fail "FIBERD_NODE_BRIDGE=$BRIDGE: want at most 15 letters, digits, - or _"
	[[ $PRIMARY == 0 || $PRIMARY == 1 ]] || fail "FIBERD_NODE_PRIMARY=$PRIMARY: want 0 or 1"
	printf 'NAME=%q\nCIDR=%q\nBRIDGE=%q\nPRIMARY=%q\nCLUSTER_CIDR=%q\n' \
		"$NAME" "$CIDR" "$BRIDGE" "$PRIMARY" "$CLUSTER_CIDR" >"$DIR/node.env"
else
	# Never started (node.env is written before anything else): nothing runs.
	case $ACTION in
	stop) exit 0 ;;
	clean) rm -rf "$DIR"; exit 0 ;;
	status) echo "$DIR was never started"; exit 1 ;;
	*) fail "$DIR has no node.env: it was never started" ;;
	esac
fi
NET=${CIDR%.0/24}
NODEIP=$NET.1

# ------------------------------------------------------------------------------------ processes

# pid_of, halt, spawn, wait_for
# shellcheck source=lib/procs.sh
. "$ROOT/hack/lib/procs.sh"

ms() { echo $((($(date +%s%N) - T0) / 1000000)); }

start_watchdog() {
	local watched=${FIBERD_NODE_WATCH_PID:-$PPID}
	[[ $watched == 0 ]] && return 0
	[[ $watched =~ ^[0-9]+$ ]] && kill -0 "$watched" 2>/dev/null || fail "FIBERD_NODE_WATCH_PID=$watched is not a live process"
	# shellcheck disable=SC2016 # expanded by the inner shell
	spawn watchdog bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done
		echo "node-up watchdog: process $1 is gone; cleaning $3"
		exec "$2" clean "$3"' watchdog "$watched" "$ROOT/hack/node-up.sh" "$DIR/"
}

# pids_grep FILE GREP-ARGS...: PIDs of live processes (zombies excluded) whose /proc/PID/FILE
# matches; one grep reads every process's file, then only the matches are looked at.
pids_grep() {
	local file=$1 f pid
	shift
	for f in $(grep -ls "$@" /proc/[0-9]*/"$file" 2>/dev/null); do
		pid=${f#/proc/}
		pid=${pid%%/*}
		[[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
		[[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) =~ ^[^ZX]$ ]] && echo "$pid"
	done
	return 0
}
# shims: containerd shims whose -address is our socket.
shims() {
	local pid
	for pid in $(pids_grep cmdline -F -- "$SOCK"); do
		tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | awk -v s="$SOCK" 'NR == 1 && $0 !~ /containerd-shim/ {exit 1} p && $0 == s {f = 1} {p = ($0 == "-address")} END {exit !f}' && echo "$pid"
	done
	return 0
}
# node_cgroup_pids: processes whose cgroup, in some hierarchy, lies under /NAME.
node_cgroup_pids() { pids_grep cgroup -E ":/$NAME(/|\$)"; }
# named NAME: processes whose command is NAME (the first 15 characters of it, as the kernel keeps).
named() { pids_grep comm -x -- "${1:0:15}"; }

# ------------------------------------------------------------------------------------ host state

# The kernel settings a node changes: the kubelet sets the first six at start (unless
# protectKernelDefaults), the CNI bridge plugin turns on IPv4 forwarding. host.env records them as
# the first start found them; stop puts them back once no other node runs here.
SYSCTLS=(vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys
	kernel/keys/root_maxbytes net/ipv4/ip_forward net/ipv4/conf/all/route_localnet)
host_record() {
	[[ -s $DIR/host.env ]] && return 0
	local s
	for s in "${SYSCTLS[@]}"; do printf '%s=%s\n' "$s" "$(cat "/proc/sys/$s")"; done >"$DIR/host.env.partial"
	nft list tables | sed -n 's/^table //p' | tr ' ' ':' >"$DIR/nft-tables.before"
	if [[ -e /run/mount ]]; then echo yes; else echo no; fi >"$DIR/run-mount.before"
	mv "$DIR/host.env.partial" "$DIR/host.env"
}
host_restore() {
	[[ -s $DIR/host.env ]] || return 0
	local s v
	while IFS='=' read -r s v; do
		if [[ -n $s && $(cat "/proc/sys/$s" 2>/dev/null) != "$v" ]]; then
			printf '%s\n' "$v" >"/proc/sys/$s" || say "warning: could not restore $s to $v"
		fi
	done <"$DIR/host.env"
	return 0
}
# The kubelet adds iptables chains whatever its configuration says: KUBE-FIREWALL (jumped to from
# filter's INPUT and OUTPUT), KUBE-KUBELET-CANARY and KUBE-IPTABLES-HINT; iptables-nft makes the
# tables to hold them. iptables_clean drops every KUBE-* chain and the jumps to it, then each table
# that did not exist before the first start and now holds nothing (base chains without rules).
iptables_clean() {
	local cmd table line fam name
	for cmd in iptables ip6tables; do
		command -v "$cmd" >/dev/null || continue
		for table in filter nat mangle; do
			{ "$cmd" -t "$table" -S 2>/dev/null || true; } | { grep -E '^-A [A-Z]+ .*-j KUBE-' || true; } | while read -r line; do
				# shellcheck disable=SC2086 # the rule's own words
				"$cmd" -t "$table" -D ${line#-A } 2>/dev/null || true
			done
			{ "$cmd" -t "$table" -S 2>/dev/null || true; } | sed -n 's/^-N \(KUBE-[^ ]*\)$/\1/p' | while read -r line; do
				"$cmd" -t "$table" -F "$line" 2>/dev/null || true
				"$cmd" -t "$table" -X "$line" 2>/dev/null || true
			done
		done
	done
	[[ -s $DIR/nft-tables.before || -e $DIR/nft-tables.before ]] || return 0
	{ nft list tables || true; } | sed -n 's/^table //p' | while read -r fam name; do
		grep -qx "$fam:$name" "$DIR/nft-tables.before" && continue
		[[ $fam:$name == ip:kube-proxy || $fam:$name == ip6:kube-proxy ]] && continue
		if nft list table "$fam" "$name" 2>/dev/null | awk '
			/^\tchain / && $2 !~ /^(INPUT|OUTPUT|FORWARD|PREROUTING|POSTROUTING)$/ {used = 1}
			/^\t\t/ && $1 != "type" {used = 1}
			END {exit used}'; then
			nft delete table "$fam" "$name" || say "warning: could not delete the nftables table $fam $name"
		fi
	done
	return 0
}

# other_node: another kubelet runs on this machine (the kernel settings are then its too).
other_node() {
	local pid
	for pid in $(named kubelet); do
		tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$DIR/" || return 0
	done
	return 1
}

# ------------------------------------------------------------------------------------ cgroups

hierarchies() { awk '$3 == "cgroup" || $3 == "cgroup2" {print $2}' /proc/self/mounts; }
# The kubelet's cgroupRoot must exist in every hierarchy before it starts; v1 cpusets start empty.
cgroup_make() {
	local h
	for h in $(hierarchies); do
		mkdir -p "$h/$NAME"
		if [[ -e $h/cpuset.cpus && -z $(cat "$h/$NAME/cpuset.cpus") ]]; then
			cat "$h/cpuset.cpus" >"$h/$NAME/cpuset.cpus"
			cat "$h/cpuset.mems" >"$h/$NAME/cpuset.mems"
		fi
	done
}
cgroup_remove() {
	local h pid i pids
	# Whatever still runs in the node's cgroups (Pods' processes whose shim is gone) is ours.
	for ((i = 0; i < 50; i++)); do
		pids=$(node_cgroup_pids)
		[[ -z $pids ]] && break
		for pid in $pids; do kill -KILL "$pid" 2>/dev/null || true; done
		sleep 0.1
	done
	[[ -z $pids ]] || say "warning: processes $pids would not leave the cgroups of $NAME"
	for h in $(hierarchies); do
		[[ -d $h/$NAME ]] || continue
		for ((i = 0; i < 20; i++)); do
			find "$h/$NAME" -depth -type d -exec rmdir {} \; 2>/dev/null || true
			[[ -d $h/$NAME ]] || break
			sleep 0.1
		done
		[[ -d $h/$NAME ]] && say "warning: could not remove $h/$NAME"
	done
	return 0
}

# ------------------------------------------------------------------------------------ network

bridge_up() {
	ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
	ip -4 addr show dev "$BRIDGE" | grep -q "inet $NODEIP/" || ip addr add "$NODEIP/24" dev "$BRIDGE"
	ip link set "$BRIDGE" up
}

free_port() {
	local p i
	for ((i = 0; i < 200; i++)); do
		p=$((20000 + RANDOM % 12000))
		(exec 3<>"/dev/tcp/$NODEIP/$p") 2>/dev/null || { echo "$p"; return 0; }
	done
	fail "found no free port on $NODEIP"
}

# ------------------------------------------------------------------------------------ configuration

# containerd_config_v2: containerd 1.6's configuration (Debian's).
containerd_config_v2() {
	cat >"$DIR/containerd.toml" <<-EOF
		# containerd 1.6 (Debian bookworm), written by hack/node-up.sh: every path under $DIR.
		version = 2
		root = "$DIR/containerd/root"
		state = "$DIR/containerd/state"
		[grpc]
		  address = "$SOCK"
		[ttrpc]
		  address = "$SOCK.ttrpc"
		[plugins."io.containerd.internal.v1.opt"]
		  path = "$DIR/containerd/opt"
		[plugins."io.containerd.grpc.v1.cri"]
		  sandbox_image = "fiberd.local/pause:3.10"   # imported, never pulled
		  disable_tcp_service = true
		  stream_server_address = "127.0.0.1"
		  stream_server_port = "0"
		  disable_apparmor = true
		  disable_hugetlb_controller = true
		  tolerate_missing_hugetlb_controller = true
		  # Some VMs drop CAP_SYS_RESOURCE from the bounding set: nobody may then lower a process's
		  # oom_score_adj, and runc fails every sandbox ("can't get final child's PID from pipe:
		  # EOF"). Clamp the score to the caller's instead.
		  restrict_oom_score_adj = true
		  netns_mounts_under_state_dir = true
		  [plugins."io.containerd.grpc.v1.cri".containerd]
		    snapshotter = "overlayfs"
		    default_runtime_name = "runc"
		    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
		      runtime_type = "io.containerd.runc.v2"
		      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
		        SystemdCgroup = false
		        Root = "$DIR/runc"
		  [plugins."io.containerd.grpc.v1.cri".cni]
		    bin_dir = "/usr/lib/cni"
		    conf_dir = "$DIR/cni/net.d"
		    max_conf_num = 1
	EOF
}

# containerd_config_v3: containerd 2.x's configuration (hack/runtime.sh's).
containerd_config_v3() {
	cat >"$DIR/containerd.toml" <<-EOF
		# containerd 2.x (hack/runtime.sh), written by hack/node-up.sh: every path under $DIR.
		# It and runc 1.5 run user-namespaced Pods (hostUsers: false) on idmapped mounts.
		version = 3
		root = "$DIR/containerd/root"
		state = "$DIR/containerd/state"
		# NRI would listen at /var/run/nri/nri.sock, outside DIR; nothing here uses it.
		disabled_plugins = ["io.containerd.nri.v1.nri"]
		[grpc]
		  address = "$SOCK"
		[ttrpc]
		  address = "$SOCK.ttrpc"
		[plugins.'io.containerd.grpc.v1.cri']
		  disable_tcp_service = true
		  stream_server_address = "127.0.0.1"
		  stream_server_port = "0"
		[plugins.'io.containerd.cri.v1.images']
		  snapshotter = "overlayfs"
		  [plugins.'io.containerd.cri.v1.images'.pinned_images]
		    sandbox = "fiberd.local/pause:3.10"   # imported, never pulled
		[plugins.'io.containerd.cri.v1.runtime']
		  disable_apparmor = true
		  disable_hugetlb_controller = true
		  tolerate_missing_hugetlb_controller = true
		  # See the containerd 1.6 configuration: runc fails every sandbox without it on VMs that
		  # drop CAP_SYS_RESOURCE from the bounding set.
		  restrict_oom_score_adj = true
		  netns_mounts_under_state_dir = true
		  [plugins.'io.containerd.cri.v1.runtime'.containerd]
		    default_runtime_name = "runc"
		    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
		      runtime_type = "io.containerd.runc.v2"
		      runtime_path = "$RUNTIME/containerd-shim-runc-v2"
		      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
		        SystemdCgroup = false
		        BinaryName = "$RUNTIME/runc"
		        Root = "$DIR/runc"
		  [plugins.'io.containerd.cri.v1.runtime'.cni]
		    bin_dirs = ["/usr/lib/cni"]
		    conf_dir = "$DIR/cni/net.d"
		    max_conf_num = 1
	EOF
}

write_configs() {
	mkdir -p "$DIR/cni/net.d" "$DIR/kubelet" "$DIR/pod-logs" "$DIR/volume-plugins" "$DIR/containerd"
	# A user-namespaced container's root is a host id that owns nothing: it must be able to pass
	# through every directory down to its root file system under DIR/containerd (which containerd
	# makes 0700, as mktemp makes DIR), else runc fails the sandbox with "remount-propagation
	# dst=.../rootfs, flags=MS_PRIVATE: permission denied".
	chmod go+x "$DIR" "$DIR/containerd"
	local d=$DIR
	while d=$(dirname "$d") && [[ $d != / ]]; do
		[[ $(($(stat -c '%#a' "$d") & 1)) == 1 ]] || fail "$d is closed to others (mode $(stat -c '%a' "$d")): user-namespaced Pods (hostUsers: false) could not reach their root file systems under $DIR; choose a DIR whose parents others may pass through"
	done
	if ((CONTAINERD_MAJOR >= 2)); then containerd_config_v3; else containerd_config_v2; fi
	cat >"$DIR/cni/net.d/10-fiberd.conflist" <<-EOF
		{"cniVersion": "1.0.0", "name": "$NAME", "plugins": [
		  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
		   "ipam": {"type": "host-local", "dataDir": "$DIR/cni/ipam",
		            "ranges": [[{"subnet": "$CIDR", "gateway": "$NODEIP"}]],
		            "routes": [{"dst": "0.0.0.0/0"}]}},
		  {"type": "loopback"}]}
	EOF
	# Pods resolve through CoreDNS on the node's address; no search domain of the host leaks in.
	printf 'nameserver %s\n' "$NODEIP" >"$DIR/resolv.conf"
	cat >"$DIR/kubelet.yaml" <<-EOF
		apiVersion: kubelet.config.k8s.io/v1beta1
		kind: KubeletConfiguration
		failCgroupV1: false              # kubelet 1.35+ refuses cgroup v1 (hybrid included) unless false
		cgroupDriver: cgroupfs           # containerd 1.6 lacks the RuntimeConfig call; 1.37 falls back to this
		cgroupRoot: /$NAME
		containerRuntimeEndpoint: unix://$SOCK
		address: $NODEIP
		port: $KPORT
		readOnlyPort: 0
		healthzPort: 0
		authentication:
		  anonymous: {enabled: false}
		  webhook: {enabled: true}
		  x509: {clientCAFile: "$DIR/pki/ca.crt"}
		authorization: {mode: Webhook}
		clusterDNS: [$NODEIP]
		clusterDomain: cluster.local
		resolvConf: $DIR/resolv.conf
		failSwapOn: false
		serializeImagePulls: false
		imageGCHighThresholdPercent: 100 # never collect the imported images
		imageGCLowThresholdPercent: 99
		evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
		syncFrequency: 10s
		fileCheckFrequency: 10s
		nodeStatusReportFrequency: 10s
		nodeStatusUpdateFrequency: 10s
		maxPods: 64
		podLogsDir: $DIR/pod-logs          # default /var/log/pods
		# Default /usr/libexec/kubernetes/kubelet-plugins/volume/exec, which kube-controller-manager also
		# creates (--flex-volume-plugin-dir, below): both point under DIR instead.
		volumePluginDir: $DIR/volume-plugins
	EOF
	cat >"$DIR/Corefile" <<-EOF
		cluster.local:53 in-addr.arpa:53 {
		    bind $NODEIP
		    errors
		    kubernetes cluster.local in-addr.arpa {
		        kubeconfig $DIR/admin.kubeconfig
		    }
		}
	EOF
	if [[ $PRIMARY == 1 ]]; then
		cat >"$DIR/scheduler.yaml" <<-EOF
			apiVersion: kubescheduler.config.k8s.io/v1
			kind: KubeSchedulerConfiguration
			clientConnection: {kubeconfig: "$DIR/admin.kubeconfig"}
			leaderElection: {leaderElect: false}
		EOF
	fi
}

# The kubelet's identity: CN=system:node:NAME, O=system:nodes, signed by the control plane's CA.
node_pki() {
	local p=$DIR/pki
	if [[ ! -s $p/kubelet.crt ]] || ! cmp -s "$p/ca.crt" "$KUBEDIR/pki/ca.crt"; then
		mkdir -p -m 0700 "$p"
		(
			set -e
			cd "$p"
			umask 077
			openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out kubelet.key 2>/dev/null
			openssl req -new -key kubelet.key -subj "/O=system:nodes/CN=system:node:$NAME" -out kubelet.csr 2>/dev/null
			printf '%s\n' basicConstraints=CA:FALSE keyUsage=critical,digitalSignature,keyEncipherment extendedKeyUsage=clientAuth >kubelet.ext
			openssl x509 -req -sha256 -days 3650 -in kubelet.csr -CA "$KUBEDIR/pki/ca.crt" -CAkey "$KUBEDIR/pki/ca.key" \
				-CAcreateserial -CAserial "$p/ca.srl" -extfile kubelet.ext -out kubelet.crt 2>/dev/null
			rm -f kubelet.csr kubelet.ext ca.srl
			cp "$KUBEDIR/pki/ca.crt" ca.crt
		) || fail "making the node's certificate failed"
	fi
	cat >"$DIR/kubelet.kubeconfig" <<-EOF
		apiVersion: v1
		kind: Config
		clusters: [{name: local, cluster: {server: "$(<"$KUBEDIR/api.url")", certificate-authority: "$p/ca.crt"}}]
		users: [{name: kubelet, user: {client-certificate: "$p/kubelet.crt", client-key: "$p/kubelet.key"}}]
		contexts: [{name: local, context: {cluster: local, user: kubelet}}]
		current-context: local
	EOF
}

# ------------------------------------------------------------------------------------ start

kc() { "$BIN/kubectl" --kubeconfig "$KUBEDIR/kubeconfig" --cache-dir "$DIR/kubectl-cache" "$@"; }
containerd_ok() { "${CTR[@]}" version >/dev/null 2>&1; }
node_ready() { [[ $(kc get node "$NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]; }
# dns_ok: CoreDNS listens on NODEIP:53 (it binds once the kubernetes plugin has synced).
dns_ok() {
	local a b c d
	IFS=. read -r a b c d <<<"$NODEIP"
	awk -v want="$(printf '%02X%02X%02X%02X:0035' "$d" "$c" "$b" "$a")" '$2 == want {f = 1} END {exit !f}' /proc/net/udp
}
proxy_ok() { nft list table ip kube-proxy >/dev/null 2>&1; }

start() {
	local t
	T0=$(date +%s%N)
	if pid_of kubelet >/dev/null || pid_of containerd >/dev/null; then fail "already running in $DIR; stop it first"; fi
	runtime_choose
	runtime_vars
	if [[ -z $RUNTIME ]]; then
		for t in containerd containerd-shim-runc-v2 runc ctr; do
			command -v "$t" >/dev/null || fail "$t not found: run hack/runtime.sh (containerd 2.x and runc 1.5, user namespaces) or apt-get install containerd runc"
		done
	fi
	for t in ip nft openssl setsid flock; do
		command -v "$t" >/dev/null || fail "$t not found (apt-get install containernetworking-plugins nftables iproute2 openssl)"
	done
	CONTAINERD_MAJOR=$("$CONTAINERD" --version | awk '{sub(/^v/, "", $3); split($3, v, "."); print v[1]}')
	[[ $CONTAINERD_MAJOR =~ ^[0-9]+$ ]] || fail "cannot read $CONTAINERD's version: $("$CONTAINERD" --version 2>&1 | head -n 1)"
	for t in bridge host-local loopback; do [[ -x /usr/lib/cni/$t ]] || fail "no /usr/lib/cni/$t (apt-get install containernetworking-plugins)"; done
	for t in kubelet coredns kubectl; do [[ -x $BIN/$t ]] || fail "no $t in $BIN: run \`make node-tools\` (hack/kube-tools.sh -node)"; done
	if [[ $PRIMARY == 1 ]]; then
		for t in kube-scheduler kube-controller-manager kube-proxy; do [[ -x $BIN/$t ]] || fail "no $t in $BIN: run \`make node-tools\` (hack/kube-tools.sh -node)"; done
	fi
	[[ -s $KUBEDIR/pki/ca.key && -s $KUBEDIR/api.url && -s $KUBEDIR/kubeconfig ]] || fail "$KUBEDIR is not a kube-up.sh directory"
	((${#SOCK} < 100)) || fail "DIR is too long for containerd's socket (${#SOCK} bytes; limit 100): use a shorter DIR"
	if ip link show "$BRIDGE" >/dev/null 2>&1 && ! ip -4 addr show dev "$BRIDGE" | grep -q "inet $NODEIP/"; then
		fail "a bridge $BRIDGE without $NODEIP exists: another node uses it; set FIBERD_NODE_BRIDGE and FIBERD_NODE_CIDR"
	fi
	if [[ $PRIMARY == 1 ]]; then
		local other
		other=$(named kube-proxy | head -n 1)
		[[ -z $other ]] || fail "kube-proxy $other already runs on this machine ($(tr '\0' ' ' <"/proc/$other/cmdline" | cut -c1-120)): one primary node per machine; start this one with FIBERD_NODE_PRIMARY=0 on the same control plane, or stop the other"
	fi
	trap 'rc=$?; ((rc == 0)) || { say "start failed; stopping what it started"; stop_all; }; exit $rc' EXIT
	trap 'exit 130' INT TERM HUP

	local images=${FIBERD_NODE_IMAGES:-$DIR/images}
	if [[ ! -s $images/pause.tar ]]; then
		say "no $images/pause.tar; building the images with hack/images.sh"
		"$ROOT/hack/images.sh" "$images" || fail "building the images failed"
	fi
	# First, so that should the caller die while we start, what we started is cleaned (the
	# watchdog waits for our lock, so it acts once this script is done).
	start_watchdog
	host_record
	bridge_up
	KPORT=$(free_port)
	write_configs
	# The clients that act for the cluster (CoreDNS, kube-proxy, the scheduler and the controllers)
	# use the control plane's admin identity, through a copy under DIR: every process of the node
	# names DIR on its command line, which is how pid_of knows it.
	install -m 0600 "$KUBEDIR/kubeconfig" "$DIR/admin.kubeconfig"
	cgroup_make
	spawn containerd "$CONTAINERD" --config "$DIR/containerd.toml"
	wait_for containerd "$TIMEOUT" 0.1 containerd_ok
	"${CTR[@]}" images import "$images/pause.tar" >/dev/null || fail "importing $images/pause.tar failed"
	say "containerd ready at $(ms) ms"
	spawn coredns "$BIN/coredns" -conf "$DIR/Corefile"
	node_pki
	spawn kubelet "$BIN/kubelet" --config="$DIR/kubelet.yaml" --kubeconfig="$DIR/kubelet.kubeconfig" \
		--root-dir="$DIR/kubelet" --cert-dir="$DIR/kubelet/pki" --hostname-override="$NAME" --node-ip="$NODEIP" --v=1
	if [[ $PRIMARY == 1 ]]; then
		spawn kube-proxy "$BIN/kube-proxy" --proxy-mode=nftables --kubeconfig="$DIR/admin.kubeconfig" \
			--hostname-override="$NAME" --cluster-cidr="$CLUSTER_CIDR" --masquerade-all \
			--nodeport-addresses="$NODEIP/32" --healthz-bind-address= --metrics-bind-address= \
			--conntrack-max-per-core=0 --conntrack-tcp-timeout-established=0 --conntrack-tcp-timeout-close-wait=0 \
			--v=1
		spawn scheduler "$BIN/kube-scheduler" --config="$DIR/scheduler.yaml" --secure-port=0 --v=1
		spawn controller-manager "$BIN/kube-controller-manager" --kubeconfig="$DIR/admin.kubeconfig" \
			--secure-port=0 --leader-elect=false --root-ca-file="$KUBEDIR/pki/ca.crt" \
			--service-account-private-key-file="$KUBEDIR/pki/sa.key" --cert-dir="$DIR/controller-manager" \
			--cluster-cidr="$CLUSTER_CIDR" --flex-volume-plugin-dir="$DIR/volume-plugins" --v=1
	fi
	wait_for kubelet "$TIMEOUT" 0.1 node_ready
	say "node $NAME Ready at $(ms) ms"
	# The node lifecycle controller lifts the not-ready taint of a Ready node; without one (no
	# primary node yet) nothing would.
	kc taint node "$NAME" node.kubernetes.io/not-ready:NoSchedule- >/dev/null 2>&1 || true
	wait_for coredns "$TIMEOUT" 0.1 dns_ok
	if [[ $PRIMARY == 1 ]]; then
		wait_for kube-proxy "$TIMEOUT" 0.1 proxy_ok
		pid_of scheduler >/dev/null || { tail -n 25 "$DIR/scheduler.log" >&2; fail "kube-scheduler exited (log: $DIR/scheduler.log)"; }
		pid_of controller-manager >/dev/null || { tail -n 25 "$DIR/controller-manager.log" >&2; fail "kube-controller-manager exited (log: $DIR/controller-manager.log)"; }
	fi
	trap - EXIT INT TERM HUP
	say "ready in $(ms) ms: node $NAME at $NODEIP (bridge $BRIDGE, Pods $CIDR), kubelet $(<"$DIR/kubelet.pid") on port $KPORT"
	printf '%s\n' "$NAME"
}

# ------------------------------------------------------------------------------------ stop

stop_all() {
	local id pid m i
	halt watchdog 0
	halt controller-manager 50
	halt scheduler 50
	halt kubelet 100
	if pid_of containerd >/dev/null; then
		# The kubelet leaves its Pods running when it exits: kill every task, then drop it and its
		# container (sandboxes included).
		for id in $("${CTR[@]}" tasks ls -q 2>/dev/null); do "${CTR[@]}" tasks kill -a -s SIGKILL "$id" >/dev/null 2>&1 || true; done
		for id in $("${CTR[@]}" tasks ls -q 2>/dev/null); do "${CTR[@]}" tasks delete -f "$id" >/dev/null 2>&1 || true; done
		for id in $("${CTR[@]}" containers ls -q 2>/dev/null); do "${CTR[@]}" containers delete "$id" >/dev/null 2>&1 || true; done
	fi
	halt containerd 100
	# A shim that outlived containerd is ours when its -address is our socket.
	for pid in $(shims); do kill -KILL "$pid" 2>/dev/null || true; done
	halt coredns 50
	# kube-proxy's rules outlive it: --cleanup removes its tables, once ours is gone and when no
	# other kube-proxy runs here (the table would then be that one's).
	if [[ -e $DIR/kube-proxy.pid ]]; then
		halt kube-proxy 50
		if [[ -z $(named kube-proxy) ]]; then
			"$BIN/kube-proxy" --cleanup --proxy-mode=nftables >>"$DIR/kube-proxy.log" 2>&1 \
				|| say "warning: kube-proxy --cleanup failed (log: $DIR/kube-proxy.log)"
		fi
	fi
	cgroup_remove
	# Overlay root file systems, /dev/shm, network namespaces, volumes, the kubelet's bind mount of
	# its root directory on itself: deepest first, lazily when busy.
	for ((i = 0; i < 5; i++)); do
		m=$(awk -v d="$DIR/" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r)
		[[ -z $m ]] && break
		while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done <<<"$m"
	done
	if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link delete "$BRIDGE" || say "warning: could not delete the bridge $BRIDGE"; fi
	host_paths_clean
	if ! other_node; then
		iptables_clean
		host_restore
	fi
	rm -rf "$DIR/cni/ipam" "$SOCK" "$SOCK.ttrpc"
	return 0
}

# Paths outside DIR that kubelet 1.37, containerd 1.6 and libcni use whatever they are told:
#   /var/log/containers/*.log       links into podLogsDir (the kubelet's container log links)
#   /var/lib/kubelet/device-plugins/kubelet.sock   (the device manager's socket)
#   /var/lib/cni/results/NET-ID-IF  libcni's cache of a sandbox's network (left when a sandbox was
#                                   killed without its CNI DEL, as stop does)
#   /run/containerd/s/HASH          shims' sockets (their shims remove them; empty directories stay)
#   /run/mount                      libmount's runtime directory, made by the first mount(8) on a
#                                   machine (the kubelet's bind mounts)
host_paths_clean() {
	local l d id
	for l in /var/log/containers/*.log; do
		[[ -L $l && $(readlink "$l") == "$DIR/"* ]] && rm -f "$l"
	done
	for d in "$DIR"/containerd/{root,state}/io.containerd.grpc.v1.cri/sandboxes/*; do
		[[ -d $d ]] || continue
		id=${d##*/}
		rm -f /var/lib/cni/results/*-"$id"-*
	done
	if ! other_node; then
		# libmount's runtime directory: the first mount(8) on a machine makes it (the kubelet's
		# bind mounts do). Removed when it was not there before the first start and holds no
		# mount options of anyone's (an empty utab).
		if [[ $(cat "$DIR/run-mount.before" 2>/dev/null) == no && -d /run/mount && ! -s /run/mount/utab ]]; then
			rm -f /run/mount/utab /run/mount/utab.lock /run/mount/utab.act
			rmdir /run/mount 2>/dev/null || say "warning: /run/mount holds more than libmount's empty utab; left"
		fi
		rm -f /var/lib/kubelet/device-plugins/kubelet.sock
		rmdir /var/lib/kubelet/device-plugins /var/lib/kubelet /var/log/containers 2>/dev/null || true
		rmdir /var/lib/cni/results /var/lib/cni 2>/dev/null || true
		rmdir /run/containerd/s /run/containerd/fifo /run/containerd/runc/k8s.io /run/containerd/runc /run/containerd 2>/dev/null || true
	fi
	return 0
}

status() {
	local n pid rc=0 names=(containerd coredns kubelet)
	[[ $PRIMARY == 1 ]] && names+=(kube-proxy scheduler controller-manager)
	for n in "${names[@]}"; do
		if pid=$(pid_of "$n"); then echo "$n $pid"; else echo "$n not running"; rc=1; fi
	done
	echo "node $NAME at $NODEIP, bridge $BRIDGE, Pods $CIDR, state $DIR"
	return $rc
}

# One action at a time per DIR. The lock's descriptor is closed in every process spawn starts.
exec 9>"$DIR/.lock"
flock 9

case $ACTION in
start) start ;;
import)
	shift 2
	for t in "$@"; do "${CTR[@]}" images import "$t" >/dev/null || fail "importing $t failed"; done
	;;
status) status ;;
stop)
	T0=$(date +%s%N)
	stop_all
	say "stopped $DIR in $(ms) ms"
	;;
clean)
	T0=$(date +%s%N)
	stop_all
	exec 9>&-
	rm -rf "$DIR"
	say "removed $DIR in $(ms) ms"
	;;
esac
