#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds with warnings as errors
# and runs every test through CTest (unit, integration, the real-kubelet e2e,
# packaging, benchmark smoke, fuzz seeds); then, for the ci preset, the
# sanitizer stage (scripts/sanitizers.sh: the suite under ASan+UBSan, the
# concurrency tests under TSan, 10 s of each fuzzer). EFA_SANITIZERS=0 skips it.
#   scripts/test.sh [preset]   (default: ci; dev and release too; asan and tsan
#                              through scripts/sanitizers.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-ci}"
scripts/install-deps.sh
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j2
ctest --preset "$preset"
if [ "$preset" = ci ] && [ "${EFA_SANITIZERS:-1}" != 0 ]; then
  scripts/sanitizers.sh
fi
