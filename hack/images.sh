#!/usr/bin/env bash
# images.sh - build fiberd's container images from this checkout as tarballs that
# `ctr -n k8s.io images import` reads (hack/node-up.sh import): static binaries on a small base
# layout, one layer each, no registry and no container engine. The same checkout and toolchain give
# the same digests (tools/image).
#
# Usage: hack/images.sh OUT
#
#   OUT/pause.tar        fiberd.local/pause:3.10        the sandbox image (hack/node-up.sh's
#                                                       containerd names it as sandbox_image)
#   OUT/fiberd.tar       fiberd.local/fiberd:dev        what deploy/kubernetes/Dockerfile builds:
#                                                       fiberd, fiberd-caps (fiberd with the file
#                                                       capabilities isolation needs, which
#                                                       grant-pod.yaml runs), fiberctl, grant-issuer,
#                                                       fiberd-controller (deploy/controller), the C
#                                                       example template built static and its spec
#                                                       (templates/counter.json); runs as 65532
#   OUT/counter-pod.tar  fiberd.local/counter-pod:dev   the same C template as a plain container
#                                                       (tools/cmd/activate gives it its listener on
#                                                       :8080): the bench's "Pod per worker"
#   OUT/node-client.tar  fiberd.local/node-client:dev   test/node/client, make e2e-node's caller
#   OUT/fiberd-attack.tar fiberd.local/fiberd-attack:dev the fiberd image with the attack test's
#                                                       template added (pkg/backend/testdata/
#                                                       attacker.c built static, its spec
#                                                       test/node/testdata/attacker.json): make
#                                                       e2e-node's attack in a grant Pod; no user
#                                                       runs it
#   OUT/digests.txt      "REF DIGEST" per image
#
# The files each image holds are listed below once; deploy/kubernetes/Dockerfile builds the fiberd
# image's layout for users with a registry, and make e2e-node checks the two agree.
#
# Needs go (the root, controller and tools modules) and a C compiler with a static libc (Debian's
# build-essential). Fails (exit 1) naming the step that failed. About 10 s with warm Go caches.
set -euo pipefail

say() { printf 'images: %s\n' "$*" >&2; }
fail() { say "error: $*"; exit 1; }

(($# == 1)) || { sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0" >&2; exit 2; }
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then PATH=/usr/local/go/bin:$PATH; fi
command -v go >/dev/null 2>&1 || fail "the go command is not on PATH"
: "${CC:=cc}"
command -v "$CC" >/dev/null 2>&1 || fail "no C compiler ($CC): apt-get install build-essential"
export CGO_ENABLED=0
case " ${GOFLAGS:-} " in *" -buildvcs="*) ;; *) export GOFLAGS="${GOFLAGS:+$GOFLAGS }-buildvcs=false" ;; esac
start=$SECONDS
B=$OUT/bin
mkdir -p "$B"

say "building the static binaries ..."
(cd "$ROOT" && go build -trimpath -ldflags='-s -w' -o "$B/" ./cmd/fiberd ./cmd/fiberctl ./cmd/grant-issuer ./test/node/client) \
	|| fail "building fiberd, fiberctl, grant-issuer and test/node/client failed"
(cd "$ROOT/controller" && go build -trimpath -ldflags='-s -w' -o "$B/" ./cmd/fiberd-controller) \
	|| fail "building the controller module's fiberd-controller failed"
(cd "$ROOT/tools" && go build -trimpath -ldflags='-s -w' -o "$B/" ./cmd/mkimage ./cmd/pause ./cmd/activate) \
	|| fail "building the tools module's commands failed"
# The zygote SDK and the example built static: the image has no libc to link against.
CFLAGS="-O2 -Wall -Wextra -static" "$ROOT/sdk/zygote/c/build.sh" "$OUT/c" "$ROOT/examples/templates/c/counter.c" \
	"$ROOT/pkg/backend/testdata/attacker.c" \
	|| fail "building the C templates static failed (a static libc is needed: Debian's libc6-dev)"
file_is_static() { ! grep -q 'NEEDED' < <(readelf -d "$1" 2>/dev/null) ; }
if command -v readelf >/dev/null 2>&1; then
	for f in "$B"/fiberd "$B"/fiberd-controller "$B"/pause "$B"/activate "$OUT"/c/counter "$OUT"/c/attacker; do
		file_is_static "$f" || fail "$f is dynamically linked"
	done
fi

# image NAME REF MKIMAGE-ARGS...: write OUT/NAME.tar.
image() {
	local name=$1 ref=$2 line
	shift 2
	line=$("$B/mkimage" -ref "$ref" -out "$OUT/$name.tar" "$@") || fail "packaging $name failed"
	printf '%s\n' "$line" >>"$OUT/digests.txt.partial"
	say "$line"
}
rm -f "$OUT/digests.txt.partial"
image pause fiberd.local/pause:3.10 -base -entrypoint /pause /pause="$B/pause"
fiberd_files=(-base -user 65532:65532 -entrypoint /usr/local/bin/fiberd
	-dir /var/lib/fiberd -caps /usr/local/bin/fiberd-caps=sys_admin,setuid,setgid,chown
	/usr/local/bin/fiberd="$B/fiberd"
	/usr/local/bin/fiberd-caps="$B/fiberd"
	/usr/local/bin/fiberctl="$B/fiberctl"
	/usr/local/bin/grant-issuer="$B/grant-issuer"
	/usr/local/bin/fiberd-controller="$B/fiberd-controller"
	/opt/fiberd/templates/counter="$OUT/c/counter":0755
	/etc/fiberd/templates/counter.json="$ROOT/deploy/kubernetes/templates/counter.json":0644)
image fiberd fiberd.local/fiberd:dev "${fiberd_files[@]}"
image fiberd-attack fiberd.local/fiberd-attack:dev "${fiberd_files[@]}" \
	/opt/fiberd/templates/attacker="$OUT/c/attacker":0755 \
	/etc/fiberd/templates/attacker.json="$ROOT/test/node/testdata/attacker.json":0644
image counter-pod fiberd.local/counter-pod:dev -base -user 65532:65532 \
	-entrypoint /usr/local/bin/activate,-listen,:8080,/opt/fiberd/templates/counter \
	/usr/local/bin/activate="$B/activate" \
	/opt/fiberd/templates/counter="$OUT/c/counter":0755
image node-client fiberd.local/node-client:dev -base -user 65532:65532 -entrypoint /usr/local/bin/node-client \
	/usr/local/bin/node-client="$B/client"
mv -f "$OUT/digests.txt.partial" "$OUT/digests.txt"
say "built $(wc -l <"$OUT/digests.txt") images into $OUT in $((SECONDS - start)) s"
