// The allocation policy's benchmark scenarios: synthetic nodes of 32 to 1024
// EFAs (8 EFAs and one GPU behind each PCIe switch, four NUMA nodes: 1024
// EFAs come with 128 GPUs) and the requests timed on them. Shared by
// efa_policy_bench (Google Benchmark) and efa_bench (the suite).
#pragma once

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "test/topology/synthetic_host.h"
#include "topology/allocation_policy.h"
#include "topology/host_model.h"

namespace efa::bench {

inline constexpr int kEfasPerSwitch = 8;

// A node of `efas` EFAs (a multiple of kEfasPerSwitch).
inline std::shared_ptr<const topology::HostModel> PolicyHost(int efas) {
  return topology::SyntheticHost(efas / kEfasPerSwitch, kEfasPerSwitch, /*gpus_per_switch=*/1,
                                 /*numa_nodes=*/4);
}

// Every EFA, or about half of them in a fixed pseudo-random pattern (a
// fragmented node, where the policy has the most to weigh).
inline std::vector<std::string> AvailableEfas(const topology::HostModel& model, bool fragmented) {
  std::mt19937 rng(42);
  std::vector<std::string> ids;
  for (const auto& efa : model.efas()) {
    if (!fragmented || rng() % 2 == 0) ids.push_back(efa.id);
  }
  return ids;
}

struct PolicyScenario {
  const char* name;
  const char* description;
  topology::AllocationRequest (*request)(const topology::HostModel& model);
};

// The scenarios, each a request on a given node.
inline const std::vector<PolicyScenario>& PolicyScenarios() {
  using topology::AllocationRequest;
  using topology::HostModel;
  static const std::vector<PolicyScenario> scenarios = {
      {"NoTarget", "no GPU known, every EFA free, 8 wanted",
       [](const HostModel& model) {
         AllocationRequest r;
         r.available = AvailableEfas(model, false);
         r.size = 8;
         return r;
       }},
      {"NoTargetFragmented", "no GPU known, half free, 16 wanted, 1 must-include",
       [](const HostModel& model) {
         AllocationRequest r;
         r.available = AvailableEfas(model, true);
         r.size = 16;
         r.must_include.push_back(r.available[r.available.size() / 2]);
         return r;
       }},
      {"OneGpu", "1 GPU, half free, 8 wanted",
       [](const HostModel& model) {
         AllocationRequest r;
         r.available = AvailableEfas(model, true);
         r.size = 8;
         r.target_accelerators.push_back(model.accelerators()[model.accelerators().size() / 2].pci);
         return r;
       }},
      {"EightGpus", "8 GPUs, half free, 64 wanted",
       [](const HostModel& model) {
         AllocationRequest r;
         r.available = AvailableEfas(model, true);
         const size_t gpus = std::min<size_t>(8, model.accelerators().size());
         for (size_t i = 0; i < gpus; ++i) {
           r.target_accelerators.push_back(model.accelerators()[i].pci);
         }
         r.size = static_cast<int>(gpus) * kEfasPerSwitch;
         return r;
       }},
      {"AllGpus", "every GPU, half free, half of those wanted",
       [](const HostModel& model) {
         AllocationRequest r;
         r.available = AvailableEfas(model, true);
         for (const auto& gpu : model.accelerators()) r.target_accelerators.push_back(gpu.pci);
         r.size = static_cast<int>(r.available.size() / 2);
         return r;
       }},
  };
  return scenarios;
}

}  // namespace efa::bench
