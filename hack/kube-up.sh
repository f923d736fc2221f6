#!/usr/bin/env bash
# kube-up.sh - a throw-away Kubernetes control plane on loopback: one etcd and one kube-apiserver,
# nothing else (no scheduler, no controller-manager, no kubelet). fiberd's integration tests and
# developers run it; test/kubeapi drives it from Go.
#
# Usage:
#   hack/kube-up.sh start  DIR   make DIR if needed, start etcd and kube-apiserver with their state in
#                                DIR, wait until /readyz answers 200 and print DIR/kubeconfig on stdout.
#                                A DIR used before keeps its PKI, its etcd data and its API port.
#   hack/kube-up.sh stop   DIR   stop what DIR records (SIGTERM, then SIGKILL after 10 s); returns once
#                                every process is gone. Stopping a stopped DIR is not an error.
#   hack/kube-up.sh status DIR   print the PIDs and the /readyz code; exit 0 only when both run and
#                                /readyz is 200.
#   hack/kube-up.sh clean  DIR   stop at once (SIGKILL) and remove DIR.
#
# What runs:
#   - etcd on a unix socket DIR/etcd.sock (no TCP port), without fsync (the data is throw-away).
#   - kube-apiserver on https://127.0.0.1:PORT with: its own CA and serving certificate; client
#     certificates (the admin one is O=system:masters); --authorization-mode=RBAC; service-account
#     signing keys, so the TokenRequest and TokenReview APIs work; resource.k8s.io/v1 served; the
#     ServiceAccount admission plugin off (nothing would create "default" ServiceAccounts here).
#     With FIBERD_KUBE_NODE_ADDRESS it is set up for nodes instead (see there), and
#     hack/node-up.sh adds the kubelet, the scheduler and the controllers.
#   - a watchdog that stops both once the process that ran "start" is gone (see FIBERD_KUBE_WATCH_PID).
#
# Environment (optional):
#   FIBERD_KUBE_BIN              directory with kube-apiserver and etcd
#                                (default ${FIBERD_KUBE_CACHE:-$HOME/.cache/fiberd/kube}/bin, which
#                                hack/kube-tools.sh fills; `make kube-tools` runs it)
#   FIBERD_KUBE_RUNTIME_CONFIG   --runtime-config (default resource.k8s.io/v1=true); for instance
#                                resource.k8s.io/v1=false,resource.k8s.io/v1beta2=true
#   FIBERD_KUBE_APISERVER_ARGS   more kube-apiserver flags, split on white space
#   FIBERD_KUBE_SA_ISSUER        --service-account-issuer (default https://kubernetes.default.svc)
#   FIBERD_KUBE_NODE_ADDRESS     serve real nodes (hack/node-up.sh): this IPv4 address is the first
#                                node's (node-up's bridge address, e.g. 10.244.0.1), which the API
#                                server advertises as the endpoint of the "kubernetes" Service, so
#                                Pods reach it through kube-proxy. The API server then listens on
#                                every address (anonymous requests refused), authorizes with Node
#                                and RBAC, admits with NodeRestriction and ServiceAccount (Pods get
#                                their account's token mounted), reconciles the "kubernetes"
#                                endpoints, and reaches kubelets (logs, exec) with the admin
#                                certificate at their InternalIP. Default empty: loopback only.
#   FIBERD_KUBE_WATCH_PID        the process whose end stops the control plane (default: the parent of
#                                this script, the one that ran "start"); 0 means no watchdog, so the
#                                control plane runs until "stop"
#   FIBERD_KUBE_WATCH_ACTION     what the watchdog does then: stop (default) keeps DIR, clean removes it
#   FIBERD_KUBE_READY_TIMEOUT    seconds to wait for etcd and /readyz (default 60)
#
# Files in DIR: kubeconfig (admin; CA, client certificate and key embedded), api.url, api.port,
# pki/ (ca.crt, ca.key, apiserver.*, admin.*, sa.key, sa.pub), etcd/ (data), etcd.log,
# apiserver.log, watchdog.log, *.pid.
#
# Needs: bash, openssl, curl, setsid and flock. Fails (exit 1, reason on stderr, the last log lines of
# the process that failed) when a binary is missing, a process exits early or readiness times out;
# a failed start leaves nothing running.
set -euo pipefail

say() { printf 'kube-up: %s\n' "$*" >&2; }
fail() { say "error: $*"; exit 1; }
usage() { sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0" >&2; exit 2; }

ACTION=${1:-}
DIR=${2:-}
[[ -n $ACTION && -n $DIR && $# -eq 2 ]] || usage
case $ACTION in start | stop | status | clean) ;; *) usage ;; esac

if [[ $ACTION == start ]]; then
	mkdir -p "$DIR"
elif [[ ! -d $DIR ]]; then
	[[ $ACTION == status ]] && { echo "$DIR does not exist"; exit 1; }
	exit 0
fi
DIR=$(cd "$DIR" && pwd)
SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
BIN=${FIBERD_KUBE_BIN:-${FIBERD_KUBE_CACHE:-$HOME/.cache/fiberd/kube}/bin}
READY_TIMEOUT=${FIBERD_KUBE_READY_TIMEOUT:-60}
ETCD_SOCK=$DIR/etcd.sock

# ------------------------------------------------------------------------------------ processes

# pid_of, halt, spawn, wait_for
# shellcheck source=lib/procs.sh
. "$(dirname "$SELF")/lib/procs.sh"

# halt_all [now]: the API server first, so it does not log a storm of etcd errors while draining.
halt_all() {
	local grace=100
	[[ ${1:-} == now ]] && grace=0
	halt watchdog 0
	halt apiserver "$grace"
	halt etcd "$grace"
}

# --------------------------------------------------------------------------------------- PKI

# Throw-away PKI, made once per DIR: P-256 keys (fast to make), ten-year certificates.
pki() {
	local p=$DIR/pki
	if [[ -s $p/ca.crt && -s $p/apiserver.crt && -s $p/admin.crt && -s $p/sa.key && -s $p/sa.pub ]]; then return 0; fi
	command -v openssl >/dev/null || fail "openssl is not on PATH"
	rm -rf "$p"
	mkdir -m 0700 -p "$p"
	(
		set -e
		cd "$p"
		umask 077
		key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
		# issue NAME SUBJECT EXTENSIONS...: a certificate for NAME.key signed by the CA
		issue() {
			local name=$1 subj=$2 ext
			shift 2
			key "$name.key"
			openssl req -new -key "$name.key" -subj "$subj" -out "$name.csr" 2>/dev/null
			printf '%s\n' basicConstraints=CA:FALSE keyUsage=critical,digitalSignature,keyEncipherment "$@" >"$name.ext"
			openssl x509 -req -sha256 -days 3650 -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
				-extfile "$name.ext" -out "$name.crt" 2>/dev/null
			rm -f "$name.csr" "$name.ext"
		}
		key ca.key
		openssl req -x509 -new -sha256 -days 3650 -key ca.key -subj "/CN=fiberd-test-ca" \
			-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign -out ca.crt 2>/dev/null
		issue apiserver /CN=kube-apiserver extendedKeyUsage=serverAuth \
			subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
		issue admin "/O=system:masters/CN=fiberd-admin" extendedKeyUsage=clientAuth
		key sa.key
		openssl pkey -in sa.key -pubout -out sa.pub 2>/dev/null
		rm -f ca.srl
	) || fail "making the PKI in $p failed"
	chmod 0644 "$p"/*.crt "$p/sa.pub"
}

kubeconfig() {
	local tmp=$DIR/.kubeconfig.partial
	(
		umask 077
		cat >"$tmp" <<-YAML
			apiVersion: v1
			kind: Config
			clusters:
			- name: fiberd-test
			  cluster:
			    server: https://127.0.0.1:$PORT
			    certificate-authority-data: $(base64 -w0 <"$DIR/pki/ca.crt")
			users:
			- name: fiberd-admin
			  user:
			    client-certificate-data: $(base64 -w0 <"$DIR/pki/admin.crt")
			    client-key-data: $(base64 -w0 <"$DIR/pki/admin.key")
			contexts:
			- name: fiberd-test
			  context:
			    cluster: fiberd-test
			    user: fiberd-admin
			    namespace: default
			current-context: fiberd-test
		YAML
	)
	mv -f "$tmp" "$DIR/kubeconfig"
	printf 'https://127.0.0.1:%s\n' "$PORT" >"$DIR/api.url"
}

# ------------------------------------------------------------------------------------ probes

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# A port nothing listens on, below the ephemeral range so no outgoing connection holds it.
pick_port() {
	local p i
	for ((i = 0; i < 200; i++)); do
		p=$((20000 + RANDOM % 12000))
		port_busy "$p" || { printf '%s\n' "$p"; return 0; }
	done
	fail "found no free port on 127.0.0.1"
}

readyz() {
	curl -s -o /dev/null -w '%{http_code}' --max-time 2 --cacert "$DIR/pki/ca.crt" \
		--cert "$DIR/pki/admin.crt" --key "$DIR/pki/admin.key" "https://127.0.0.1:$PORT/readyz" 2>/dev/null || true
}

etcd_ok() {
	curl -s --max-time 2 --unix-socket "$ETCD_SOCK" http://localhost/health 2>/dev/null | grep -q '"health":"true"'
}

api_ready() { [[ $(readyz) == 200 ]]; }

# --------------------------------------------------------------------------------------- start

start_etcd() {
	local v envs=()
	# etcd reads every ETCD_* variable as a flag; none of the caller's may leak in.
	for v in $(compgen -e); do [[ $v == ETCD_* ]] && envs+=(-u "$v"); done
	((${#ETCD_SOCK} < 100)) || fail "DIR is too long for etcd's unix socket (${#ETCD_SOCK} bytes, limit 100); use a shorter DIR"
	rm -f "$ETCD_SOCK"
	spawn etcd env "${envs[@]}" "$BIN/etcd" --name fiberd --data-dir "$DIR/etcd" \
		--listen-client-urls "unix://$ETCD_SOCK" --advertise-client-urls "unix://$ETCD_SOCK" \
		--listen-peer-urls http://127.0.0.1:0 --initial-advertise-peer-urls http://127.0.0.1:2380 \
		--initial-cluster fiberd=http://127.0.0.1:2380 \
		--unsafe-no-fsync --logger zap --log-level warn
	wait_for etcd $((DEADLINE - SECONDS)) 0.05 etcd_ok
}

start_apiserver() {
	local extra=() mode=()
	# shellcheck disable=SC2206 # word splitting is the documented contract
	[[ -n ${FIBERD_KUBE_APISERVER_ARGS:-} ]] && extra=(${FIBERD_KUBE_APISERVER_ARGS})
	local node=${FIBERD_KUBE_NODE_ADDRESS:-}
	if [[ -n $node ]]; then
		[[ $node =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "FIBERD_KUBE_NODE_ADDRESS=$node: want an IPv4 address"
		mode=(--bind-address=0.0.0.0 --advertise-address="$node" --endpoint-reconciler-type=lease
			--anonymous-auth=false --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction
			--kubelet-client-certificate="$DIR/pki/admin.crt" --kubelet-client-key="$DIR/pki/admin.key"
			--kubelet-preferred-address-types=InternalIP)
	else
		mode=(--bind-address=127.0.0.1 --advertise-address=127.0.0.1 --endpoint-reconciler-type=none
			--authorization-mode=RBAC --disable-admission-plugins=ServiceAccount)
	fi
	spawn apiserver "$BIN/kube-apiserver" \
		"${mode[@]}" --secure-port="$PORT" --service-cluster-ip-range=10.0.0.0/24 \
		--etcd-servers="unix://$ETCD_SOCK" \
		--cert-dir="$DIR/pki/generated" \
		--tls-cert-file="$DIR/pki/apiserver.crt" --tls-private-key-file="$DIR/pki/apiserver.key" \
		--client-ca-file="$DIR/pki/ca.crt" \
		--service-account-issuer="${FIBERD_KUBE_SA_ISSUER:-https://kubernetes.default.svc}" \
		--service-account-key-file="$DIR/pki/sa.pub" \
		--service-account-signing-key-file="$DIR/pki/sa.key" \
		--runtime-config="${FIBERD_KUBE_RUNTIME_CONFIG:-resource.k8s.io/v1=true}" \
		--allow-privileged=true --profiling=false \
		"${extra[@]}"
}

start_watchdog() {
	local watched=${FIBERD_KUBE_WATCH_PID:-$PPID} action=${FIBERD_KUBE_WATCH_ACTION:-stop}
	[[ $watched == 0 ]] && return 0
	[[ $action == stop || $action == clean ]] || fail "FIBERD_KUBE_WATCH_ACTION=$action: want stop or clean"
	[[ $watched =~ ^[0-9]+$ ]] && kill -0 "$watched" 2>/dev/null || fail "FIBERD_KUBE_WATCH_PID=$watched is not a live process"
	# shellcheck disable=SC2016 # expanded by the inner shell
	spawn watchdog bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done
		echo "kube-up watchdog: process $1 is gone; running $4 on $3"
		exec "$2" "$4" "$3"' watchdog "$watched" "$SELF" "$DIR/" "$action"
}

start() {
	local t0 tries
	[[ -x $BIN/kube-apiserver && -x $BIN/etcd ]] || fail "no kube-apiserver or etcd in $BIN; build them with \`make kube-tools\` (hack/kube-tools.sh)"
	command -v curl >/dev/null || fail "curl is not on PATH"
	command -v setsid >/dev/null || fail "setsid is not on PATH"
	if pid_of apiserver >/dev/null || pid_of etcd >/dev/null; then fail "already running in $DIR; stop it first"; fi
	t0=$(date +%s%N)
	DEADLINE=$((SECONDS + READY_TIMEOUT))
	trap 'rc=$?; ((rc == 0)) || { say "start failed; stopping what it started"; halt_all now; }; exit $rc' EXIT
	trap 'exit 130' INT TERM HUP
	pki
	# The watchdog comes first: should the caller die while we start, it stops what we started
	# (it waits for our lock, so it acts once this script is done).
	start_watchdog
	start_etcd
	# Keep the port of an earlier run so clients configured then reach this run too. It may be
	# briefly busy right after a stop; wait a little for it before taking another.
	PORT=
	if [[ -s $DIR/api.port ]]; then
		PORT=$(<"$DIR/api.port")
		for ((tries = 0; tries < 50; tries++)); do port_busy "$PORT" || break; sleep 0.1; done
		if port_busy "$PORT"; then say "port $PORT of the earlier run is taken; choosing another"; PORT=; fi
	fi
	for tries in 1 2 3; do
		[[ -n $PORT ]] || PORT=$(pick_port)
		printf '%s\n' "$PORT" >"$DIR/api.port"
		kubeconfig
		start_apiserver
		if (wait_for apiserver $((DEADLINE - SECONDS)) 0.05 api_ready); then break; fi
		# another process may have taken the port between the probe and the bind
		if ! pid_of apiserver >/dev/null && grep -q 'address already in use' "$DIR/apiserver.log" && ((tries < 3)); then
			say "port $PORT was taken; trying another"
			: >"$DIR/apiserver.log"
			PORT=
			continue
		fi
		exit 1
	done
	trap - EXIT INT TERM HUP
	say "ready in $((($(date +%s%N) - t0) / 1000000)) ms: https://127.0.0.1:$PORT (apiserver $(<"$DIR/apiserver.pid"), etcd $(<"$DIR/etcd.pid"))"
	printf '%s\n' "$DIR/kubeconfig"
}

status() {
	local a e code
	a=$(pid_of apiserver) || { echo "kube-apiserver is not running"; return 1; }
	e=$(pid_of etcd) || { echo "etcd is not running"; return 1; }
	PORT=$(<"$DIR/api.port")
	code=$(readyz)
	echo "kube-apiserver $a on https://127.0.0.1:$PORT, etcd $e, /readyz $code"
	[[ $code == 200 ]]
}

# One action at a time per DIR. The lock's descriptor is closed in every process spawn starts.
exec 9>"$DIR/.lock"
flock 9

case $ACTION in
start) start ;;
stop) halt_all; say "stopped $DIR" ;;
status) status ;;
clean)
	halt_all now
	exec 9>&-
	rm -rf "$DIR"
	say "removed $DIR"
	;;
esac
