#include "topology/device_table.h"

#include <algorithm>
#include <optional>

#include "topology/replica_id.h"

namespace efa::topology {

DeviceTable::DeviceTable(std::vector<EfaDevice> devs, std::shared_ptr<const HostModel> host_model,
                         int replica_count)
    : devices(std::move(devs)), model(std::move(host_model)), replicas(replica_count) {
  for (size_t i = 0; i < devices.size(); ++i) by_id.emplace(devices[i].ibdev, i);
  if (!model) {
    std::vector<EfaPlacement> placements;
    for (const auto& d : devices) {
      placements.push_back({d.ibdev, d.pci, d.numa_node, d.root_complex, std::nullopt});
    }
    model = HostModel::Create("", std::move(placements), {});
  }
}

const EfaDevice* DeviceTable::FindPhysical(const std::string& ibdev) const {
  auto it = by_id.find(ibdev);
  return it == by_id.end() ? nullptr : &devices[it->second];
}

const EfaDevice* DeviceTable::Find(const std::string& id) const {
  if (replicas == 1) return FindPhysical(id);
  std::optional<ReplicaRef> ref = ParseReplicaId(id);
  return ref && ref->replica < replicas ? FindPhysical(ref->ibdev) : nullptr;
}

std::vector<std::string> DeviceTable::Ids(const EfaDevice& device) const {
  if (replicas == 1) return {device.ibdev};
  std::vector<std::string> ids;
  for (int n = 0; n < replicas; ++n) ids.push_back(ReplicaId(device.ibdev, n));
  return ids;
}

std::vector<std::string> DeviceTable::PhysicalEfas(const std::vector<std::string>& ids) const {
  std::vector<std::string> out;
  for (const std::string& id : ids) {
    const EfaDevice* d = Find(id);
    if (d != nullptr && std::find(out.begin(), out.end(), d->ibdev) == out.end()) {
      out.push_back(d->ibdev);
    }
  }
  return out;
}

}  // namespace efa::topology
