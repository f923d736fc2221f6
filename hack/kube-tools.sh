#!/usr/bin/env bash
# kube-tools.sh - build the Kubernetes binaries fiberd's suites run against, compiled from the Go
# module proxy alone (no container engine, no release downloads):
#   the control plane   kube-apiserver and kubectl (from k8s.io/kubernetes) and etcd (from
#                       go.etcd.io/etcd/server/v3): test/kubeapi, make test-integration, make e2e;
#   the node (-node)    kubelet, kube-scheduler, kube-controller-manager and kube-proxy
#                       (k8s.io/kubernetes, the same version) and coredns (github.com/coredns/coredns,
#                       with the few plugins a node's cluster DNS needs): hack/node-up.sh,
#                       make e2e-node.
#
# Usage: hack/kube-tools.sh [-node] [CACHE]
#
#   -node   also build the node's binaries (after the control plane's).
#   CACHE   default ${FIBERD_KUBE_CACHE:-$HOME/.cache/fiberd/kube}. Binaries land in CACHE/bin,
#           the generated wrapper modules (go.mod/go.sum, a few KB) in CACHE/src. The cache lives
#           outside the repository and is never committed.
#
# Environment (optional):
#   FIBERD_KUBE_VERSION=1.37.2   k8s.io/kubernetes version; staging modules use v0.<minor>.<patch>
#   FIBERD_ETCD_VERSION=3.7.3    go.etcd.io/etcd/server/v3 version
#   FIBERD_COREDNS_VERSION=1.15.0  github.com/coredns/coredns version (-node)
#   GOMODCACHE, GOCACHE, GOPROXY, GOTOOLCHAIN are honoured as by any go command.
#
# Behaviour:
#   - Idempotent: CACHE/bin/.stamp records versions, Go version and build-flag generation of the
#     control plane, CACHE/bin/.stamp-node those of the node's binaries; when a stamp matches and
#     its binaries are present that set is not rebuilt, and with both current the script exits 0 at
#     once (a few milliseconds). The two stamps are independent: a checkout whose script knows only
#     the control plane finds the same cache current.
#   - Safe under concurrent callers: an flock on CACHE/.lock serialises builds; a second caller waits,
#     then finds the stamp and returns. Each binary is written to a temporary name and renamed, so a
#     reader never sees half a file.
#   - Fails (exit 1, message on stderr) when go, flock or the module proxy is unavailable; a failed
#     build removes the stamp so the next run starts over.
#
# Cost (2 cores, Go 1.26): the control plane about 260 s cold (kube-apiserver alone about 210 s),
# about 0.9 GB of module cache and 3 GB of build cache; about 13 s with warm Go caches. The node's
# binaries after that, measured once on a shared machine under a load of about 13: kubelet 611 s,
# kube-scheduler 50 s, kube-controller-manager 334 s, kube-proxy 112 s, coredns 564 s (its own
# module graph, downloads included); on an idle machine kubelet takes about 120 s and
# kube-scheduler 25 s once kube-apiserver is built, so expect about 6 minutes for all five; 191 s to
# link them again with warm Go caches under that load. Peak memory about 2 GB (kubelet).
set -euo pipefail

say() { printf 'kube-tools: %s\n' "$*" >&2; }
fail() { say "error: $*"; exit 1; }

NODE=0
if [[ ${1:-} == -node ]]; then NODE=1; shift; fi
if (($# > 1)) || [[ ${1:-} == -* ]]; then printf 'usage: hack/kube-tools.sh [-node] [CACHE]\n' >&2; exit 2; fi
CACHE=${1:-${FIBERD_KUBE_CACHE:-$HOME/.cache/fiberd/kube}}
KUBE_VERSION=${FIBERD_KUBE_VERSION:-1.37.2}; KUBE_VERSION=${KUBE_VERSION#v}
ETCD_VERSION=${FIBERD_ETCD_VERSION:-3.7.3}; ETCD_VERSION=${ETCD_VERSION#v}
COREDNS_VERSION=${FIBERD_COREDNS_VERSION:-1.15.0}; COREDNS_VERSION=${COREDNS_VERSION#v}
# Bump when the way the binaries are built changes, so caches made by an older script rebuild.
# RECIPE covers the control plane (CACHE/bin/.stamp), NODE_RECIPE the node (CACHE/bin/.stamp-node).
RECIPE=1
NODE_RECIPE=1

if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then PATH=/usr/local/go/bin:$PATH; fi
command -v go >/dev/null 2>&1 || fail "the go command is not on PATH"
command -v flock >/dev/null 2>&1 || fail "flock (util-linux) is not on PATH"

mkdir -p "$CACHE/bin" "$CACHE/src"
CACHE=$(cd "$CACHE" && pwd)
BIN=$CACHE/bin

exec 8>"$CACHE/.lock"
if ! flock -n 8; then
	say "another build holds $CACHE/.lock; waiting"
	flock 8
fi

STAMP="kubernetes=v$KUBE_VERSION etcd=v$ETCD_VERSION $(go env GOVERSION) recipe=$RECIPE"
TOOLS=(kube-apiserver kubectl etcd)
NODE_STAMP="kubernetes=v$KUBE_VERSION coredns=v$COREDNS_VERSION $(go env GOVERSION) node-recipe=$NODE_RECIPE"
KUBE_NODE_TOOLS=(kubelet kube-scheduler kube-controller-manager kube-proxy)
NODE_TOOLS=("${KUBE_NODE_TOOLS[@]}" coredns)

# current STAMPFILE STAMP TOOL...: the stamp file says STAMP and every TOOL is in BIN.
current() {
	local file=$1 want=$2 t
	shift 2
	[[ -r $file && "$(cat "$file")" == "$want" ]] || return 1
	for t in "$@"; do [[ -x $BIN/$t ]] || return 1; done
}
need_cp=1 need_node=0
current "$BIN/.stamp" "$STAMP" "${TOOLS[@]}" && need_cp=0
((NODE)) && ! current "$BIN/.stamp-node" "$NODE_STAMP" "${NODE_TOOLS[@]}" && need_node=1
if ((!need_cp && !need_node)); then
	msg=$STAMP
	((NODE)) && msg+="; $NODE_STAMP"
	say "up to date: $BIN ($msg)"
	exit 0
fi
((need_cp)) && rm -f "$BIN/.stamp"
((need_node)) && rm -f "$BIN/.stamp-node"

export CGO_ENABLED=0
case " ${GOFLAGS:-} " in *" -buildvcs="*) ;; *) export GOFLAGS="${GOFLAGS:+$GOFLAGS }-buildvcs=false" ;; esac
start=$SECONDS

# install_tool PKGDIR PKG NAME LDFLAGS: build PKG inside the wrapper module PKGDIR into BIN/NAME.
install_tool() {
	local dir=$1 pkg=$2 name=$3 ld=$4 t=$SECONDS
	say "compiling $name ..."
	(cd "$dir" && go build -trimpath -ldflags "$ld" -o "$BIN/.$name.partial" "$pkg") || fail "compiling $name failed"
	mv -f "$BIN/.$name.partial" "$BIN/$name"
	say "compiled $name in $((SECONDS - t)) s"
}

# k8s.io/kubernetes cannot be built as a dependency as it is: its go.mod points every staging
# module (k8s.io/api, k8s.io/apiserver, ...) at ./staging/src/..., which is absent from the module
# zip. A wrapper module requires k8s.io/kubernetes and points each of those modules at its
# published v0.<minor>.<patch> tag instead. The list is read from that version's own go.mod.
#
# kube_wrapper DIR MODULE CMD...: make DIR such a wrapper module named MODULE whose go.sum covers
# k8s.io/kubernetes/cmd/CMD for each CMD (resolved again only when the wanted go.mod changed).
kube_wrapper() {
	local dir=$1 module=$2 v=$KUBE_VERSION rest=${KUBE_VERSION#*.} modfile goline want c
	shift 2
	local staging=v0.$rest gets=()
	for c in "$@"; do gets+=("k8s.io/kubernetes/cmd/$c@v$v"); done
	mkdir -p "$dir"
	modfile=$(go mod download -json "k8s.io/kubernetes@v$v" | awk -F'"' '$2 == "GoMod" {print $4}')
	[[ -s $modfile ]] || fail "could not fetch the go.mod of k8s.io/kubernetes@v$v"
	goline=$(awk '$1 == "go" {print $2; exit}' "$modfile")
	want=$(
		printf '// Generated by fiberd hack/kube-tools.sh; safe to delete.\n'
		printf 'module %s\n\ngo %s\n\nrequire k8s.io/kubernetes v%s\n\nreplace (\n' "$module" "$goline" "$v"
		awk -v to="$staging" '$2 == "=>" && index($3, "./staging/") == 1 {printf "\t%s => %s %s\n", $1, $1, to}' "$modfile"
		printf ')\n'
	)
	(($(grep -c ' => ' <<<"$want") > 10)) || fail "found no staging replacements in $modfile"
	if [[ ! -s $dir/go.sum || ! -r $dir/go.mod.want || "$(cat "$dir/go.mod.want")" != "$want" ]]; then
		printf '%s\n' "$want" >"$dir/go.mod.want"
		cp "$dir/go.mod.want" "$dir/go.mod"
		rm -f "$dir/go.sum"
		say "resolving k8s.io/kubernetes v$v for $* ..."
		(cd "$dir" && go get "${gets[@]}") >"$dir/resolve.log" 2>&1 \
			|| { tail -n 20 "$dir/resolve.log" >&2; fail "resolving k8s.io/kubernetes failed (log: $dir/resolve.log)"; }
	fi
}

# kube_ldflags: stamp the version the way the Kubernetes release build does, else the binaries
# say v0.0.0-master.
kube_ldflags() {
	local v=$KUBE_VERSION rest=${KUBE_VERSION#*.} ld="-s -w" p
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ld+=" -X $p.gitVersion=v$v -X $p.gitMajor=${v%%.*} -X $p.gitMinor=${rest%%.*}"
		ld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
	done
	printf '%s\n' "$ld"
}

# check_version NAME: BIN/NAME --version says this Kubernetes version.
check_version() {
	local got
	got=$("$BIN/$1" --version 2>&1)
	[[ $got == "Kubernetes v$KUBE_VERSION" ]] || fail "$1 says '$got', want 'Kubernetes v$KUBE_VERSION'"
}

build_kube() {
	local dir=$CACHE/src/kubernetes-v$KUBE_VERSION ld
	kube_wrapper "$dir" fiberd.local/kube-tools kube-apiserver kubectl
	ld=$(kube_ldflags)
	install_tool "$dir" k8s.io/kubernetes/cmd/kube-apiserver kube-apiserver "$ld"
	install_tool "$dir" k8s.io/kubernetes/cmd/kubectl kubectl "$ld"
	check_version kube-apiserver
}

# The node's binaries get a wrapper module of their own, so the control plane's go.mod and go.sum
# (which an older script checks) stay as they are; the Go build cache is shared, so the packages
# they have in common with kube-apiserver compile once.
build_node() {
	local dir=$CACHE/src/kubernetes-node-v$KUBE_VERSION ld t
	kube_wrapper "$dir" fiberd.local/kube-node-tools "${KUBE_NODE_TOOLS[@]}"
	ld=$(kube_ldflags)
	for t in "${KUBE_NODE_TOOLS[@]}"; do
		install_tool "$dir" "k8s.io/kubernetes/cmd/$t" "$t" "$ld"
		check_version "$t"
	done
}

# CoreDNS is built with the plugins a node's cluster DNS needs and no others (its own build
# compiles in every plugin, clouds' SDKs included): bind, errors, log, kubernetes. The directive
# list is the plugins' order in a server block, as CoreDNS's generated one would give it.
build_coredns() {
	local v=$COREDNS_VERSION dir=$CACHE/src/coredns-v$COREDNS_VERSION
	mkdir -p "$dir"
	cat >"$dir/main.go" <<'GO'
// Command coredns is CoreDNS with the bind, errors, log and kubernetes plugins only, built by
// fiberd's hack/kube-tools.sh for the cluster DNS of hack/node-up.sh.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
)

func init() { dnsserver.Directives = []string{"bind", "errors", "log", "kubernetes"} }

func main() { coremain.Run() }
GO
	if [[ ! -s $dir/go.sum ]] || ! grep -q "github.com/coredns/coredns v$v\$" "$dir/go.mod" 2>/dev/null; then
		printf '// Generated by fiberd hack/kube-tools.sh; safe to delete.\nmodule fiberd.local/coredns-tool\n\ngo 1.26.0\n' >"$dir/go.mod"
		rm -f "$dir/go.sum"
		say "resolving coredns v$v ..."
		(cd "$dir" && go get "github.com/coredns/coredns@v$v" && go mod tidy) >"$dir/resolve.log" 2>&1 \
			|| { tail -n 20 "$dir/resolve.log" >&2; fail "resolving coredns failed (log: $dir/resolve.log)"; }
	fi
	install_tool "$dir" . coredns "-s -w -X github.com/coredns/coredns/coremain.GitCommit=v$v"
	local got
	got=$("$BIN/coredns" -version)
	[[ ${got%%$'\n'*} == "CoreDNS-$v" ]] || fail "coredns reports '${got%%$'\n'*}', want CoreDNS-$v"
}

# etcd has no command module of its own worth requiring; a one-line main around etcdmain does.
build_etcd() {
	local v=$ETCD_VERSION dir=$CACHE/src/etcd-v$ETCD_VERSION
	mkdir -p "$dir"
	cat >"$dir/main.go" <<'GO'
// Command etcd is the etcd server, built by fiberd's hack/kube-tools.sh.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
	if [[ ! -s $dir/go.sum ]] || ! grep -q "go.etcd.io/etcd/server/v3 v$v\$" "$dir/go.mod" 2>/dev/null; then
		printf '// Generated by fiberd hack/kube-tools.sh; safe to delete.\nmodule fiberd.local/etcd-tool\n\ngo 1.26.0\n' >"$dir/go.mod"
		rm -f "$dir/go.sum"
		say "resolving etcd v$v ..."
		(cd "$dir" && go get "go.etcd.io/etcd/server/v3@v$v" && go mod tidy) >"$dir/resolve.log" 2>&1 \
			|| { tail -n 20 "$dir/resolve.log" >&2; fail "resolving etcd failed (log: $dir/resolve.log)"; }
	fi
	install_tool "$dir" . etcd "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=v$v"
	# Read the whole answer first: with pipefail, grep -q leaving early would fail the check
	# whenever etcd is still writing its later lines (SIGPIPE).
	local got
	got=$("$BIN/etcd" --version)
	[[ ${got%%$'\n'*} == "etcd Version: $v" ]] || fail "etcd reports '${got%%$'\n'*}', want $v"
}

# stamp FILE STAMP: record a built set (temporary name, then rename).
stamp() {
	printf '%s\n' "$2" >"$1.partial"
	mv -f "$1.partial" "$1"
}

if ((need_cp)); then
	build_kube
	build_etcd
	stamp "$BIN/.stamp" "$STAMP"
	say "built ${TOOLS[*]} into $BIN in $((SECONDS - start)) s ($STAMP)"
fi
if ((need_node)); then
	t0=$SECONDS
	build_node
	build_coredns
	stamp "$BIN/.stamp-node" "$NODE_STAMP"
	say "built ${NODE_TOOLS[*]} into $BIN in $((SECONDS - t0)) s ($NODE_STAMP)"
fi
