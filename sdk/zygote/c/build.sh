#!/bin/sh
# build.sh OUT_DIR [SOURCE...]: compile fiberzygote.c with the system compiler
# into OUT_DIR/libfiberzygote.a and, for every extra SOURCE (a template's .c
# file), link OUT_DIR/<basename without .c> against it.
#   sdk/zygote/c/build.sh /tmp/fz examples/templates/c/counter.c
# CC and CFLAGS are honoured (defaults: cc, -O2 -Wall -Wextra).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build.sh OUT_DIR [SOURCE...]}
shift
: "${CC:=cc}"
: "${CFLAGS:=-O2 -Wall -Wextra}"
mkdir -p "$out"
# shellcheck disable=SC2086
$CC $CFLAGS -c "$here/fiberzygote.c" -o "$out/fiberzygote.o"
ar rcs "$out/libfiberzygote.a" "$out/fiberzygote.o"
for src in "$@"; do
	name=$(basename "$src" .c)
	# shellcheck disable=SC2086
	$CC $CFLAGS -I"$here" "$src" "$out/libfiberzygote.a" -o "$out/$name"
done
