#!/usr/bin/env bash
# Installs the Debian 12 packages the build needs. Idempotent: packages
# already present are left alone.
#   scripts/install-deps.sh           everything: the daemon, the tests, the demo,
#                                     the linters (scripts/lint.sh)
#   scripts/install-deps.sh --daemon  only what building the daemon alone needs
#                                     (the image's build stage)
set -euo pipefail

daemon=(
  build-essential cmake ninja-build pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libibverbs-dev ibverbs-providers libhwloc-dev
  libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  prometheus-cpp-dev libevent-dev
)
tests=(
  libcpp-httplib-dev
  clang libclang-rt-14-dev catch2 libbenchmark-dev util-linux python3-yaml unzip
  python3-prometheus-client
)
lint=(clang-format clang-tidy shellcheck)

case "${1:-}" in
  "") packages=("${daemon[@]}" "${tests[@]}" "${lint[@]}") ;;
  --daemon) packages=("${daemon[@]}") ;;
  *) echo "install-deps: unknown argument '$1' (--daemon or nothing)" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-deps: installing ${missing[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
