#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds with warnings as errors
# and runs every test through CTest. Ends with CTest's summary line.
#   scripts/test.sh [preset]   (default: ci; also asan, tsan)
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-ci}"
scripts/install-deps.sh
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j2
ctest --preset "$preset"
