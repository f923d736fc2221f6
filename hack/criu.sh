#!/usr/bin/env bash
# criu.sh - build the CRIU that fiberd's CHECKPOINT tier (park and resume) runs: CRIU 4.2.1 with fiberd's patches (hack/criu-patches),
# compiled from the original source tarball of Debian's source package, fetched with apt-get.
# Debian bookworm's own criu 3.17.1 cannot run on kernels 6.13 and later ("vdso: Unexpected rt
# vDSO area bounds"), and trixie's 4.1.1 cannot dump a TCP socket on 6.18 ("Can't get 1:16 opt").
#
# Usage: hack/criu.sh [CACHE]
#
#   CACHE   default ${FIBERD_CRIU_CACHE:-$HOME/.cache/fiberd/criu}. The binary lands in
#           CACHE/bin/criu, which is where fiberd looks by default (backend.DefaultCRIUPath).
#           The cache lives outside the repository and is never committed.
#
# Environment (optional):
#   FIBERD_CRIU_SUITES="sid testing"   Debian suites whose source index is searched for the
#                                      version, in order (the pool keeps a suite's current one).
#
# Behaviour:
#   - Idempotent: CACHE/bin/.stamp records the version, the source's SHA-256 and the recipe; when it
#     matches and the binary is there the script exits 0 at once (a few milliseconds).
#   - Safe under concurrent callers: an flock on CACHE/.lock serialises builds; a second caller waits,
#     then finds the stamp and returns. The binary is written to a temporary name and renamed.
#   - Installs the Debian packages the build needs when one is missing (apt-get, as root).
#   - The binary keeps its kerndat cache in /dev/shm/fiberd-criu (a tmpfs: the cache must not
#     outlive a reboot, and CRIU keeps it only on tmpfs), which saves about 12 ms on every call;
#     the proc backend creates that directory (0700) when it probes CRIU.
#   - Fails (exit 1, message on stderr) when apt-get, the archive or the build fails; a failed
#     build removes the stamp so the next run starts over.
#
# Cost (2 cores): cold, 7 min 20 s to 7 min 40 s on a shared VM at load average 15 to 20 (2.2 min of
# CPU; about 10 to 25 s of it fetching the source index), so about 2 minutes on an idle machine, plus
# the build packages the first time; about 60 ms when current.
set -euo pipefail

say() { printf 'criu: %s\n' "$*" >&2; }
fail() { say "error: $*"; exit 1; }

CACHE=${1:-${FIBERD_CRIU_CACHE:-$HOME/.cache/fiberd/criu}}
VERSION=4.2.1
# SHA-256 of criu_4.2.1.orig.tar.xz as Debian's source index lists it.
SHA256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
KDAT_DIR=/dev/shm/fiberd-criu
SUITES=${FIBERD_CRIU_SUITES:-sid testing}
# Bump when the way the binary is built changes, so caches made by an older script rebuild.
RECIPE=2
# fiberd's patches (hack/criu-patches, each explained at its top), applied in
# name order; they let criu park a fiber of an isolated grant. `criu --version`
# of the build says "GitID: $EXTRA", which is how fiberd knows it has them.
PATCHES=$(cd "$(dirname "${BASH_SOURCE[0]}")/criu-patches" && pwd)
EXTRA=fiberd1
PACKAGES=(build-essential patch pkg-config xz-utils libbsd-dev libcap-dev libnet1-dev libnl-3-dev
	libnl-route-3-dev libprotobuf-c-dev libprotobuf-dev protobuf-c-compiler protobuf-compiler uuid-dev)

command -v flock >/dev/null 2>&1 || fail "flock (util-linux) is not on PATH"
mkdir -p "$CACHE/bin"
CACHE=$(cd "$CACHE" && pwd)
BIN=$CACHE/bin

exec 8>"$CACHE/.lock"
if ! flock -n 8; then
	say "another build holds $CACHE/.lock; waiting"
	flock 8
fi

PATCH_SUM=$(cat "$PATCHES"/*.patch | sha256sum | cut -c1-16)
STAMP="criu=$VERSION gitid=$EXTRA sha256=$SHA256 patches=$PATCH_SUM kdat=$KDAT_DIR recipe=$RECIPE"
if [[ -r $BIN/.stamp && "$(cat "$BIN/.stamp")" == "$STAMP" && -x $BIN/criu ]]; then
	say "up to date: $BIN/criu ($STAMP)"
	exit 0
fi
rm -f "$BIN/.stamp"
start=$SECONDS

# The build packages, installed only when one is missing (and recorded for hack/fresh.sh).
# shellcheck source=lib/packages.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/packages.sh"
if [[ -n $(pkg_missing "${PACKAGES[@]}") ]]; then
	pkg_install "${PACKAGES[@]}"
	say "installed the build packages in $((SECONDS - start)) s"
fi

W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
chmod 755 "$W" # apt's download sandbox user must be able to write into it

# The mirror this machine already uses (deb822 sources, else sources.list), asked for the source
# index of SUITES only, in a private list directory: the machine's own apt state is untouched.
mirror=$(awk '/^URIs:/ {print $2}' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v -- '-security' | head -n 1 || true)
[[ -n $mirror ]] || mirror=$(awk '$1 == "deb" && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
[[ -n $mirror ]] || fail "found no Debian mirror in /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list"
mkdir -p "$W/lists/partial" "$W/src"
OPTS=(-o Dir::Etc::sourcelist="$W/sources.list" -o Dir::Etc::sourceparts=- -o Dir::State::Lists="$W/lists"
	-o APT::Sandbox::User=root)
tarball=$W/src/criu_$VERSION.orig.tar.xz
: >"$W/source.log"
for s in $SUITES; do
	say "looking for criu $VERSION in $s ($mirror) ..."
	echo "deb-src $mirror $s main" >"$W/sources.list"
	apt-get "${OPTS[@]}" update -qq >"$W/update.log" 2>&1 || { cat "$W/update.log" >&2; fail "apt-get update of the $s source index failed"; }
	# Any Debian revision of VERSION: they share the original tarball, which is all the build uses
	# (the Debian part, debian.tar.xz, may be gone from the pool already).
	rev=$(apt-cache "${OPTS[@]}" showsrc criu 2>/dev/null | awk -v v="$VERSION-" '$1 == "Version:" && index($2, v) == 1 {print $2; exit}')
	[[ -n $rev ]] || continue
	(cd "$W/src" && apt-get "${OPTS[@]}" source --download-only -qq "criu=$rev" >>"$W/source.log" 2>&1) || true
	[[ -s $tarball ]] && break
done
[[ -s $tarball ]] || { cat "$W/source.log" >&2; fail "criu $VERSION is in none of the source indexes of: $SUITES (set FIBERD_CRIU_SUITES)"; }
echo "$SHA256  $tarball" | sha256sum -c --quiet - || fail "criu_$VERSION.orig.tar.xz does not have SHA-256 $SHA256"

say "compiling criu $VERSION (source fetched at $((SECONDS - start)) s) ..."
mkdir -p "$W/build"
tar -C "$W/build" --strip-components=1 -xf "$tarball"
for p in "$PATCHES"/*.patch; do
	patch -d "$W/build" -p1 --quiet --forward <"$p" >>"$W/patch.log" 2>&1 || { cat "$W/patch.log" >&2; fail "patch $(basename "$p") does not apply"; }
done
# NO_GNUTLS: the page server's TLS is not used, and the binary needs one library fewer at run time.
if ! make -C "$W/build" -j"$(nproc)" RUNDIR="$KDAT_DIR" NO_GNUTLS=1 GITID="$EXTRA" criu >"$W/build.log" 2>&1; then
	tail -n 30 "$W/build.log" >&2
	fail "make criu failed"
fi
install -m 0755 "$W/build/criu/criu" "$BIN/.criu.partial"
got=$("$BIN/.criu.partial" --version | awk '/^Version:/ {print $2}')
[[ $got == "$VERSION" ]] || fail "the built criu says version '$got', want $VERSION"
gitid=$("$BIN/.criu.partial" --version | awk '/^GitID:/ {print $2}')
[[ $gitid == "$EXTRA" ]] || fail "the built criu says GitID '$gitid', want $EXTRA (fiberd's patches)"
mv -f "$BIN/.criu.partial" "$BIN/criu"
printf '%s\n' "$STAMP" >"$BIN/.stamp.partial"
mv -f "$BIN/.stamp.partial" "$BIN/.stamp"
say "built $BIN/criu in $((SECONDS - start)) s ($STAMP)"
if [[ $(id -u) == 0 ]]; then
	mkdir -p -m 0700 "$KDAT_DIR"
	if out=$("$BIN/criu" check 2>&1); then say "criu check: ${out##*$'\n'}"; else say "criu check failed (parking will be off here): ${out##*$'\n'}"; fi
fi
