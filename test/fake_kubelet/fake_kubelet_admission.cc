// FakeKubelet, pod admission: the kubelet's device manager in miniature,
// over the pod manager's pods (its sources: fake_kubelet.cc's table).
#include <algorithm>
#include <cstdio>
#include <iterator>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "test/fake_kubelet/fake_kubelet.h"
#include "test/fake_kubelet/fake_kubelet_internal.h"

namespace efa::testing {

namespace fs = std::filesystem;

using fake_kubelet_internal::kPreStartTimeout;

namespace {

// Go's names of the gRPC codes (codes.Code.String()).
const char* GoCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "Canceled";
    case grpc::StatusCode::UNKNOWN:
      return "Unknown";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "InvalidArgument";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DeadlineExceeded";
    case grpc::StatusCode::NOT_FOUND:
      return "NotFound";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "AlreadyExists";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PermissionDenied";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "ResourceExhausted";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FailedPrecondition";
    case grpc::StatusCode::ABORTED:
      return "Aborted";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OutOfRange";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "Unimplemented";
    case grpc::StatusCode::INTERNAL:
      return "Internal";
    case grpc::StatusCode::UNAVAILABLE:
      return "Unavailable";
    case grpc::StatusCode::DATA_LOSS:
      return "DataLoss";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "Unauthenticated";
    default:
      return "Unknown";
  }
}

// A plugin's gRPC error as the kubelet (Go) prints it.
std::string GoRpcError(const grpc::Status& status) {
  return absl::StrFormat("rpc error: code = %s desc = %s", GoCodeName(status.error_code()),
                         status.error_message());
}

absl::StatusCode ToAbslCode(grpc::StatusCode code) { return static_cast<absl::StatusCode>(code); }

// The kubelet rejects the pod with reason UnexpectedAdmissionError and this
// message (container_manager_linux.go).
absl::Status UnexpectedAdmission(const absl::Status& error) {
  return absl::Status(error.code(),
                      absl::StrCat("UnexpectedAdmissionError: Allocate failed due to ",
                                   error.message(), ", which is unexpected"));
}

}  // namespace

const FakeKubelet::Container* FakeKubelet::Pod::Find(const std::string& container) const {
  for (const Container& c : containers) {
    if (c.name == container) return &c;
  }
  return nullptr;
}

void FakeKubelet::SyncPods() {
  absl::MutexLock admission_lock(&admission_mu_);
  absl::MutexLock lock(&mu_);
  if (pods_synced_) return;
  for (Pod& pod : unsynced_) pods_.push_back(std::move(pod));
  unsynced_.clear();
  pods_synced_ = true;
  // The kubelet admits every pod it gets from the API server again
  // (HandlePodAdditions): allocateContainerResources finds each container's
  // devices allocated (devicesToAllocate: "Found pre-allocated devices"),
  // calls no plugin, and writes the checkpoint, after UpdateAllocatedDevices
  // dropped the removed pods.
  CollectRemovedLocked();
  if (absl::Status status = WriteCheckpointLocked(); !status.ok()) {
    std::fprintf(stderr, "fake-kubelet: %s\n", std::string(status.message()).c_str());
  }
}

bool FakeKubelet::pods_synced() const {
  absl::MutexLock lock(&mu_);
  return pods_synced_;
}

bool FakeKubelet::CollectRemovedLocked() {
  // UpdateAllocatedDevices returns early until sourcesReady.AllReady(): a
  // pod missing from a pod manager still filling is not gone. Then it drops
  // every pod of podDevices that is not active (podsToBeRemoved :=
  // m.podDevices.pods(), minus m.activePods()): also a removed pod a
  // restarted kubelet read back from a checkpoint written before its
  // removal, so `removed_` keeps every pod removed (UIDs are not reused;
  // pods of a checkpoint a test wrote stay, as if the API server had them).
  if (!pods_synced_ || removed_.empty()) return false;
  const size_t before = entries_.size();
  for (auto it = entries_.begin(); it != entries_.end();) {
    it = removed_.count(it->pod_uid) != 0 ? entries_.erase(it) : std::next(it);
  }
  return entries_.size() != before;
}

absl::StatusOr<FakeKubelet::AdmittedContainer> FakeKubelet::AdmitContainer(
    const std::string& pod_name, const std::string& pod_namespace, const std::string& pod_uid,
    const std::string& container_name,
    const std::vector<std::pair<std::string, int>>& requests_in_order) {
  return AdmitContainer(pod_name, pod_namespace, pod_uid, container_name, requests_in_order,
                        ContainerOptions{});
}

namespace {

absl::Status NotSynced() {
  return absl::FailedPreconditionError(
      "the kubelet restarted and has not synced its pods from the API server yet (SyncPods)");
}

}  // namespace

absl::StatusOr<FakeKubelet::AdmittedContainer> FakeKubelet::AdmitContainer(
    const std::string& pod_name, const std::string& pod_namespace, const std::string& pod_uid,
    const std::string& container_name,
    const std::vector<std::pair<std::string, int>>& requests_in_order,
    const ContainerOptions& options) {
  if (pod_uid.empty()) return absl::InvalidArgumentError("pod UID: empty");
  if (container_name.empty()) return absl::InvalidArgumentError("container name: empty");
  std::set<std::string> requested;
  for (const auto& [resource, count] : requests_in_order) {
    if (count < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: negative device count %d", resource, count));
    }
    // Requests come from a map in the kubelet: a name cannot repeat.
    if (!requested.insert(resource).second) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: requested twice", resource));
    }
  }

  absl::MutexLock admission_lock(&admission_mu_);
  bool new_pod = false;
  {
    absl::MutexLock lock(&mu_);
    // Pods come from the API server source, which a restarted kubelet has
    // not synced yet.
    if (!pods_synced_) return NotSynced();
    Pod* pod = FindPodLocked(pod_uid);
    if (pod != nullptr && pod->Find(container_name) != nullptr) {
      return absl::AlreadyExistsError(
          absl::StrFormat("pod %s container \"%s\" is already admitted", pod_uid, container_name));
    }
    // The kubelet adds the pod to its pod manager before admitting it, so
    // pod-resources lists it (without devices) from the start.
    if (pod == nullptr) {
      pods_.push_back(Pod{pod_uid, pod_name, pod_namespace, {}});
      pod = &pods_.back();
      new_pod = true;
    }
    pod->containers.push_back(Container{container_name, options.init, requests_in_order});
    // allocateContainerResources starts with UpdateAllocatedDevices when the
    // container asks for a device plugin's resource.
    if (std::any_of(requests_in_order.begin(), requests_in_order.end(),
                    [](const auto& request) { return request.second > 0; })) {
      CollectRemovedLocked();
    }
  }

  AdmittedContainer admitted;
  for (const auto& [resource, count] : requests_in_order) {
    if (count == 0) continue;
    absl::StatusOr<ResourceAllocation> allocation =
        AllocateResource(pod_uid, container_name, options.init, resource, count);
    if (!allocation.ok()) {
      absl::MutexLock lock(&mu_);
      RollBackLocked(pod_uid, container_name, new_pod);
      return UnexpectedAdmission(allocation.status());
    }
    admitted.allocations.push_back(*std::move(allocation));
  }
  {
    // allocateContainerResources ends with writeCheckpoint, whatever the
    // container asked for.
    absl::MutexLock lock(&mu_);
    if (absl::Status status = WriteCheckpointLocked(); !status.ok()) {
      RollBackLocked(pod_uid, container_name, new_pod);
      return UnexpectedAdmission(status);
    }
  }
  if (options.start) admitted.start_status = StartContainerLocked(pod_uid, container_name);
  return admitted;
}

absl::StatusOr<FakeKubelet::ResourceAllocation> FakeKubelet::AllocateResource(
    const std::string& pod_uid, const std::string& container, bool init,
    const std::string& resource, int count) {
  std::vector<std::string> available;
  // The devices of the pod's init containers that no regular container of it
  // took yet: a regular container takes them first (ManagerImpl.Allocate
  // keeps devicesToReuse: init containers add theirs, regular ones remove
  // theirs; devicesToAllocate allocates from it before anything else).
  std::vector<std::string> chosen;
  std::shared_ptr<v1beta1::DevicePlugin::Stub> stub;
  bool ask_plugin = false;
  {
    absl::MutexLock lock(&mu_);
    const Resource* r = FindLocked(resource);
    // devicesToAllocate: no healthyDevices entry (never registered, or
    // GetCapacity dropped the stopped endpoint).
    if (r == nullptr || EndpointRemovedLocked(*r)) {
      return absl::FailedPreconditionError(
          absl::StrCat("can't allocate unregistered device ", resource));
    }
    std::set<std::string> in_use, reusable, taken_by_regular;
    const Pod* pod = FindPodLocked(pod_uid);
    for (const DeviceEntry& entry : entries_) {
      if (entry.resource != resource) continue;
      in_use.insert(entry.ids.begin(), entry.ids.end());
      const Container* c =
          entry.pod_uid == pod_uid && pod != nullptr ? pod->Find(entry.container) : nullptr;
      if (c == nullptr) continue;
      (c->init ? reusable : taken_by_regular).insert(entry.ids.begin(), entry.ids.end());
    }
    if (!init) {
      for (const auto& id : reusable) {
        if (static_cast<int>(chosen.size()) == count) break;
        if (taken_by_regular.count(id) == 0) chosen.push_back(id);
      }
    }
    stub = r->stub;
    if (static_cast<int>(chosen.size()) < count) {
      // Without an open stream the kubelet counts every device unhealthy.
      if (r->streaming) {
        for (const auto& device : r->devices) {
          if (device.health() == "Healthy" && in_use.count(device.id()) == 0) {
            available.push_back(device.id());
          }
        }
      }
      std::sort(available.begin(), available.end());
      available.erase(std::unique(available.begin(), available.end()), available.end());
      const int needed = count - static_cast<int>(chosen.size());
      if (static_cast<int>(available.size()) < needed) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "requested number of devices unavailable for %s. Requested: %d, Available: %d",
            resource, needed, available.size()));
      }
      ask_plugin = r->options.has_value() && r->options->get_preferred_allocation_available();
    }
    if (stub == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("unknown Device Plugin ", resource));
    }
  }

  // No topology manager here: every free device is "unaligned", so the
  // plugin's preference is asked over all of them and the devices taken
  // already, which it must include (devicesToAllocate).
  std::set<std::string> taken(chosen.begin(), chosen.end());
  const std::set<std::string> is_free(available.begin(), available.end());
  if (ask_plugin) {
    v1beta1::PreferredAllocationRequest request;
    auto* container_request = request.add_container_requests();
    std::vector<std::string> offered(available);
    offered.insert(offered.end(), chosen.begin(), chosen.end());
    std::sort(offered.begin(), offered.end());
    for (const auto& id : offered) container_request->add_available_deviceids(id);
    for (const auto& id : chosen) container_request->add_must_include_deviceids(id);
    container_request->set_allocation_size(count);
    v1beta1::PreferredAllocationResponse response;
    grpc::ClientContext context;
    const grpc::Status status = stub->GetPreferredAllocation(&context, request, &response);
    if (!status.ok()) {
      return absl::Status(ToAbslCode(status.error_code()),
                          absl::StrCat("device plugin GetPreferredAllocation rpc failed with err: ",
                                       GoRpcError(status)));
    }
    // The kubelet keeps the answer as a set and takes from it in random
    // order; here its order decides when it names more than needed.
    if (response.container_responses_size() > 0) {
      for (const auto& id : response.container_responses(0).deviceids()) {
        if (static_cast<int>(chosen.size()) == count) break;
        if (is_free.count(id) != 0 && taken.insert(id).second) chosen.push_back(id);
      }
    }
  }
  for (const auto& id : available) {
    if (static_cast<int>(chosen.size()) == count) break;
    if (taken.insert(id).second) chosen.push_back(id);
  }

  v1beta1::AllocateRequest request;
  auto* container_request = request.add_container_requests();
  for (const auto& id : chosen) container_request->add_devices_ids(id);
  v1beta1::AllocateResponse response;
  grpc::ClientContext context;  // no deadline, as in the kubelet
  const grpc::Status status = stub->Allocate(&context, request, &response);
  if (!status.ok()) {
    return absl::Status(ToAbslCode(status.error_code()), GoRpcError(status));
  }
  if (response.container_responses().empty()) {
    return absl::InternalError(
        "no containers return in allocation response "
        "&AllocateResponse{ContainerResponses:[]*ContainerAllocateResponse{},}");
  }

  ResourceAllocation allocation{resource, chosen, response.container_responses(0)};
  absl::MutexLock lock(&mu_);
  entries_.push_back(DeviceEntry{pod_uid, container, resource, chosen,
                                 GroupByNumaLocked(resource, chosen), allocation.response});
  return allocation;
}

std::map<int64_t, std::vector<std::string>> FakeKubelet::GroupByNumaLocked(
    const std::string& resource, const std::vector<std::string>& ids) const {
  std::map<std::string, const v1beta1::Device*> known;
  if (const Resource* r = FindLocked(resource); r != nullptr) {
    for (const auto& device : r->devices) known[device.id()] = &device;
  }
  std::map<int64_t, std::vector<std::string>> by_numa;
  for (const auto& id : ids) {
    auto it = known.find(id);
    if (it == known.end() || !it->second->has_topology() ||
        it->second->topology().nodes().empty()) {
      by_numa[kubelet_1_20_ ? 0 : kNoTopology].push_back(id);
      continue;
    }
    for (const auto& node : it->second->topology().nodes()) by_numa[node.id()].push_back(id);
  }
  return by_numa;
}

void FakeKubelet::RollBackLocked(const std::string& pod_uid, const std::string& container,
                                 bool drop_pod) {
  const size_t before = entries_.size();
  std::erase_if(entries_, [&](const DeviceEntry& entry) {
    return entry.pod_uid == pod_uid && entry.container == container;
  });
  if (Pod* pod = FindPodLocked(pod_uid); pod != nullptr) {
    std::erase_if(pod->containers, [&](const Container& c) { return c.name == container; });
  }
  if (drop_pod) {
    std::erase_if(pods_, [&](const Pod& pod) { return pod.uid == pod_uid; });
  }
  // A device list may have written the half-admitted container already.
  if (entries_.size() != before) {
    if (absl::Status status = WriteCheckpointLocked(); !status.ok()) {
      std::fprintf(stderr, "fake-kubelet: %s\n", std::string(status.message()).c_str());
    }
  }
}

FakeKubelet::Pod* FakeKubelet::FindPodLocked(const std::string& pod_uid) {
  for (Pod& pod : pods_) {
    if (pod.uid == pod_uid) return &pod;
  }
  return nullptr;
}

absl::Status FakeKubelet::StartContainer(const std::string& pod_uid,
                                         const std::string& container_name) {
  absl::MutexLock admission_lock(&admission_mu_);
  {
    absl::MutexLock lock(&mu_);
    // Containers are started by the pod workers, which a restarted kubelet
    // runs only for the pods it got from the API server.
    if (!pods_synced_) return NotSynced();
    const Pod* pod = FindPodLocked(pod_uid);
    if (pod == nullptr || pod->Find(container_name) == nullptr) {
      return absl::NotFoundError(
          absl::StrFormat("pod %s container \"%s\" is not admitted", pod_uid, container_name));
    }
  }
  return StartContainerLocked(pod_uid, container_name);
}

absl::Status FakeKubelet::StartContainerLocked(const std::string& pod_uid,
                                               const std::string& container) {
  struct Call {
    std::string resource;
    std::shared_ptr<v1beta1::DevicePlugin::Stub> stub;
    std::vector<std::string> ids;
  };
  std::vector<Call> calls;
  // Requested resources the device manager holds no devices of.
  std::vector<std::pair<std::string, int>> lost;
  bool init = false;
  {
    absl::MutexLock lock(&mu_);
    const Pod* pod = FindPodLocked(pod_uid);
    const Container* c = pod == nullptr ? nullptr : pod->Find(container);
    if (c == nullptr) {
      return absl::NotFoundError(
          absl::StrFormat("pod %s container \"%s\" is not admitted", pod_uid, container));
    }
    init = c->init;
    // GetDeviceRunContainerOptions, before every start of the container:
    // callPreStartContainerIfNeeded with the devices podDevices holds for it
    // (the same IDs every time), and Allocate again only for a resource it
    // holds none of ("a race during node restart").
    for (const auto& request : c->requests) {
      const std::string& resource = request.first;
      if (request.second == 0) continue;
      const Resource* r = FindLocked(resource);
      // callPreStartContainerIfNeeded: no endpoint (never registered, or
      // GetCapacity dropped it after the grace period) while the container
      // holds the resource's devices (isDevicePluginResource: allocated).
      if (r == nullptr || EndpointRemovedLocked(*r)) {
        return absl::FailedPreconditionError(
            absl::StrCat("endpoint not found in cache for a registered resource: ", resource));
      }
      // A restarted kubelet holds a stopped endpoint without options until
      // the plugin registers again: it skips the call, as for a plugin that
      // did not ask for it.
      const bool pre_start =
          r->stub != nullptr && r->options.has_value() && r->options->pre_start_required();
      // A stopped endpoint with the options of its registration refuses
      // the call (endpoint.go preStartContainer: errEndpointStopped): a
      // plugin that registered another resource name since, or is down.
      if (pre_start && r->stopped_since) {
        return absl::UnavailableError(absl::StrFormat(
            "device plugin PreStartContainer rpc failed with err: endpoint &{%s %s} has been "
            "stopped",
            (dir_ / r->last_request->endpoint()).string(), resource));
      }
      auto entry = std::find_if(entries_.begin(), entries_.end(), [&](const DeviceEntry& e) {
        return e.pod_uid == pod_uid && e.container == container && e.resource == resource;
      });
      if (entry == entries_.end()) {
        if (pre_start) {
          return absl::FailedPreconditionError(absl::StrFormat(
              "no devices found allocated in local cache for pod %s, container %s, resource %s",
              pod_uid, container, resource));
        }
        lost.emplace_back(resource, request.second);
        continue;
      }
      if (pre_start) calls.push_back(Call{resource, r->stub, entry->ids});
    }
  }
  for (const Call& call : calls) {
    v1beta1::PreStartContainerRequest request;
    for (const auto& id : call.ids) request.add_devices_ids(id);
    v1beta1::PreStartContainerResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kPreStartTimeout);
    const grpc::Status status = call.stub->PreStartContainer(&context, request, &response);
    if (!status.ok()) {
      return absl::Status(ToAbslCode(status.error_code()),
                          absl::StrCat("device plugin PreStartContainer rpc failed with err: ",
                                       GoRpcError(status)));
    }
  }
  if (lost.empty()) return absl::OkStatus();
  for (const auto& [resource, count] : lost) {
    absl::StatusOr<ResourceAllocation> allocation =
        AllocateResource(pod_uid, container, init, resource, count);
    if (!allocation.ok()) return allocation.status();
  }
  absl::MutexLock lock(&mu_);
  return WriteCheckpointLocked();
}

absl::Status FakeKubelet::RemovePod(const std::string& pod_uid, CheckpointWrite when) {
  absl::MutexLock admission_lock(&admission_mu_);
  absl::MutexLock lock(&mu_);
  auto is_it = [&](const Pod& pod) { return pod.uid == pod_uid; };
  if (std::none_of(pods_.begin(), pods_.end(), is_it) &&
      std::none_of(unsynced_.begin(), unsynced_.end(), is_it)) {
    return absl::NotFoundError(absl::StrFormat("pod %s is not known", pod_uid));
  }
  // Gone from the pod manager, hence from List, at once; the device manager
  // keeps the allocations until UpdateAllocatedDevices.
  std::erase_if(pods_, is_it);
  std::erase_if(unsynced_, is_it);
  removed_.insert(pod_uid);
  // The pod's claims are unprepared once it has terminated.
  UnprepareClaimsLocked(pod_uid);
  if (when == CheckpointWrite::kAsKubelet || !pods_synced_) return absl::OkStatus();
  CollectRemovedLocked();
  return WriteCheckpointLocked();
}

std::vector<std::string> FakeKubelet::container_devices(const std::string& pod_uid,
                                                        const std::string& container_name,
                                                        const std::string& resource) const {
  absl::MutexLock lock(&mu_);
  for (const DeviceEntry& entry : entries_) {
    if (entry.pod_uid == pod_uid && entry.container == container_name &&
        entry.resource == resource) {
      return entry.ids;
    }
  }
  return {};
}
}  // namespace efa::testing
