#!/usr/bin/env bash
# Fetches containerd 1.7 (Debian 13's package) for the end-to-end suite, which
# needs a runtime that injects CDI devices named in `cdi.k8s.io/` annotations
# (enable_cdi; Debian 12's containerd 1.6 has no CDI). The package is
# downloaded, not installed: the system's containerd stays as it is.
#
#   test/e2e/fetch-containerd.sh      prints the directory holding bin/containerd
#
# Into the cache that survives between runs (EFA_E2E_CACHE, default
# /var/cache/efa-e2e):
#   containerd/apt/        a sources list naming trixie, used only for this
#                          download, with its own package lists and apt cache
#                          (the system's apt state is not touched)
#   containerd/<ver>.deb   the package, kept: reruns need no network
#   containerd/<ver>/      its files (dpkg-deb -x): usr/bin/containerd, ctr,
#                          containerd-shim-runc-v2
# Its binaries are static but for libc (the package needs glibc 2.34; Debian
# 12 has 2.36).
set -euo pipefail

readonly CACHE="${EFA_E2E_CACHE:-/var/cache/efa-e2e}"
readonly VERSION="1.7.24~ds1-6+deb13u1"
readonly DIR="$CACHE/containerd"
readonly APT="$DIR/apt"
readonly DEB="$DIR/containerd_${VERSION}_amd64.deb"
readonly ROOT="$DIR/$VERSION"

say() { echo "fetch-containerd: $*" >&2; }
die() { say "ERROR: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (writes $CACHE)"

# apt with a private sources list, lists and cache: nothing of the system's.
private_apt() {
  local cmd="$1"; shift
  "$cmd" -qq -o Dir::Etc::SourceList="$APT/trixie.sources" -o Dir::Etc::SourceParts=/dev/null \
    -o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null \
    -o Dir::State::Lists="$APT/lists" -o Dir::Cache="$APT/cache" \
    -o APT::Sandbox::User=root "$@"
}

download() {
  mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial"
  # The mirror the system uses, else Debian's.
  local uri
  uri="$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)"
  cat > "$APT/trixie.sources" <<EOF
Types: deb
URIs: ${uri:-http://deb.debian.org/debian}
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  say "downloading containerd $VERSION from Debian 13 (trixie)"
  private_apt apt-get update || die "apt-get update of the trixie list ($APT/trixie.sources) failed"
  local work; work="$(mktemp -d "$DIR/dl.XXXXXX")"
  (cd "$work" && private_apt apt-get download "containerd=$VERSION") \
    || { rm -rf "$work"; die "apt-get download containerd=$VERSION failed (is it still in trixie?)"; }
  mv "$work"/containerd_*.deb "$DEB"
  rm -rf "$work"
}

main() {
  mkdir -p "$DIR"
  [ -s "$DEB" ] || download
  if [ ! -x "$ROOT/usr/bin/containerd" ]; then
    rm -rf "$ROOT.tmp"
    dpkg-deb -x "$DEB" "$ROOT.tmp" || die "dpkg-deb -x $DEB failed"
    mv "$ROOT.tmp" "$ROOT"
  fi
  "$ROOT/usr/bin/containerd" --version | grep -q " 1\.7\." \
    || die "$ROOT/usr/bin/containerd does not run or is not 1.7: $("$ROOT/usr/bin/containerd" --version 2>&1)"
  echo "$ROOT/usr/bin"
}

main
