#!/usr/bin/env bash
# Installs the Debian 12 packages the build needs. Idempotent: packages
# already present are left alone.
#   scripts/install-deps.sh           everything: the daemon, the tests, the demo,
#                                     the linters (scripts/lint.sh)
#   scripts/install-deps.sh --daemon  only what building the daemon alone needs
#                                     (the image's build stage)
#   scripts/install-deps.sh --daemon --arch arm64
#                                     the same for another architecture (a dpkg
#                                     name): its cross compiler and its -dev
#                                     packages (multiarch), with the build
#                                     host's tools; cmake/debian-cross.cmake
#   scripts/install-deps.sh --only PACKAGE...
#                                     exactly these, when missing (the e2e
#                                     suite's tools)
set -euo pipefail

# ccache: every build compiles through it (CMakeLists.txt), the image's
# build stage too.
tools=(build-essential ccache cmake ninja-build pkg-config protobuf-compiler-grpc protobuf-compiler)
# Built for the target architecture (a cross build takes them as NAME:ARCH).
libraries=(
  libgrpc++-dev libprotobuf-dev libabsl-dev
  libibverbs-dev ibverbs-providers libhwloc-dev
  libyaml-cpp-dev libspdlog-dev libfmt-dev
  prometheus-cpp-dev libevent-dev
  libssl-dev  # the claim lookup's TLS (headers; libssl3 is loaded at its first GET)
)
# Headers only (Architecture: all).
headers=(libcli11-dev nlohmann-json3-dev)
daemon=("${tools[@]}" "${libraries[@]}" "${headers[@]}")
tests=(
  libcpp-httplib-dev
  clang libclang-rt-14-dev catch2 libbenchmark-dev util-linux python3-yaml unzip
  python3-prometheus-client
  prometheus  # promtool for the alert rules tests
  rpm cpio systemd  # the host install's packages: rpmbuild, rpm2cpio, systemd-analyze
)
lint=(clang-format clang-tidy shellcheck)

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
host_arch="$(dpkg --print-architecture)"
case "${1:-} ${2:-} ${3:-}" in
  "--only "*) packages=("${@:2}") ;;
  "  ") packages=("${daemon[@]}" "${tests[@]}" "${lint[@]}") ;;
  "--daemon  ") packages=("${daemon[@]}") ;;
  "--daemon --arch $host_arch") packages=("${daemon[@]}") ;;
  "--daemon --arch "?*)
    arch="$3"
    case "$arch" in
      arm64) compiler=g++-aarch64-linux-gnu ;;
      amd64) compiler=g++-x86-64-linux-gnu ;;
      *) echo "install-deps: no cross build for architecture '$arch' (amd64 or arm64)" >&2; exit 2 ;;
    esac
    # The build host's and the target's copies of some -dev packages
    # (prometheus-cpp-dev, libevent-dev, libyaml-cpp-dev) cannot be installed
    # together: a cross build gets only the target's.
    packages=("${tools[@]}" "$compiler" "${libraries[@]/%/:$arch}" "${headers[@]}")
    dpkg --print-foreign-architectures | grep -qx "$arch" || $SUDO dpkg --add-architecture "$arch"
    ;;
  *) echo "install-deps: unknown arguments '$*' (nothing, --daemon, --daemon --arch ARCH or --only PACKAGE...)" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install-deps: installing ${missing[*]}" >&2
$SUDO "$(dirname "$0")/apt-get.sh" update -qq
DEBIAN_FRONTEND=noninteractive $SUDO "$(dirname "$0")/apt-get.sh" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
