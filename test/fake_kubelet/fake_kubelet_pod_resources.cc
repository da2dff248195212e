// FakeKubelet, the pod-resources API (v1.PodResourcesLister): its server,
// the answers from the pod manager's pods and the device manager's state, and
// the knobs tests turn (delay, rate limit).
#include <sys/un.h>

#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "test/fake_kubelet/fake_kubelet.h"
#include "test/fake_kubelet/fake_kubelet_internal.h"
#include "test/fake_kubelet/serve_unix.h"

namespace efa::testing {

namespace fs = std::filesystem;

using fake_kubelet_internal::kShutdownGrace;

grpc::Status FakeKubelet::PodResourcesService::List(grpc::ServerContext* /*context*/,
                                                    const v1::ListPodResourcesRequest* /*request*/,
                                                    v1::ListPodResourcesResponse* response) {
  if (grpc::Status status = kubelet_->BeginPodResourcesCall(); !status.ok()) return status;
  absl::MutexLock lock(&kubelet_->mu_);
  // server_v1.go List: devicesProvider.UpdateAllocatedDevices() first.
  kubelet_->CollectRemovedLocked();
  kubelet_->FillListLocked(response);
  return grpc::Status::OK;
}

grpc::Status FakeKubelet::PodResourcesService::GetAllocatableResources(
    grpc::ServerContext* /*context*/, const v1::AllocatableResourcesRequest* /*request*/,
    v1::AllocatableResourcesResponse* response) {
  if (grpc::Status status = kubelet_->BeginPodResourcesCall(); !status.ok()) return status;
  // Added in kubelet 1.21: grpc-go's answer for a method it does not know.
  if (kubelet_->kubelet_1_20_) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        "unknown method GetAllocatableResources for service v1.PodResourcesLister");
  }
  absl::MutexLock lock(&kubelet_->mu_);
  kubelet_->FillAllocatableLocked(response);
  return grpc::Status::OK;
}

grpc::Status FakeKubelet::PodResourcesService::Get(grpc::ServerContext* /*context*/,
                                                   const v1::GetPodResourcesRequest* /*request*/,
                                                   v1::GetPodResourcesResponse* /*response*/) {
  if (grpc::Status status = kubelet_->BeginPodResourcesCall(); !status.ok()) return status;
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                      kubelet_->kubelet_1_20_
                          ? "unknown method Get for service v1.PodResourcesLister"
                          : "PodResources API Get method disabled");
}

namespace {

// Appends `ids` of `resource` on NUMA node `numa` to `out`, in the shape of
// the kubelet being imitated.
void AppendContainerDevices(const std::string& resource, int64_t numa,
                            const std::vector<std::string>& ids, bool kubelet_1_20,
                            google::protobuf::RepeatedPtrField<v1::ContainerDevices>* out) {
  if (kubelet_1_20) {
    // pod_devices.go getContainerDevices: one entry per NUMA node, the node
    // always set.
    v1::ContainerDevices* devices = out->Add();
    devices->set_resource_name(resource);
    for (const auto& id : ids) devices->add_device_ids(id);
    devices->mutable_topology()->add_nodes()->set_id(numa);
    return;
  }
  // Later kubelets (containerDevicesFromResourceDeviceInstances): one entry
  // per device and NUMA node, no topology when the plugin reported none.
  for (const auto& id : ids) {
    v1::ContainerDevices* devices = out->Add();
    devices->set_resource_name(resource);
    devices->add_device_ids(id);
    if (numa != FakeKubelet::kNoTopology) devices->mutable_topology()->add_nodes()->set_id(numa);
  }
}

}  // namespace

grpc::Status FakeKubelet::BeginPodResourcesCall() {
  absl::MutexLock lock(&mu_);
  ++pod_resources_calls_;
  if (pod_resources_exhausted_) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "rejected by rate limit");
  }
  if (pod_resources_delay_ > std::chrono::milliseconds(0)) {
    auto stopped = [this]() {
      mu_.AssertHeld();
      return !pod_resources_serving_;
    };
    mu_.AwaitWithTimeout(absl::Condition(&stopped), absl::FromChrono(pod_resources_delay_));
  }
  if (!pod_resources_serving_) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "kubelet is shutting down");
  }
  return grpc::Status::OK;
}

void FakeKubelet::FillListLocked(v1::ListPodResourcesResponse* response) const {
  for (const Pod& pod : pods_) {
    v1::PodResources* pod_resources = response->add_pod_resources();
    pod_resources->set_name(pod.name);
    pod_resources->set_namespace_(pod.pod_namespace);
    // server_v1.go List walks pod.Spec.Containers (1.28 and later also the
    // restartable init containers): a plain init container is not listed.
    for (const Container& container : pod.containers) {
      if (container.init) continue;
      v1::ContainerResources* container_resources = pod_resources->add_containers();
      container_resources->set_name(container.name);
      for (const DeviceEntry& entry : entries_) {
        if (entry.pod_uid != pod.uid || entry.container != container.name) continue;
        for (const auto& [numa, ids] : entry.ids_by_numa) {
          AppendContainerDevices(entry.resource, numa, ids, kubelet_1_20_,
                                 container_resources->mutable_devices());
        }
      }
      FillDynamicResourcesLocked(pod, container, container_resources);
    }
  }
}

void FakeKubelet::FillAllocatableLocked(v1::AllocatableResourcesResponse* response) const {
  for (const auto& [name, resource] : resources_) {
    if (!resource.streaming) continue;
    for (const auto& device : resource.devices) {
      if (device.health() != "Healthy") continue;
      if (!device.has_topology() || device.topology().nodes().empty()) {
        AppendContainerDevices(name, kNoTopology, {device.id()}, false,
                               response->mutable_devices());
        continue;
      }
      for (const auto& node : device.topology().nodes()) {
        AppendContainerDevices(name, node.id(), {device.id()}, false, response->mutable_devices());
      }
    }
  }
}

absl::Status FakeKubelet::StartPodResources() {
  absl::MutexLock lock(&lifecycle_mu_);
  return StartPodResourcesLocked();
}

void FakeKubelet::StopPodResources() {
  absl::MutexLock lock(&lifecycle_mu_);
  StopPodResourcesLocked();
}

absl::Status FakeKubelet::StartPodResourcesLocked() {
  const fs::path& path = pod_resources_socket_;
  if (path.empty()) {
    return absl::FailedPreconditionError("no pod-resources socket was configured");
  }
  if (pod_resources_server_ != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(path.string(), ": already serving"));
  }
  if (absl::Status fits = CheckUnixSocketPath(path); !fits.ok()) return fits;
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(path.parent_path().string(), ": ", ec.message()));
  }
  fs::remove(path, ec);
  if (ec) return absl::UnavailableError(absl::StrCat(path.string(), ": ", ec.message()));

  auto service = std::make_unique<PodResourcesService>(this);
  auto server = ServeOnUnixSocket(path, service.get());
  if (!server.ok()) return server.status();
  pod_resources_service_ = std::move(service);
  pod_resources_server_ = *std::move(server);
  absl::MutexLock lock(&mu_);
  pod_resources_serving_ = true;
  return absl::OkStatus();
}

void FakeKubelet::StopPodResourcesLocked() {
  {
    absl::MutexLock lock(&mu_);
    // Ends the delays of calls in progress.
    pod_resources_serving_ = false;
  }
  if (pod_resources_server_ != nullptr) {
    pod_resources_server_->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
    pod_resources_server_->Wait();
    pod_resources_server_.reset();
    pod_resources_service_.reset();
    std::error_code ec;
    fs::remove(pod_resources_socket_, ec);
  }
}

void FakeKubelet::SetPodResourcesDelay(std::chrono::milliseconds delay) {
  absl::MutexLock lock(&mu_);
  pod_resources_delay_ = delay;
}

void FakeKubelet::SetPodResourcesExhausted(bool exhausted) {
  absl::MutexLock lock(&mu_);
  pod_resources_exhausted_ = exhausted;
}

int FakeKubelet::pod_resources_calls() const {
  absl::MutexLock lock(&mu_);
  return pod_resources_calls_;
}

bool FakeKubelet::WaitForPodResourcesCalls(int n, std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&mu_);
  auto reached = [&]() {
    mu_.AssertHeld();
    return pod_resources_calls_ >= n;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&reached), absl::FromChrono(timeout));
}

}  // namespace efa::testing
