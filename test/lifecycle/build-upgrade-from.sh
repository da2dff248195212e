#!/usr/bin/env bash
# Builds the daemon binaries of the commit test/lifecycle/upgrade-from names,
# for the lifecycle test's upgrade (test/lifecycle/lifecycle_main.cc):
#
#   build-upgrade-from.sh <source tree> <out dir>
#
# leaves <out>/bin/efa-k8s-device-plugin and efa-k8s-device-plugin-idle and
# <out>/COMMIT, or, when the tree has no git history holding the commit (a
# shallow clone, a source archive), <out>/UNAVAILABLE saying so: the test
# then skips the upgrade. Exits non-zero only when the build itself fails.
# The commit's tree is `git archive`d to <out>/src and built with its release
# preset through the shared ccache (CONTRIBUTING.md, "Rebuilds"), only the
# daemon's two targets; nothing is done again while <out>/COMMIT names it.
set -euo pipefail

src="$(cd "$1" && pwd)"
out="$2"
mkdir -p "$out"
# One build at a time in <out> (two build trees never share it, but two
# ninjas of one tree can run it at once).
exec 9>"$out/.lock"
flock 9
commit="$(grep -v '^[[:space:]]*#' "$src/test/lifecycle/upgrade-from" | awk 'NF { print $1; exit }')"

unavailable() {
  echo "$1" >"$out/UNAVAILABLE"
  rm -rf "${out:?}/bin" "${out:?}/COMMIT"
  echo "build-upgrade-from: $1"
  exit 0
}

[[ -n "$commit" ]] || unavailable "test/lifecycle/upgrade-from names no commit"
command -v git >/dev/null || unavailable "git is not installed: cannot build $commit"
full="$(git -C "$src" rev-parse --verify --quiet "$commit^{commit}" 2>/dev/null)" ||
  unavailable "the git history of $src does not hold $commit (a shallow clone or a source archive?): fetch it (git fetch --unshallow) to test the upgrade from it"

if [[ -f "$out/COMMIT" && "$(cat "$out/COMMIT")" == "$full" &&
  -x "$out/bin/efa-k8s-device-plugin" && -x "$out/bin/efa-k8s-device-plugin-idle" ]]; then
  exit 0
fi
rm -f "$out/UNAVAILABLE" "$out/COMMIT"
start=$SECONDS

# The commit's own tree, in a directory of its own (its presets build in
# <tree>/build/release).
rm -rf "${out:?}/src" "${out:?}/bin"
mkdir -p "$out/src"
git -C "$src" archive --format=tar "$full" | tar -x -C "$out/src"

# Through the shared ccache whether or not the commit's CMakeLists sets it up
# (the same settings as CMakeLists.txt's, relative to this tree): the files
# it shares with the current tree are cache hits.
launcher=()
if command -v ccache >/dev/null && [[ "${EFA_CCACHE:-ON}" != OFF ]]; then
  env=("CCACHE_BASEDIR=$out/src" CCACHE_NOHASHDIR=1)
  if [[ -z "${CCACHE_DIR:-}" ]] && mkdir -p /var/cache/efa-ccache 2>/dev/null &&
    [[ -w /var/cache/efa-ccache ]]; then
    env+=(CCACHE_DIR=/var/cache/efa-ccache CCACHE_MAXSIZE=20G)
  fi
  launcher=("-DCMAKE_CXX_COMPILER_LAUNCHER=env;$(
    IFS=';'
    echo "${env[*]}"
  );$(command -v ccache)")
fi
(
  cd "$out/src"
  # -O1: what the test needs of the old daemon is its behaviour, and -O1
  # compiles in about 30 % less CPU than its preset's -O3 (issue 43).
  cmake --preset release -DEFA_BUILD_TESTS=OFF -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
    "${launcher[@]}" >"$out/configure.log" 2>&1 ||
    { cat "$out/configure.log" >&2; exit 1; }
  nice -n 10 cmake --build --preset release -j"${EFA_UPGRADE_FROM_JOBS:-2}" \
    --target efa-k8s-device-plugin efa-k8s-device-plugin-idle >"$out/build.log" 2>&1 ||
    { tail -50 "$out/build.log" >&2; exit 1; }
)
mkdir -p "$out/bin"
cp "$out/src/build/release/plugin/efa-k8s-device-plugin" \
  "$out/src/build/release/plugin/efa-k8s-device-plugin-idle" "$out/bin/"
echo "$full" >"$out/COMMIT"
echo "build-upgrade-from: built the daemon of ${full:0:7} in $((SECONDS - start)) s ($out/bin)"
