#!/usr/bin/env bash
# Assembles the image's whole root file system in OUT: the binaries, every
# shared library they load (their NEEDED entries, recursively), libibverbs
# and its EFA provider (which the inventory command loads with dlopen, so no
# NEEDED entry names them), and the dynamic loader. Nothing else: no shell,
# no package manager, no other provider (never mlx5's). The Dockerfile's
# build stage runs it and copies OUT into a `FROM scratch` stage.
#
#   scripts/image-rootfs.sh TRIPLET OUT BINARY...   (TRIPLET: x86_64-linux-gnu, aarch64-linux-gnu)
#
# Libraries come from this machine's multiarch directories for TRIPLET (a
# cross build's target packages, or the build host's own), are copied under
# their SONAME to /usr/lib/TRIPLET (a directory the loader searches with no
# ld.so.cache), and binaries are stripped with TRIPLET-strip. Prints what it
# copied and the totals. test/image/rootfs_test.sh runs the result.
set -euo pipefail

die() { echo "image-rootfs: $*" >&2; exit 1; }
[ $# -ge 3 ] || die "usage: $0 TRIPLET OUT BINARY..."
triplet="$1" out="$2"
shift 2
search=("/usr/lib/$triplet" "/lib/$triplet" /usr/lib /lib)
libdir="$out/usr/lib/$triplet"
mkdir -p "$out/usr/bin" "$libdir"

needed() { readelf -d "$1" | sed -nE 's/.*\(NEEDED\).*\[(.*)\]/\1/p'; }
find_lib() {
  local dir
  for dir in "${search[@]}"; do
    if [ -e "$dir/$1" ]; then echo "$dir/$1"; return 0; fi
  done
  return 1
}

# Breadth-first over NEEDED entries, from the binaries and the dlopen roots.
queue=()
for binary in "$@"; do
  [ -x "$binary" ] || die "$binary is not an executable"
  install -m 0755 "$binary" "$out/usr/bin/"
  "$triplet-strip" "$out/usr/bin/$(basename "$binary")"
  queue+=("$out/usr/bin/$(basename "$binary")")
done
provider="$(compgen -G "/usr/lib/$triplet/libibverbs/libefa-rdmav*.so" | head -1 || true)"
[ -n "$provider" ] || die "no EFA provider (/usr/lib/$triplet/libibverbs/libefa-rdmav*.so): install ibverbs-providers:ARCH"
mkdir -p "$libdir/libibverbs" "$out/etc/libibverbs.d"
cp -L "$provider" "$libdir/libibverbs/"
queue+=("$libdir/libibverbs/$(basename "$provider")")
# libibverbs loads the providers its configuration names: only efa here.
echo "driver efa" > "$out/etc/libibverbs.d/efa.driver"

declare -A copied=()
copy_lib() {  # NAME NEEDED_BY
  local path
  [ -z "${copied[$1]:-}" ] || return 0
  path="$(find_lib "$1")" || die "$1 (needed by $2) not found in ${search[*]}"
  cp -L "$path" "$libdir/$1"
  copied[$1]=1
  queue+=("$libdir/$1")
}
copy_lib libibverbs.so.1 "the inventory command's dlopen"
copy_lib libssl.so.3 "the claim lookup's dlopen"
i=0
while [ "$i" -lt "${#queue[@]}" ]; do
  elf="${queue[$i]}"
  i=$((i + 1))
  for name in $(needed "$elf"); do copy_lib "$name" "$(basename "$elf")"; done
done

# The loader, at the path the binaries name (PT_INTERP).
interp="$(readelf -l "$out/usr/bin/$(basename "$1")" | sed -nE 's/.*\[Requesting program interpreter: (.*)\]/\1/p')"
[ -n "$interp" ] || die "$1 names no program interpreter"
loader="$(find_lib "$(basename "$interp")")" || loader="$interp"
[ -e "$loader" ] || die "no dynamic loader $interp for $triplet"
mkdir -p "$out$(dirname "$interp")"
cp -L "$loader" "$out$interp"

files="$(find "$out" -type f | wc -l)"
bytes="$(du -sb "$out" | cut -f1)"
echo "image-rootfs: $files files, $bytes bytes for $triplet: $(cd "$libdir" && find . -type f -printf '%P ' | sort)"
