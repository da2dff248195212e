#!/usr/bin/env bash
# The benchmark suite (BENCHMARKS.md): builds the Release targets it needs in
# build/bench, runs the real daemon on simulated nodes against the fake
# kubelet and prints one table, each figure beside a baseline measured in the
# same run. The table also goes to build/bench/bench-results.md.
#   scripts/bench.sh                       (3 to 4 minutes: 100k RPCs, 60 s idle)
#   scripts/bench.sh --quick               (seconds: proves it runs, measures nothing)
#   scripts/bench.sh --idle-seconds 10 --out FILE --logs DIR   (any efa_bench flag)
# EFA_BENCH_IDLE_SECONDS sets the idle window too; EFA_BENCH_JOBS the build's
# parallelism (default 2). Run it on a quiet machine: the load average is
# recorded with the figures.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build=build/bench
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEFA_WERROR=ON >/dev/null
cmake --build "$build" -j"${EFA_BENCH_JOBS:-2}" --target efa_bench efa-bench-echo efa-k8s-device-plugin \
  efa-k8s-device-plugin-idle
exec "$build/test/efa_bench" --out "$build/bench-results.md" "$@"
