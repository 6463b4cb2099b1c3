#!/usr/bin/env bash
# Rebuilds the committed BPF objects of bpf/, or checks that they are fresh.
#
#   bpf/build.sh          rebuild bpf/lookup.bpf.o and bpf/events.bpf.o in place
#   bpf/build.sh --check  rebuild into a temporary directory and fail if
#                         the result differs byte for byte from the
#                         committed object (CI runs this)
#
# Needs clang (checked with Debian's clang 14) and libbpf's headers
# (libbpf-dev). The output is byte-for-byte reproducible for a given clang:
# the debug info's compilation directory is mapped to "." so that the
# checkout's location does not leak into the object. A different clang
# version produces different bytes; the check then fails and says which
# clang built it, and the object must be rebuilt with the pinned one (or
# the pin moved, and the object recommitted, in one change).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

CLANG="${CLANG:-clang}"
CFLAGS=(-target bpf -O2 -g -Wall -Wextra -Werror
        -I/usr/include/x86_64-linux-gnu
        "-fdebug-prefix-map=$here=.")
OBJECTS=(lookup events)

build() { # build <out dir>
	local out="$1" name
	for name in "${OBJECTS[@]}"; do
		"$CLANG" "${CFLAGS[@]}" -c "$name.bpf.c" -o "$out/$name.bpf.o"
	done
	# The ABI-only object is compiled (its asserts checked) but not kept.
	"$CLANG" "${CFLAGS[@]}" -c abi_check.bpf.c -o "$out/abi_check.bpf.o.tmp"
	rm -f "$out/abi_check.bpf.o.tmp"
}

case "${1:-}" in
"")
	build "$here"
	echo "rebuilt: ${OBJECTS[*]/%/.bpf.o} ($("$CLANG" --version | head -1))"
	;;
--check)
	tmp="$(mktemp -d)"
	trap 'rm -rf "$tmp"' EXIT
	build "$tmp"
	stale=0
	for name in "${OBJECTS[@]}"; do
		if ! cmp -s "$tmp/$name.bpf.o" "$here/$name.bpf.o"; then
			echo "STALE: bpf/$name.bpf.o differs from a rebuild of bpf/$name.bpf.c" >&2
			echo "       with $("$CLANG" --version | head -1); run bpf/build.sh and commit it" >&2
			stale=1
		fi
	done
	[ "$stale" = 0 ] && echo "bpf objects are up to date"
	exit "$stale"
	;;
*)
	echo "usage: $0 [--check]" >&2
	exit 2
	;;
esac
