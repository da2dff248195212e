// Fuzzes what the kubelet sends the device plugin: the input's first byte
// picks the request (even: AllocateRequest, odd: PreferredAllocationRequest),
// the second which GPUs the admitted container holds (one bit each), the
// rest is the serialized request. Each container request goes to
// AllocateContainer or PreferredDevices over a small node: 4 GPUs and 8
// EFAs, two behind each GPU's switch, one EFA unhealthy.
//  - Allocate answers exactly the requested devices, each once, or refuses
//    with INVALID_ARGUMENT or FAILED_PRECONDITION and a bounded message.
//  - GetPreferredAllocation never fails: its answer holds no ID twice, only
//    known healthy available IDs or must-include IDs, every must-include ID,
//    exactly the size asked for when there are enough of those (all of them
//    when there are not), and never more than the size or the must-include
//    IDs.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "plugin/alignment/cdi_spec.h"
#include "plugin/device_plugin_service.h"
#include "test/fuzz/fuzz_check.h"

using namespace efa::plugin;
using efa::topology::Accelerator;
using efa::topology::EfaDevice;
using efa::topology::EfaPlacement;
using efa::topology::PciAddress;

namespace {

constexpr int kGpus = 4;
constexpr int kEfasPerGpu = 2;

PciAddress Pci(int bus) { return PciAddress{0, static_cast<uint8_t>(bus), 0, 0}; }

const efa::topology::DeviceTable& Table() {
  static const efa::topology::DeviceTable* table = [] {
    std::vector<EfaDevice> devices;
    std::vector<EfaPlacement> placements;
    std::vector<Accelerator> gpus;
    for (int g = 0; g < kGpus; ++g) {
      const int numa = g < kGpus / 2 ? 0 : 1;
      const std::string root = absl::StrCat("pci0000:", 0x40 + 0x10 * g);
      const PciAddress upstream = Pci(0x40 + 0x10 * g + 1);
      Accelerator gpu;
      gpu.pci = Pci(0x40 + 0x10 * g + 8);
      gpu.vendor_id = 0x10de;
      gpu.device_id = 0x2330;
      gpu.numa_node = numa;
      gpu.root_complex = root;
      gpu.pcie_switch = upstream;
      gpus.push_back(gpu);
      for (int e = 0; e < kEfasPerGpu; ++e) {
        const int bus = 0x40 + 0x10 * g + 2 + e;
        EfaDevice d;
        d.ibdev = absl::StrCat("rdmap", bus, "s0");
        d.uverbs = absl::StrCat("uverbs", devices.size());
        d.uverbs_path = "/dev/infiniband/" + d.uverbs;
        d.pci = Pci(bus);
        d.device_id = 0xefa1;
        d.generation = 2;
        d.numa_node = numa;
        d.root_complex = root;
        if (devices.size() == 5) d.health_problem = "/dev/infiniband/uverbs5: gone";
        placements.push_back({d.ibdev, d.pci, d.numa_node, root, upstream});
        devices.push_back(std::move(d));
      }
    }
    auto model = efa::topology::HostModel::Create("p5.48xlarge", placements, gpus);
    return new efa::topology::DeviceTable(std::move(devices), std::move(model));
  }();
  return *table;
}

void CheckAllocate(const v1beta1::ContainerAllocateRequest& request) {
  const efa::topology::DeviceTable& table = Table();
  auto response = AllocateContainer(table, request);
  if (!response.ok()) {
    // A code the metrics create up front (kAllocateCodes), never OK.
    const auto code = static_cast<grpc::StatusCode>(response.status().code());
    FUZZ_CHECK(code != grpc::StatusCode::OK &&
               std::ranges::find(efa::plugin::kAllocateCodes, code) !=
                   efa::plugin::kAllocateCodes.end());
    FUZZ_CHECK_MSG(!response.status().message().empty() && response.status().message().size() < 400,
                   response.status().message());
    return;
  }
  std::set<std::string> ids(request.devices_ids().begin(), request.devices_ids().end());
  FUZZ_CHECK(ids.size() == static_cast<size_t>(request.devices_ids_size()));
  FUZZ_CHECK(response->devices_size() == request.devices_ids_size());
  std::set<std::string> named;
  for (absl::string_view id : absl::StrSplit(response->envs().at(kEnvDevices), ',')) {
    named.insert(std::string(id));
  }
  FUZZ_CHECK(named == ids);
  for (const std::string& id : ids) {
    const EfaDevice* d = table.Find(id);
    FUZZ_CHECK(d != nullptr && d->healthy());
  }
}

void CheckPreferred(const v1beta1::ContainerPreferredAllocationRequest& request,
                    const Targets& targets) {
  const efa::topology::DeviceTable& table = Table();
  const std::vector<std::string> chosen = PreferredDevices(table, request, targets);
  const std::set<std::string> unique(chosen.begin(), chosen.end());
  FUZZ_CHECK(unique.size() == chosen.size());
  const std::set<std::string> available(request.available_deviceids().begin(),
                                        request.available_deviceids().end());
  const std::set<std::string> must(request.must_include_deviceids().begin(),
                                   request.must_include_deviceids().end());
  for (const std::string& id : chosen) {
    const EfaDevice* d = table.Find(id);
    FUZZ_CHECK_MSG(
        must.count(id) == 1 || (available.count(id) == 1 && d != nullptr && d->healthy()), id);
  }
  // Every must-include ID is in the answer (the kubelet has given them
  // already), known or not.
  for (const std::string& id : must) FUZZ_CHECK_MSG(unique.count(id) == 1, id);
  // The candidates: the must-include IDs and the known healthy available
  // ones. Exactly `size` of them when there are enough, all of them when
  // there are not.
  std::set<std::string> candidates = must;
  for (const std::string& id : available) {
    const EfaDevice* d = table.Find(id);
    if (d != nullptr && d->healthy()) candidates.insert(id);
  }
  const size_t size = static_cast<size_t>(std::max(request.allocation_size(), 0));
  FUZZ_CHECK(chosen.size() <= std::max(size, must.size()));
  if (must.size() <= size && candidates.size() >= size) {
    FUZZ_CHECK_MSG(chosen.size() == size, absl::StrCat(chosen.size(), " IDs for size ", size));
  } else if (candidates.size() < size) {
    FUZZ_CHECK(unique == candidates);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const std::string bytes(reinterpret_cast<const char*>(data) + 2, size - 2);
  if (data[0] % 2 == 0) {
    v1beta1::AllocateRequest request;
    if (!request.ParseFromString(bytes)) return 0;
    for (const auto& container : request.container_requests()) CheckAllocate(container);
    return 0;
  }
  v1beta1::PreferredAllocationRequest request;
  if (!request.ParseFromString(bytes)) return 0;
  Targets targets;
  for (int g = 0; g < kGpus; ++g) {
    if (data[1] & (1u << g)) targets.pci.push_back(Table().model->accelerators()[g].pci);
    if (data[1] & (0x10u << g)) targets.busy.push_back(Table().model->accelerators()[g].pci);
  }
  targets.busy_known = !targets.busy.empty();
  for (const auto& container : request.container_requests()) CheckPreferred(container, targets);
  return 0;
}
