// Time per EFA allocation decision on synthetic nodes of 32 to 1024 EFAs
// (test/bench/policy_scenarios.h), with Google Benchmark's statistics and
// complexity fit: a program to run by hand, not a test. Build it in a
// release tree:
//   cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release
//   ninja -C build/release efa_policy_bench
//   build/release/test/efa_policy_bench
// scripts/bench.sh times the same scenarios in its table (BENCHMARKS.md).
#include <benchmark/benchmark.h>

#include "test/bench/policy_scenarios.h"

namespace {

// Times `scenario` on a node of state.range(0) EFAs.
void Run(benchmark::State& state, const efa::bench::PolicyScenario& scenario) {
  auto model = efa::bench::PolicyHost(static_cast<int>(state.range(0)));
  const auto request = scenario.request(*model);
  size_t chosen = 0;
  for (auto _ : state) {
    auto result = efa::topology::ChooseEfas(*model, request);
    chosen = result.size();
    benchmark::DoNotOptimize(result);
  }
  state.SetComplexityN(state.range(0));
  state.counters["efas"] = static_cast<double>(model->efas().size());
  state.counters["gpus"] = static_cast<double>(model->accelerators().size());
  state.counters["chosen"] = static_cast<double>(chosen);
}

}  // namespace

int main(int argc, char** argv) {
  for (const auto& scenario : efa::bench::PolicyScenarios()) {
    benchmark::RegisterBenchmark(scenario.name,
                                 [&scenario](benchmark::State& state) { Run(state, scenario); })
        ->RangeMultiplier(2)
        ->Range(32, 1024)
        ->Unit(benchmark::kMicrosecond)
        ->Complexity(benchmark::oNLogN);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
