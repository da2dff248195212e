// A synthetic node of any size, built without hwloc, for tests and the
// policy benchmark.
#pragma once

#include <memory>
#include <vector>

#include "absl/strings/str_format.h"
#include "topology/host_model.h"

namespace efa::topology {

// `switches` PCIe switches, each on its own root complex with
// `efas_per_switch` EFAs ("efa0000", ... in PCI order) and
// `gpus_per_switch` GPUs behind it, spread evenly over `numa_nodes` NUMA
// nodes (in switch order). Needs efas_per_switch + gpus_per_switch <= 14.
inline std::shared_ptr<const HostModel> SyntheticHost(int switches, int efas_per_switch,
                                                      int gpus_per_switch, int numa_nodes) {
  std::vector<EfaPlacement> efas;
  std::vector<Accelerator> gpus;
  for (int s = 0; s < switches; ++s) {
    const auto domain = static_cast<uint16_t>(s / 16);
    const auto base = static_cast<uint8_t>((s % 16) * 16);
    const std::string root = absl::StrFormat("pci%04x:%02x", domain, base);
    const PciAddress upstream{domain, static_cast<uint8_t>(base + 1), 0, 0};
    const int numa = s * numa_nodes / switches;
    auto bus = static_cast<uint8_t>(base + 2);
    for (int i = 0; i < efas_per_switch; ++i) {
      efas.push_back({absl::StrFormat("efa%04d", static_cast<int>(efas.size())),
                      {domain, bus++, 0, 0},
                      numa,
                      root,
                      upstream});
    }
    for (int i = 0; i < gpus_per_switch; ++i) {
      gpus.push_back({{domain, bus++, 0, 0},
                      AcceleratorKind::kNvidiaGpu,
                      0x10de,
                      0x2330,
                      numa,
                      root,
                      upstream});
    }
  }
  return HostModel::Create("synthetic.48xlarge", std::move(efas), std::move(gpus));
}

}  // namespace efa::topology
