// FakeKubelet, the process: construction, Start, Restart and Stop of the
// Registration server (and of the pod-resources server with it), and the end
// of a ListAndWatch stream. The class is fake_kubelet.h; the other parts are
// in the files the table below names.
//
// Each behaviour of the kubelet it imitates has one place, and the kubelet
// source it follows is named once, here: "behaviour: where (FakeKubelet::
// functions, in fake_kubelet_<file>.cc) <- what in the kubelet" (functions
// of pkg/kubelet/cm/devicemanager unless a file or package is named;
// commits of kubernetes/kubernetes; versions where they differ, as
// Options::kubelet_1_20 lists). The comments at each place say which step of
// that source a line follows.
//
//   Register (dial the plugin, ask its options, answer): Register
//     (registration) <- devicemanager's Register, its messages too
//   ListAndWatch (the latest list; the checkpoint rewritten on each): Watch
//     (registration) <- genericDeviceUpdateCallback
//   A stream's end, the endpoint dropped after its grace period: Watch,
//     EndpointRemovedLocked (registration) <- runEndpoint; GetCapacity,
//     stopGracePeriodExpired; endpointStopGracePeriod (types.go)
//   Start over a killed kubelet's socket: StartLocked (fake_kubelet.cc)
//   Restart (the directory emptied, allocations from the checkpoint,
//     endpoints stopped, pods unsynced): Restart (fake_kubelet.cc) <-
//     ManagerImpl.Start: removeContents (1.20), CleanupPluginDirectory
//     (later); readCheckpoint, newStoppedEndpointImpl
//   Admission, one resource at a time, devices reused: AdmitContainer,
//     AllocateResource (admission) <- HandlePodAdditions,
//     allocateContainerResources, devicesToAllocate, devicesToReuse
//   Removed pods' devices freed: CollectRemovedLocked (admission) <-
//     UpdateAllocatedDevices
//   A container's start: StartContainerLocked (admission) <-
//     GetDeviceRunContainerOptions, callPreStartContainerIfNeeded
//     (manager.go), preStartContainer (endpoint.go)
//   A plugin's error in an admission, as printed: (admission) <-
//     container_manager_linux.go, Go's codes.Code.String()
//   kubelet_internal_checkpoint: WriteCheckpointLocked, LoadCheckpointLocked
//     (checkpoint) <- writeCheckpoint, fromCheckpointData
//   pod-resources List: PodResourcesService::List, FillListLocked
//     (pod_resources) <- server_v1.go List; pod_devices.go
//     getContainerDevices (1.20), containerDevicesFromResourceDeviceInstances
//   GetAllocatableResources (1.21 and later): FillAllocatableLocked
//     (pod_resources)
//   DRA, claims prepared and released: PrepareClaim, UnprepareClaimsLocked
//     (dra) <- pkg/kubelet/cm/dra/manager.go prepareResources,
//     unprepareResources (001332b)
//   List's dynamic_resources: FillDynamicResourcesLocked (dra) <- server_v1.go
//     getContainerResources, dra/manager.go GetContainerClaimInfos,
//     container_manager_linux.go GetDynamicResources (001332b)
//   allocatedResourcesStatus: AllocatedResourcesStatus (status) <-
//     kubelet_pods.go generateAPIPodStatus (001a80e),
//     UpdateAllocatedResourcesStatus (manager.go, 7510f32)
//
#include "test/fake_kubelet/fake_kubelet.h"

#include <sys/un.h>

#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "test/fake_kubelet/fake_kubelet_internal.h"
#include "test/fake_kubelet/serve_unix.h"

namespace efa::testing {

namespace fs = std::filesystem;

using fake_kubelet_internal::kShutdownGrace;

FakeKubelet::Options FakeKubelet::ForKubeletDir(const fs::path& kubelet_dir) {
  Options options;
  options.device_plugin_dir = kubelet_dir / "device-plugins";
  options.pod_resources_socket = kubelet_dir / "pod-resources" / kSocketName;
  return options;
}

FakeKubelet::FakeKubelet(fs::path device_plugin_dir)
    : FakeKubelet([&] {
        Options options;
        options.device_plugin_dir = std::move(device_plugin_dir);
        return options;
      }()) {}

FakeKubelet::FakeKubelet(Options options)
    : dir_(std::move(options.device_plugin_dir)),
      pod_resources_socket_(std::move(options.pod_resources_socket)),
      kubelet_1_20_(options.kubelet_1_20),
      dynamic_resources_(options.dynamic_resources && !options.kubelet_1_20),
      endpoint_stop_grace_period_(options.endpoint_stop_grace_period) {}

FakeKubelet::~FakeKubelet() {
  absl::MutexLock admission_lock(&admission_mu_);
  absl::MutexLock lock(&lifecycle_mu_);
  StopLocked();
}

absl::Status FakeKubelet::Start() {
  absl::MutexLock admission_lock(&admission_mu_);
  absl::MutexLock lock(&lifecycle_mu_);
  if (server_ != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(socket_path().string(), ": already serving"));
  }
  {
    // Before serving: a device list arriving first would overwrite the file.
    absl::MutexLock state_lock(&mu_);
    LoadCheckpointLocked();
  }
  if (absl::Status status = StartLocked(); !status.ok()) return status;
  if (!pod_resources_socket_.empty()) {
    if (absl::Status status = StartPodResourcesLocked(); !status.ok()) {
      StopLocked();
      return status;
    }
  }
  return absl::OkStatus();
}

absl::Status FakeKubelet::StartLocked() {
  const fs::path path = socket_path();
  if (server_ != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(path.string(), ": already serving"));
  }
  if (absl::Status fits = CheckUnixSocketPath(path); !fits.ok()) return fits;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(dir_.string(), ": ", ec.message()));
  }
  // A kubelet that was killed leaves its socket behind; gRPC cannot bind over it.
  fs::remove(path, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(path.string(), ": ", ec.message()));
  }

  auto service = std::make_unique<RegistrationService>(this);
  auto server = ServeOnUnixSocket(path, service.get());
  if (!server.ok()) return server.status();
  service_ = std::move(service);
  server_ = *std::move(server);
  absl::MutexLock lock(&mu_);
  serving_ = true;
  return absl::OkStatus();
}

absl::Status FakeKubelet::Restart() {
  absl::MutexLock admission_lock(&admission_mu_);
  absl::MutexLock lock(&lifecycle_mu_);
  StopLocked();
  // The device manager empties the directory on start, the plugins' sockets
  // included, and keeps the checkpoint: kubelet 1.20 (ManagerImpl.Start,
  // removeContents) deletes every file that is not a directory, later ones
  // (CleanupPluginDirectory) only sockets.
  std::error_code ec;
  if (fs::exists(dir_, ec)) {
    for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code type_ec;
      if (it->path() == checkpoint_path()) continue;
      if (kubelet_1_20_ ? it->is_directory(type_ec) : !it->is_socket(type_ec)) continue;
      std::error_code remove_ec;
      fs::remove(it->path(), remove_ec);
      if (remove_ec) {
        return absl::UnavailableError(absl::StrCat(it->path().string(), ": ", remove_ec.message()));
      }
    }
    if (ec) {
      return absl::UnavailableError(absl::StrCat(dir_.string(), ": ", ec.message()));
    }
  }
  {
    // A new kubelet process knows the allocations only from the checkpoint
    // (ManagerImpl.Start, readCheckpoint), and its pod manager is empty until
    // the API server source has synced: pod-resources List, served from
    // startKubelet on, answers from it (server_v1.go List,
    // podsProvider.GetPods()) and lists nothing until then.
    absl::MutexLock state_lock(&mu_);
    LoadCheckpointLocked();
    // readCheckpoint gives every resource of RegisteredDevices a stopped
    // endpoint (newStoppedEndpointImpl, stopped from now on, no options);
    // one GetCapacity had dropped before is not there.
    for (auto& [name, resource] : resources_) {
      if (EndpointRemovedLocked(resource)) {
        resource.removed = true;
      } else {
        resource.stopped_since = std::chrono::steady_clock::now();
      }
    }
    for (Pod& pod : pods_) unsynced_.push_back(std::move(pod));
    pods_.clear();
    pods_synced_ = false;
    // A new device manager knows no device until its plugins list them.
    all_devices_.clear();
  }
  if (absl::Status status = StartLocked(); !status.ok()) return status;
  if (!pod_resources_socket_.empty()) {
    if (absl::Status status = StartPodResourcesLocked(); !status.ok()) {
      StopLocked();
      return status;
    }
  }
  return absl::OkStatus();
}

void FakeKubelet::Stop() {
  absl::MutexLock admission_lock(&admission_mu_);
  absl::MutexLock lock(&lifecycle_mu_);
  StopLocked();
}

void FakeKubelet::StopLocked() {
  StopPodResourcesLocked();
  {
    absl::MutexLock lock(&mu_);
    // From here on Register refuses to commit, so no stream is added.
    serving_ = false;
    for (grpc::ClientContext* context : dialing_) context->TryCancel();
  }
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
    server_->Wait();
    server_.reset();
    service_.reset();
  }

  std::vector<std::shared_ptr<Stream>> streams;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, resource] : resources_) {
      // The kubelet process is gone: so are its connections to the plugins.
      resource.stub.reset();
      if (resource.stream != nullptr) {
        resource.stream->context.TryCancel();
        streams.push_back(resource.stream);
      }
    }
    for (auto& stream : retired_) streams.push_back(std::move(stream));
    retired_.clear();
  }
  // Joined without mu_: the stream threads take it to record their end.
  for (auto& stream : streams) {
    if (stream->thread.joinable()) stream->thread.join();
  }

  std::error_code ec;
  fs::remove(socket_path(), ec);
}

void FakeKubelet::EndStream(const std::string& resource) {
  absl::MutexLock lock(&lifecycle_mu_);
  std::shared_ptr<Stream> stream;
  {
    absl::MutexLock state_lock(&mu_);
    auto it = resources_.find(resource);
    if (it == resources_.end() || it->second.stream == nullptr) return;
    stream = it->second.stream;
    stream->context.TryCancel();
  }
  if (stream->thread.joinable()) stream->thread.join();
}
}  // namespace efa::testing
