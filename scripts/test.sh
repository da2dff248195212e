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
#                           kubelet) and the host install's .deb and .rpm of
#                           both from the same builds (checked: architecture,
#                           version, the daemon's machine), the
#                           lifecycle soak (5,000 random steps of the daemon
#                           binary on a simulated node, test/lifecycle), and
#                           the sanitizer stages (scripts/sanitizers.sh: the
#                           suite under ASan+UBSan, the concurrency tests under
#                           TSan, 10 s of each fuzzer). The e2e and the
#                           soak run in the background beside them. CI runs
#                           this.
# Installs the Debian packages it needs. Each stage prints its time, and the
# run ends with a table of them all (scripts/stages.sh; under .ci/run, in
# its table); any failure stops the run with a non-zero exit.
set -euo pipefail
cd "$(dirname "$0")/.."
all=0
for arg in "$@"; do
  case "$arg" in
    --all) all=1 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "test.sh: unknown argument '$arg' (--all or nothing)" >&2; exit 2 ;;
  esac
done

# shellcheck source=scripts/stages.sh
source scripts/stages.sh
stages_init test.sh

# ctest_times: each test's time in the last run, slowest first ("SECONDS NAME").
ctest_times() {
  awk '/^[0-9]+\/[0-9]+ Test: / {name = $0; sub(/^[0-9]+\/[0-9]+ Test: /, "", name)}
       /^Test time =/ {print $4, name}' \
    build/ci/Testing/Temporary/LastTest.log 2>/dev/null | sort -rn
}

stage_begin "packages"
scripts/install-deps.sh
stage_begin "ci build"
cmake --preset ci >/dev/null
cmake --build --preset ci -j2
if [ "$all" = 1 ]; then
  stage_begin "image and packages (amd64, arm64)"
  EFA_TEST_BIN=build/ci/test EFA_WERROR=ON EFA_IMAGE_PACKAGES="$PWD/build/image/packages" scripts/image.sh
  export EFA_E2E_IMAGE_TAR="$PWD/build/image/efa-k8s-device-plugin.tar"
fi
# The e2e's Kubernetes build (test/e2e/build-kubernetes.sh), before CTest: on
# a fresh machine ten minutes the e2e would otherwise spend building. Under
# .ci/run it started in the background at the beginning, and this waits
# for it (its lock) and finds everything built. It needs root, as the e2e.
if [ "$(id -u)" -eq 0 ]; then
  stage_begin "kubernetes build (or waiting for it)"
  test/e2e/build-kubernetes.sh --with-helm >/dev/null
fi
stage_begin "ctest (ci preset)"
# The e2e mostly waits on the kubelet, containerd and helm (about 500 s on
# a cold machine, 30 % of one core): under --all it runs beside CTest's
# other tests, the soak and the sanitizer stages, in the background above
# them in CPU priority, as CTest would run it, and the run waits for it at
# the end.
e2e_log=""
ctest_args=()
if [ "$all" = 1 ] && [ "$(id -u)" -eq 0 ]; then
  e2e_log="$PWD/build/ci/e2e_real_kubelet.log"
  stage_background --above e2e_real_kubelet "$e2e_log" \
    env EFA_E2E_BUILD_DIR="$PWD/build/ci" EFA_E2E_JOBS=2 timeout 4500 test/e2e/run.sh
  ctest_args=(-LE e2e)
fi
status=0
ctest --preset ci "${ctest_args[@]}" || status=$?
echo "test.sh: the ten slowest tests (s):" >&2
ctest_times | awk 'NR <= 10 {print "  " $0}' >&2
e2e="$(ctest_times | awk '$2 == "e2e_real_kubelet" && NF == 2 {print int($1)}')"
[ -z "$e2e" ] || stage_note "of which e2e_real_kubelet" "$e2e"
[ "$status" -eq 0 ] || exit "$status"
# wait_background NAME LOG: waits for the background stage NAME; prints its
# whole output and fails when it failed, else its last lines.
wait_background() {
  stage_begin "$1 (waiting for it)"
  local status=0
  stage_wait "$1" || status=$?
  if [ "$status" -ne 0 ]; then
    cat "$2"
    echo "test.sh: $1 FAILED (exit $status; its output above, in $2)" >&2
    exit "$status"
  fi
  tail -n 3 "$2"
}
if [ "$all" = 1 ]; then
  # 1 seed x 2 alignment modes x 2,500 steps, every event group: the
  # daemon's reconfigurations and the upgrade from the base commit's binary
  # too (CTest's lifecycle_* entries run 3 seeds x 150 steps per mode). It
  # keeps about one core busy: in the background above the sanitizer
  # builds beside it, as the e2e.
  soak_log="$PWD/build/ci/lifecycle-soak.log"
  stage_background --above "lifecycle soak" "$soak_log" \
    build/ci/test/efa-lifecycle --mode both --seeds 1001 --steps 2500 --shrink-seconds 180
  for sanitizer in asan tsan fuzz; do
    stage_begin "$sanitizer"
    scripts/sanitizers.sh "$sanitizer"
  done
  wait_background "lifecycle soak" "$soak_log"
fi
[ -z "$e2e_log" ] || wait_background e2e_real_kubelet "$e2e_log"
stage_end
echo "test.sh: all stages passed in $((SECONDS - stages_started)) s" >&2
