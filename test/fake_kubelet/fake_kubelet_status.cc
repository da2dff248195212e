// FakeKubelet, the pod status the kubelet writes of a container's devices:
// allocatedResourcesStatus (ResourceHealthStatus, KEP-4680).
#include <map>
#include <set>

#include "test/fake_kubelet/fake_kubelet.h"

namespace efa::testing {

std::vector<FakeKubelet::ResourceStatus> FakeKubelet::AllocatedResourcesStatus(
    const std::string& pod_uid, const std::string& container) const {
  absl::MutexLock lock(&mu_);
  // podDevices.getContainerDevices: the container's device IDs by resource.
  std::map<std::string, std::set<std::string>> held;
  for (const DeviceEntry& entry : entries_) {
    if (entry.pod_uid != pod_uid || entry.container != container) continue;
    held[entry.resource].insert(entry.ids.begin(), entry.ids.end());
  }
  std::vector<ResourceStatus> out;
  for (const auto& [resource, ids] : held) {
    ResourceStatus& status = out.emplace_back();
    status.name = resource;
    auto all = all_devices_.find(resource);
    for (const std::string& id : ids) {
      // "this is unlikely, but check for existence here anyways": an ID the
      // latest list lacks keeps the default, Healthy.
      std::string health = "Healthy";
      if (all != all_devices_.end()) {
        if (auto device = all->second.find(id); device != all->second.end()) {
          health = device->second;
        }
      }
      status.resources.push_back({id, health == "Healthy" ? "Healthy" : "Unhealthy"});
    }
  }
  return out;
}

}  // namespace efa::testing
