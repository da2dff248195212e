#!/usr/bin/env bash
# Builds Debian 12's own abseil (the source package of the installed
# libabsl-dev: same version, same Debian patches, same SONAMEs) with
# ThreadSanitizer, so that TSan sees absl::Mutex, absl::CondVar and
# absl::Notification in our code *and* inside libgrpc. Debian's binary abseil
# is not instrumented: without this every guarded access is reported as a race.
#
#   scripts/tsan-abseil.sh [DIR]     (default build/tsan-absl)
#
# Every library is built: inline code (absl::call_once, for one) is compiled
# into each of them, and the dynamic linker may pick any library's copy.
# Prints DIR/lib, which goes first in LD_LIBRARY_PATH of the tsan test preset.
# Skips the build when DIR/lib is already complete. Needs root the first time
# (enables deb-src, apt-get source).
set -euo pipefail
cd "$(dirname "$0")/.."
out="$(realpath -m "${1:-build/tsan-absl}")"
say() { echo "tsan-abseil: $*" >&2; }

if [ -f "$out/lib/.complete" ]; then echo "$out/lib"; exit 0; fi
version=$(dpkg-query -W -f='${Version}' libabsl-dev 2>/dev/null) \
  || { say "ERROR: libabsl-dev is not installed (scripts/install-deps.sh)"; exit 1; }
rm -rf "$out" && mkdir -p "$out/src"
scripts/enable-deb-src.sh
say "fetching the source of abseil $version"
# A deb-src entry present before this run may never have been fetched: on
# failure, update the indexes once and try again.
get=(apt-get source -qq -o APT::Sandbox::User=root "abseil=$version")
(cd "$out/src" && "${get[@]}" >/dev/null) \
  || { scripts/apt-get.sh update -qq && (cd "$out/src" && "${get[@]}" >/dev/null); } \
  || { say "ERROR: apt-get source abseil=$version failed"; exit 1; }
src=$(find "$out/src" -mindepth 1 -maxdepth 1 -type d -name 'abseil-*' | head -1)
[ -n "$src" ] || { say "ERROR: no unpacked tree in $out/src"; exit 1; }
say "building abseil with -fsanitize=thread"
# Through the machine's compiler cache, as the project's builds
# (CMakeLists.txt): paths relative to DIR, one locale, so that
# the next clone's build of the same abseil is hits.
launcher=()
if command -v ccache >/dev/null && mkdir -p /var/cache/efa-ccache 2>/dev/null && [ -w /var/cache/efa-ccache ]; then
  launcher=("-DCMAKE_CXX_COMPILER_LAUNCHER=env;-u;LC_ALL;-u;LC_CTYPE;-u;LC_MESSAGES;LANG=C.UTF-8;CCACHE_BASEDIR=$out;CCACHE_NOHASHDIR=1;CCACHE_DIR=/var/cache/efa-ccache;CCACHE_MAXSIZE=20G;ccache")
fi
cmake -S "$src" -B "$out/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_CXX_STANDARD=17 \
  -DBUILD_SHARED_LIBS=ON -DBUILD_TESTING=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" >"$out/configure.log" 2>&1 \
  || { say "ERROR: configure failed, see $out/configure.log"; exit 1; }
cmake --build "$out/build" -j"${EFA_TSAN_JOBS:-2}" >"$out/build.log" 2>&1 \
  || { say "ERROR: build failed, see $out/build.log"; exit 1; }
mkdir -p "$out/lib"
find "$out/build" -name 'libabsl_*.so.*' -exec cp -P {} "$out/lib/" \;
touch "$out/lib/.complete"
say "$(find "$out/lib" -name "libabsl_*.so.*" -type f | wc -l) instrumented libraries in $out/lib"
echo "$out/lib"
