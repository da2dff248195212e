#!/usr/bin/env bash
# The test suite, in two tiers (docs/development.md: Tests):
#   scripts/test.sh         the whole CTest suite on the ci preset (warnings are
#                           errors): unit, integration, fault, lifecycle seeds,
#                           the real-kubelet e2e, packaging, benchmark smoke,
#                           fuzz seeds.
#   scripts/test.sh --all   also builds the image from the Dockerfile with
#                           podman for amd64 and arm64 (scripts/image.sh,
#                           -Werror; runs both, arm64 under emulation; the
#                           e2e then runs the chart's pod from it on the real
#                           kubelet), the
#                           lifecycle soak (5,000 random steps of the daemon
#                           binary on a simulated node, test/lifecycle), and
#                           the sanitizer stages (scripts/sanitizers.sh: the
#                           suite under ASan+UBSan, the concurrency tests under
#                           TSan, 10 s of each fuzzer). CI runs this.
# Installs the Debian packages it needs. Each stage prints its time; any
# failure stops the run with a non-zero exit.
set -euo pipefail
cd "$(dirname "$0")/.."
all=0
for arg in "$@"; do
  case "$arg" in
    --all) all=1 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "test.sh: unknown argument '$arg' (--all or nothing)" >&2; exit 2 ;;
  esac
done

started=$SECONDS
stage_started=$SECONDS
stage() { echo "test.sh: $1: $((SECONDS - stage_started)) s" >&2; stage_started=$SECONDS; }

scripts/install-deps.sh
cmake --preset ci >/dev/null
cmake --build --preset ci -j2
stage "ci build"
if [ "$all" = 1 ]; then
  EFA_TEST_BIN=build/ci/test EFA_WERROR=ON scripts/image.sh
  export EFA_E2E_IMAGE_TAR="$PWD/build/image/efa-k8s-device-plugin.tar"
  stage "image"
fi
ctest --preset ci
stage "ctest (ci preset)"
if [ "$all" = 1 ]; then
  # 1 seed x 2 alignment modes x 2,500 steps (CTest's lifecycle_* entries
  # run 3 seeds x 150 steps per mode).
  build/ci/test/efa-lifecycle --mode both --seeds 1001 --steps 2500 --shrink-seconds 180
  stage "lifecycle soak"
  scripts/sanitizers.sh
  stage "sanitizers"
fi
echo "test.sh: all stages passed in $((SECONDS - started)) s" >&2
