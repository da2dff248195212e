#!/usr/bin/env bash
# Tests that a release carries the host install's packages for amd64 and
# arm64 beside the image and the chart, with their checksums:
#
#   test/release/artifacts_test.sh VERSION        (CTest passes ${PROJECT_VERSION})
#   test/release/artifacts_test.sh VERSION DIR    a real release's artifacts,
#                                                 as scripts/release.sh wrote them
#
# Without DIR, scripts/release.sh runs with a stand-in for scripts/image.sh
# (EFA_RELEASE_IMAGE_SH; the real one builds both images and both
# architectures' packages, which takes root and minutes) that writes what
# image.sh is asked for: the image archive (EFA_IMAGE_TAR) and the four
# packages (EFA_IMAGE_PACKAGES). Then, as a user would check a download:
# SHA256SUMS names exactly the chart, the index, the image and the four
# packages, and `sha256sum -c` passes. A stand-in that leaves one package
# out, or writes it empty, makes release.sh fail naming it. With DIR, the
# same checks on DIR, and each package's architecture and version as
# dpkg-deb and rpm read them. Skips (77) without helm ($HELM, the chart
# test's cached one in /var/cache/efa-helm, or on PATH). Ends with "N
# passed, M failed"; exits non-zero when anything failed.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
readonly ROOT
readonly VERSION="${1:?usage: artifacts_test.sh VERSION [DIR]}"
readonly DIR="${2:-}"
readonly PKG=efa-k8s-device-plugin

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok   - $1"; }
fail() { failed=$((failed + 1)); echo "FAIL - $1"; echo "       ${2//$'\n'/$'\n'       }"; }
expect() { if [ "$3" = "$2" ]; then pass "$1"; else fail "$1" "expected: $2"$'\n'"got:      $3"; fi; }

readonly PACKAGES="${PKG}_${VERSION}_amd64.deb
${PKG}_${VERSION}_arm64.deb
$PKG-$VERSION-1.aarch64.rpm
$PKG-$VERSION-1.x86_64.rpm"
ARTIFACTS="$(sort <<< "$PACKAGES
$PKG-$VERSION.tar
aws-efa-k8s-device-plugin-$VERSION.tgz
index.yaml")"
readonly ARTIFACTS

# check_release DIR: SHA256SUMS covers exactly the artifacts, and they match.
check_release() {
  local dir="$1" listed got
  [ -f "$dir/SHA256SUMS" ] || { fail "SHA256SUMS is in $dir" "$(ls "$dir")"; return; }
  listed="$(awk '{ print $2 }' "$dir/SHA256SUMS" | sort)"
  expect "SHA256SUMS names the chart, the index, the image and the four packages" "$ARTIFACTS" "$listed"
  got="$(find "$dir" -mindepth 1 -maxdepth 1 ! -name SHA256SUMS -printf '%f\n' | sort)"
  expect "the release directory holds exactly those" "$ARTIFACTS" "$got"
  if got="$(cd "$dir" && sha256sum -c SHA256SUMS 2>&1)"; then
    pass "sha256sum -c SHA256SUMS passes"
  else fail "sha256sum -c SHA256SUMS passes" "$got"; fi
}

if [ -n "$DIR" ]; then
  check_release "$DIR"
  for deb in "$DIR"/*.deb; do
    arch="${deb%.deb}"; arch="${arch##*_}"
    expect "${deb##*/}: dpkg-deb reads architecture and version" "$arch $VERSION" \
      "$(dpkg-deb -f "$deb" Architecture) $(dpkg-deb -f "$deb" Version)"
  done
  for rpm in "$DIR"/*.rpm; do
    arch="${rpm%.rpm}"; arch="${arch##*.}"
    expect "${rpm##*/}: rpm reads architecture and version" "$arch $VERSION" \
      "$(rpm -qp --qf '%{ARCH} %{VERSION}' "$rpm" 2>&1)"
  done
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit
fi

helm="${HELM:-}"
[ -n "$helm" ] || { [ -x /var/cache/efa-helm/helm ] && helm=/var/cache/efa-helm/helm; }
[ -n "$helm" ] || helm="$(command -v helm || true)"
[ -n "$helm" ] || { echo "skipped: no helm (HELM, /var/cache/efa-helm/helm, PATH)"; exit 77; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The stand-in: what scripts/image.sh writes when release.sh asks for the
# image and the packages; STAND_IN_OMIT and STAND_IN_EMPTY name a package
# it leaves out or writes empty.
cat > "$work/image.sh" <<EOF
#!/usr/bin/env bash
set -eu
echo "image \$1" > "\$EFA_IMAGE_TAR"
while read -r f; do
  [ "\$f" != "\${STAND_IN_OMIT:-}" ] || continue
  if [ "\$f" = "\${STAND_IN_EMPTY:-}" ]; then : > "\$EFA_IMAGE_PACKAGES/\$f"; else echo "\$f" > "\$EFA_IMAGE_PACKAGES/\$f"; fi
done <<'LIST'
$PACKAGES
LIST
EOF
chmod +x "$work/image.sh"
release() { HELM="$helm" EFA_RELEASE_IMAGE_SH="$work/image.sh" EFA_RELEASE_DIR="$work/$1" "$ROOT/scripts/release.sh" 2>&1; }

if out="$(release full)"; then pass "release.sh with the image and the packages"
else fail "release.sh with the image and the packages" "$out"; fi
check_release "$work/full"

arm64_rpm="$PKG-$VERSION-1.aarch64.rpm"
out="$(STAND_IN_OMIT="$arm64_rpm" release omit)"
expect "release.sh without the arm64 .rpm: refused" 1 "$?"
expect "release.sh without the arm64 .rpm: names it" \
  "release: ERROR: $work/image.sh wrote no package $arm64_rpm in $work/omit" "$(tail -n1 <<< "$out")"
arm64_deb="${PKG}_${VERSION}_arm64.deb"
out="$(STAND_IN_EMPTY="$arm64_deb" release empty)"
expect "release.sh with an empty arm64 .deb: refused" 1 "$?"
expect "release.sh with an empty arm64 .deb: names it" \
  "release: ERROR: $work/image.sh wrote no package $arm64_deb in $work/empty" "$(tail -n1 <<< "$out")"

# An earlier release's packages do not stay listed.
mkdir -p "$work/stale" && echo old > "$work/stale/${PKG}_0.0.1_arm64.deb"
release stale >/dev/null
expect "an earlier version's package in the directory is removed" "" "$(find "$work/stale" -name '*0.0.1*' -printf '%f\n')"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
