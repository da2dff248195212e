#!/usr/bin/env bash
# Produces a release's artifacts, at the version of CMakeLists.txt's
# project(VERSION) (scripts/version.sh; every other place must agree):
#
#   scripts/release.sh [--url URL] [--merge INDEX] [--out DIR] [VERSION]
#
# into DIR (default build/release-artifacts):
#   efa-k8s-device-plugin-VERSION.tar       the image archive (scripts/image.sh;
#                                           `ctr images import`, skopeo, podman load)
#   efa-k8s-device-plugin_VERSION_amd64.deb, efa-k8s-device-plugin_VERSION_arm64.deb,
#   efa-k8s-device-plugin-VERSION-1.x86_64.rpm, efa-k8s-device-plugin-VERSION-1.aarch64.rpm
#                                           the host install (docs/install.md),
#                                           from the image's build stage of each
#                                           architecture (the Dockerfile's
#                                           packages stage; arm64 cross-compiled)
#   aws-efa-k8s-device-plugin-VERSION.tgz   the chart (helm package)
#   index.yaml                              the chart repository's index (helm repo index)
#   SHA256SUMS                              of the files above
#
# VERSION, when given, must be CMake's: a release is cut from a tree that
# says its version, never relabelled. --url (or EFA_RELEASE_URL) is the base
# URL the repository will be served from, written into index.yaml (without
# it the chart's URL is relative, which helm resolves against the
# repository's URL); --merge INDEX (EFA_RELEASE_MERGE) merges the published
# index.yaml so that the repository keeps listing earlier releases.
# Environment: EFA_RELEASE_DIR (DIR), EFA_RELEASE_SKIP_IMAGE=1 (no image and
# no packages, which come from the same podman builds: fast, and no root
# needed), EFA_RELEASE_IMAGE_SH (the image script, default scripts/image.sh;
# test/release/artifacts_test.sh gives a stand-in), HELM (default: helm on
# PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
readonly CHART=helm/aws-efa-k8s-device-plugin
say() { echo "release: $*" >&2; }
die() { say "ERROR: $*"; exit 1; }

out="${EFA_RELEASE_DIR:-$PWD/build/release-artifacts}"
url="${EFA_RELEASE_URL:-}"
merge="${EFA_RELEASE_MERGE:-}"
asked=""
while [ $# -gt 0 ]; do
  case "$1" in
    --url) [ $# -ge 2 ] || die "--url needs a URL"; url="$2"; shift 2 ;;
    --merge) [ $# -ge 2 ] || die "--merge needs the published index.yaml"; merge="$2"; shift 2 ;;
    --out) [ $# -ge 2 ] || die "--out needs a directory"; out="$2"; shift 2 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) [ -z "$asked" ] || die "one VERSION only (got '$asked' and '$1')"; asked="$1"; shift ;;
  esac
done

version="$(scripts/version.sh)"
if [ -n "$asked" ] && [ "$asked" != "$version" ]; then
  die "VERSION $asked differs from CMakeLists.txt's project VERSION $version: set it there" \
      "(and in Chart.yaml and the Dockerfile: scripts/version.sh check $asked lists every place), then release"
fi
scripts/version.sh check "$version" >&2
helm="${HELM:-helm}"
command -v "$helm" >/dev/null ||
  die "helm ('$helm') not found: install helm 3.8 or later, or set HELM=/path/to/helm"
started=$SECONDS
if [ -n "$merge" ]; then
  # A copy: the published index may be the one in DIR, which goes below.
  [ -f "$merge" ] || die "--merge $merge: no such file (the published index.yaml)"
  published="$(mktemp)"
  trap 'rm -f "$published"' EXIT
  cp "$merge" "$published"
  merge="$published"
fi

# The artifacts of an earlier run go, so the index and the checksums cover
# this release only (an earlier version's package would be indexed again).
mkdir -p "$out"
out="$(cd "$out" && pwd)"
rm -f "$out"/efa-k8s-device-plugin-*.tar "$out"/aws-efa-k8s-device-plugin-*.tgz \
      "$out"/efa-k8s-device-plugin[_-]*.deb "$out"/efa-k8s-device-plugin-*.rpm \
      "$out/index.yaml" "$out/SHA256SUMS"

image="efa-k8s-device-plugin-$version.tar"
# The host install's packages, one .deb and one .rpm per architecture.
host_packages=("efa-k8s-device-plugin_${version}_amd64.deb" "efa-k8s-device-plugin_${version}_arm64.deb"
               "efa-k8s-device-plugin-$version-1.x86_64.rpm" "efa-k8s-device-plugin-$version-1.aarch64.rpm")
image_sh="${EFA_RELEASE_IMAGE_SH:-scripts/image.sh}"
if [ "${EFA_RELEASE_SKIP_IMAGE:-0}" = 1 ]; then
  say "EFA_RELEASE_SKIP_IMAGE=1: no image archive, no packages"
  host_packages=()
else
  say "building the image efa-k8s-device-plugin:$version and the packages ($image_sh)"
  EFA_IMAGE_ARCHES="amd64 arm64" EFA_IMAGE_TAR="$out/$image" EFA_IMAGE_PACKAGES="$out" \
    "$image_sh" "efa-k8s-device-plugin:$version" || die "$image_sh failed (its output is above)"
  [ -s "$out/$image" ] || die "$image_sh wrote no archive at $out/$image"
  for f in "${host_packages[@]}"; do
    [ -s "$out/$f" ] || die "$image_sh wrote no package $f in $out"
  done
fi

"$helm" package "$CHART" -d "$out" >/dev/null || die "helm package $CHART failed"
package="aws-efa-k8s-device-plugin-$version.tgz"
[ -f "$out/$package" ] || die "helm package wrote no $out/$package: $(ls "$out")"
index=("$helm" repo index "$out")
[ -z "$url" ] || index+=(--url "$url")
[ -z "$merge" ] || index+=(--merge "$merge")
"${index[@]}" || die "${index[*]} failed"

files=("$package" index.yaml)
[ ! -f "$out/$image" ] || files+=("$image" "${host_packages[@]}")
(cd "$out" && sha256sum -- "${files[@]}" > SHA256SUMS)
say "version $version in $out ($((SECONDS - started)) s):"
(cd "$out" && cat SHA256SUMS)
