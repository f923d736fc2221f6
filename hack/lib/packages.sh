# shellcheck shell=bash
# packages.sh - Debian packages that the repository's scripts install (.ci/run, hack/criu.sh), each
# install recorded so that hack/fresh.sh can take the machine back to what it had before. Sourced;
# the caller defines say and fail first and runs as root.
#
# The record: FIBERD_PACKAGES_RECORD (default /var/lib/fiberd-hack/packages), one package name a
# line, every package an install of ours added to the machine, dependencies included. A package the
# machine had before is never listed, so never removed by hack/fresh.sh.

FIBERD_PACKAGES_RECORD=${FIBERD_PACKAGES_RECORD:-/var/lib/fiberd-hack/packages}

# pkg_installed_set: the names of every installed package, sorted.
pkg_installed_set() {
	dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' 2>/dev/null | awk '$1 ~ /^.i/ {print $2}' | sort -u
}

# pkg_missing PKG...: print those of PKG not installed.
pkg_missing() {
	local p
	for p in "$@"; do
		[[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" == "install ok installed" ]] || printf '%s\n' "$p"
	done
}

# pkg_install PKG...: install those of PKG that are missing (without recommends), updating the
# index only when the first attempt fails, and add what the install brought to the record. Waits
# up to 5 minutes for another apt to finish. Fails with apt-get's own words.
pkg_install() {
	local missing before after
	mapfile -t missing < <(pkg_missing "$@")
	((${#missing[@]})) || return 0
	say "installing ${missing[*]}"
	before=$(pkg_installed_set)
	local inst=(apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}")
	if ! DEBIAN_FRONTEND=noninteractive "${inst[@]}" >/dev/null 2>&1; then
		apt-get -o DPkg::Lock::Timeout=300 update -qq >/dev/null || fail "apt-get update failed"
		DEBIAN_FRONTEND=noninteractive "${inst[@]}" >/dev/null || fail "apt-get install ${missing[*]} failed"
	fi
	after=$(pkg_installed_set)
	mkdir -p "$(dirname "$FIBERD_PACKAGES_RECORD")"
	{
		[[ -s $FIBERD_PACKAGES_RECORD ]] && cat "$FIBERD_PACKAGES_RECORD"
		comm -13 <(printf '%s\n' "$before") <(printf '%s\n' "$after")
	} | sort -u >"$FIBERD_PACKAGES_RECORD.tmp"
	sync "$FIBERD_PACKAGES_RECORD.tmp" 2>/dev/null || true
	mv "$FIBERD_PACKAGES_RECORD.tmp" "$FIBERD_PACKAGES_RECORD"
}
