// Time per EFA allocation decision on synthetic nodes of 32 to 1024 EFAs
// (8 EFAs and one GPU behind each PCIe switch, four NUMA nodes): a program
// to run by hand, not a test. Build it in a release tree:
//   cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release
//   ninja -C build/release efa_policy_bench
//   build/release/test/efa_policy_bench
// Each benchmark reports the time of one ChooseEfas() call and fits the
// scaling over the node sizes (goal: well under 1 ms at 1024 EFAs).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "test/topology/synthetic_host.h"
#include "topology/allocation_policy.h"

namespace {

using efa::topology::AllocationRequest;
using efa::topology::ChooseEfas;
using efa::topology::HostModel;
using efa::topology::SyntheticHost;

constexpr int kEfasPerSwitch = 8;

std::shared_ptr<const HostModel> Host(int efas) {
  return SyntheticHost(efas / kEfasPerSwitch, kEfasPerSwitch, /*gpus_per_switch=*/1,
                       /*numa_nodes=*/4);
}

// Every EFA, or about half of them in a fixed pseudo-random pattern (a
// fragmented node, where the policy has the most to weigh).
std::vector<std::string> Available(const HostModel& model, bool fragmented) {
  std::mt19937 rng(42);
  std::vector<std::string> ids;
  for (const auto& efa : model.efas()) {
    if (!fragmented || rng() % 2 == 0) ids.push_back(efa.id);
  }
  return ids;
}

// Runs `request` on a node of state.range(0) EFAs.
void Run(benchmark::State& state, const HostModel& model, const AllocationRequest& request) {
  size_t chosen = 0;
  for (auto _ : state) {
    auto result = ChooseEfas(model, request);
    chosen = result.size();
    benchmark::DoNotOptimize(result);
  }
  state.SetComplexityN(state.range(0));
  state.counters["efas"] = static_cast<double>(model.efas().size());
  state.counters["gpus"] = static_cast<double>(model.accelerators().size());
  state.counters["chosen"] = static_cast<double>(chosen);
}

// No target, every EFA free: one whole switch.
void BM_NoTarget(benchmark::State& state) {
  auto model = Host(static_cast<int>(state.range(0)));
  AllocationRequest request;
  request.available = Available(*model, false);
  request.size = 8;
  Run(state, *model, request);
}

// No target on a fragmented node, 16 EFAs and a must-include one.
void BM_NoTargetFragmented(benchmark::State& state) {
  auto model = Host(static_cast<int>(state.range(0)));
  AllocationRequest request;
  request.available = Available(*model, true);
  request.size = 16;
  request.must_include.push_back(request.available[request.available.size() / 2]);
  Run(state, *model, request);
}

// One GPU, 8 EFAs (a fragmented node: some come from farther away).
void BM_OneGpu(benchmark::State& state) {
  auto model = Host(static_cast<int>(state.range(0)));
  AllocationRequest request;
  request.available = Available(*model, true);
  request.size = 8;
  request.target_accelerators.push_back(
      model->accelerators()[model->accelerators().size() / 2].pci);
  Run(state, *model, request);
}

// Eight GPUs (or all there are), 8 EFAs each.
void BM_EightGpus(benchmark::State& state) {
  auto model = Host(static_cast<int>(state.range(0)));
  AllocationRequest request;
  request.available = Available(*model, true);
  request.size = 0;
  const size_t gpus = std::min<size_t>(8, model->accelerators().size());
  for (size_t i = 0; i < gpus; ++i)
    request.target_accelerators.push_back(model->accelerators()[i].pci);
  request.size = static_cast<int>(gpus) * kEfasPerSwitch;
  Run(state, *model, request);
}

// Every GPU of the node as a target, half the free EFAs wanted.
void BM_AllGpus(benchmark::State& state) {
  auto model = Host(static_cast<int>(state.range(0)));
  AllocationRequest request;
  request.available = Available(*model, true);
  request.size = 0;
  for (const auto& gpu : model->accelerators()) request.target_accelerators.push_back(gpu.pci);
  request.size = static_cast<int>(request.available.size() / 2);
  Run(state, *model, request);
}

#define EFA_SCALING(bm)               \
  BENCHMARK(bm)                       \
      ->RangeMultiplier(2)            \
      ->Range(32, 1024)               \
      ->Unit(benchmark::kMicrosecond) \
      ->Complexity(benchmark::oNLogN)

EFA_SCALING(BM_NoTarget);
EFA_SCALING(BM_NoTargetFragmented);
EFA_SCALING(BM_OneGpu);
EFA_SCALING(BM_EightGpus);
EFA_SCALING(BM_AllGpus);

}  // namespace

BENCHMARK_MAIN();
