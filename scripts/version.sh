#!/usr/bin/env bash
# The project's version has one source: `project(... VERSION x.y.z)` in
# CMakeLists.txt (the binary's --version comes from it). Everything else that
# carries it follows:
#
#   scripts/version.sh                  prints CMake's version
#   scripts/version.sh check [VERSION]  checks that every other place carries
#                                       VERSION (default: CMake's) and names
#                                       each one that does not
#
# The places: Chart.yaml's version and appVersion (the chart's default image
# tag is its appVersion), the Dockerfile's default VERSION build-arg (where
# it has one), and the docs' example image tags and build-args
# (`efa-k8s-device-plugin:x.y.z`, `VERSION=x.y.z`, `image.tag=x.y.z` in
# *.md, Dockerfile and values.yaml; CHANGELOG.md is history and is left
# out). EFA_VERSION_ROOT checks another tree (the tests use a copy).
set -euo pipefail
root="${EFA_VERSION_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}"
chart="$root/helm/aws-efa-k8s-device-plugin/Chart.yaml"
die() { echo "version.sh: ERROR: $*" >&2; exit 1; }

cmake_version() {
  local v
  v="$(sed -n 's/^project([^)]*VERSION \([0-9][0-9.]*\).*/\1/p' "$root/CMakeLists.txt")"
  [[ "$v" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] ||
    die "$root/CMakeLists.txt: no project(... VERSION x.y.z) line (found '$v')"
  echo "$v"
}

# yaml_field FILE KEY: a top-level scalar, quotes removed.
yaml_field() { sed -n "s/^$2: *\"\{0,1\}\([^\"]*\)\"\{0,1\} *$/\1/p" "$1"; }

check() {
  local want="$1" bad=() got
  got="$(cmake_version)"
  [ "$got" = "$want" ] || bad+=("$root/CMakeLists.txt: project VERSION is '$got'")
  got="$(yaml_field "$chart" version)"
  [ "$got" = "$want" ] || bad+=("$chart: version is '$got'")
  got="$(yaml_field "$chart" appVersion)"
  [ "$got" = "$want" ] || bad+=("$chart: appVersion is '$got'")
  # Each stage's default, if it has one (the build scripts pass VERSION).
  while IFS= read -r got; do
    [ "$got" = "$want" ] || bad+=("$root/Dockerfile: ARG VERSION default is '$got'")
  done < <(sed -n 's/^ARG VERSION="\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$root/Dockerfile")
  local line
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    [[ "$line" == *"$want" ]] || bad+=("$line")
  done < <(grep -rnoE --include='*.md' --include=Dockerfile --include=values.yaml \
             --exclude=CHANGELOG.md --exclude-dir=build --exclude-dir=.git \
             '(efa-k8s-device-plugin:|VERSION=|image\.tag=)[0-9]+\.[0-9]+\.[0-9]+' "$root" || true)
  if [ ${#bad[@]} -gt 0 ]; then
    echo "version.sh: the version is $want, but:" >&2
    printf '  %s\n' "${bad[@]}" >&2
    exit 1
  fi
  echo "version $want: CMakeLists.txt, Chart.yaml version and appVersion, Dockerfile, docs agree"
}

case "${1:-}" in
  "") cmake_version ;;
  check) check "${2:-$(cmake_version)}" ;;
  *) die "unknown argument '$1' (usage: scripts/version.sh [check [VERSION]])" ;;
esac
