// FakeKubelet, the DRA manager in miniature: the claims prepared for pods
// and what pod-resources List shows of them (dynamic_resources).
#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "test/fake_kubelet/fake_kubelet.h"

namespace efa::testing {

absl::Status FakeKubelet::PrepareClaim(const std::string& pod_name,
                                       const std::string& pod_namespace, const std::string& pod_uid,
                                       const PreparedClaim& claim,
                                       const std::vector<std::string>& containers) {
  if (pod_uid.empty() || claim.name.empty() || claim.claim_namespace.empty()) {
    return absl::InvalidArgumentError("a pod UID, a claim name and a claim namespace are needed");
  }
  // A pod can only reference claims of its own namespace.
  if (claim.claim_namespace != pod_namespace) {
    return absl::InvalidArgumentError(
        absl::StrFormat("claim %s/%s is not in the pod's namespace %s", claim.claim_namespace,
                        claim.name, pod_namespace));
  }
  absl::MutexLock admission_lock(&admission_mu_);
  absl::MutexLock lock(&mu_);
  if (!pods_synced_) {
    return absl::FailedPreconditionError("the kubelet has not synced its pods since its restart");
  }
  Pod* pod = FindPodLocked(pod_uid);
  if (pod == nullptr) {
    pods_.push_back(Pod{pod_uid, pod_name, pod_namespace, {}});
    pod = &pods_.back();
  }
  if (std::find(pod->claims.begin(), pod->claims.end(), claim.name) == pod->claims.end()) {
    pod->claims.push_back(claim.name);
  }
  for (const std::string& name : containers) {
    auto it = std::find_if(pod->containers.begin(), pod->containers.end(),
                           [&](const Container& c) { return c.name == name; });
    if (it == pod->containers.end()) {
      pod->containers.push_back(Container{name, false, {}});
      it = std::prev(pod->containers.end());
    }
    it->claims.insert(claim.name);
  }
  // prepareResources: a claim already in the cache is only referenced.
  ClaimInfo& info =
      claim_infos_.try_emplace(claim.claim_namespace + "/" + claim.name, ClaimInfo{claim, {}})
          .first->second;
  info.pod_uids.insert(pod_uid);
  return absl::OkStatus();
}

void FakeKubelet::UnprepareClaimsLocked(const std::string& pod_uid) {
  for (auto it = claim_infos_.begin(); it != claim_infos_.end();) {
    it->second.pod_uids.erase(pod_uid);
    it = it->second.pod_uids.empty() ? claim_infos_.erase(it) : std::next(it);
  }
}

void FakeKubelet::FillDynamicResourcesLocked(const Pod& pod, const Container& container,
                                             v1::ContainerResources* out) const {
  // server_v1.go getContainerResources: only with the gate on.
  if (!dynamic_resources_) return;
  // dra/manager.go GetContainerClaimInfos: the pod's claims in
  // pod.spec.resourceClaims order that the container names; one it cannot
  // find in its cache fails the whole container, and GetDynamicResources
  // then lists none for it (logging the error).
  std::vector<const ClaimInfo*> infos;
  for (const std::string& name : pod.claims) {
    if (!container.claims.count(name)) continue;
    auto it = claim_infos_.find(pod.pod_namespace + "/" + name);
    if (it == claim_infos_.end()) return;
    infos.push_back(&it->second);
  }
  // GetDynamicResources: one DynamicResource per claim, one ClaimResource per
  // device the driver answered, in driver order (a Go map there: random). Its
  // cdiDevices is declared per driver, not per device, so each device's
  // ClaimResource carries the CDI devices of the driver's devices before it
  // too: copied as it is.
  for (const ClaimInfo* info : infos) {
    v1::DynamicResource* resource = out->add_dynamic_resources();
    resource->set_claim_name(info->claim.name);
    resource->set_claim_namespace(info->claim.claim_namespace);
    for (const auto& [driver, devices] : info->claim.drivers) {
      std::vector<std::string> cdi_devices;
      for (const PreparedDevice& device : devices) {
        cdi_devices.insert(cdi_devices.end(), device.cdi_ids.begin(), device.cdi_ids.end());
        v1::ClaimResource* claim_resource = resource->add_claim_resources();
        for (const std::string& cdi : cdi_devices) claim_resource->add_cdi_devices()->set_name(cdi);
        claim_resource->set_driver_name(driver);
        claim_resource->set_pool_name(device.pool);
        claim_resource->set_device_name(device.device);
      }
    }
  }
}

}  // namespace efa::testing
