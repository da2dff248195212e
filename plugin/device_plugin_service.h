// The kubelet-facing gRPC service (v1beta1.DevicePlugin) for EFA devices.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "plugin/alignment/alignment.h"
#include "plugin/kubelet/resource_name.h"
#include "plugin/rpc_observer.h"
#include "topology/device_table.h"
#include "topology/efa_device.h"
#include "topology/host_model.h"

namespace efa::plugin {

// The plugin's socket, relative to the kubelet's device-plugins dir (the
// Register request's endpoint): in a directory of its own, which the kubelet
// keeps when it starts (it deletes the files or sockets at the top of the
// dir and skips directories: kubelet 1.20 ManagerImpl.removeContents, later
// CleanupPluginDirectory). The socket then outlives a kubelet restart or a
// reboot's new kubelet, and registering again is one call, made the moment
// kubelet.sock appears: no server to start first (docs/install.md, "After
// a node reboot").
inline constexpr char kPluginSocketDir[] = "efa";
inline constexpr char kPluginSocket[] = "efa/aws-efa-device-plugin.sock";
inline constexpr char kApiVersion[] = "v1beta1";
inline constexpr char kHealthy[] = "Healthy";
inline constexpr char kUnhealthy[] = "Unhealthy";

// Where the accelerators of the container being admitted are, for
// GetPreferredAllocation; empty targets when unknown (the policy then
// predicts). Called on gRPC threads; must not block for long.
using TargetFinder = std::function<Targets(const topology::HostModel& model)>;

// How the late-binding Allocate answer names the claim's CDI device to the
// kubelet (docs/alignment.md, "Late binding").
enum class CdiHandover {
  // Both of the below. Runtimes that read both (containerd 1.7.2+ and 2.x,
  // CRI-O) inject a device named twice once.
  kBoth,
  // The cdi_devices field: passed on by kubelet 1.28+ (DevicePluginCDIDevices)
  // in the CRI's CDIDevices; older kubelets drop it.
  kCdiDevices,
  // A cdi.k8s.io/ annotation: every kubelet copies an Allocate answer's
  // annotations into the container's CRI config, and a runtime with CDI on
  // (containerd 1.7 with enable_cdi, 2.x; CRI-O) injects the devices it names.
  kAnnotation,
};

// Late binding: binds physical EFAs for the kubelet's device IDs at
// PreStartContainer (plugin/alignment/late_binder.h). Called on gRPC threads.
using PreStartBinder = std::function<absl::Status(const topology::DeviceTable& table,
                                                  const std::vector<std::string>& kubelet_ids)>;

// The preferred EFAs for one container request: the policy's choice among
// the available healthy devices, aligned with `targets`. With replicas, the
// policy chooses physical EFAs (distinct ones first, then second replicas,
// and so on; the least shared among equally near ones) and each gets its
// lowest free replica. Never fails. Pure.
std::vector<std::string> PreferredDevices(
    const topology::DeviceTable& table, const v1beta1::ContainerPreferredAllocationRequest& request,
    const Targets& targets);

// Every status code Allocate answers (AllocateContainer's and
// AllocateContainerLate's refusals, a device requested by two containers):
// the metrics create each code's series at 0, so that the first error
// after a start is an increase. The fuzz target of the requests checks
// that no refusal has another code.
inline constexpr std::array<grpc::StatusCode, 3> kAllocateCodes = {
    grpc::StatusCode::OK, grpc::StatusCode::INVALID_ARGUMENT,
    grpc::StatusCode::FAILED_PRECONDITION};

// Builds the Allocate answer for one container: DeviceSpecs for exactly the
// requested devices' uverbs nodes and the EFA_* environment, each physical
// EFA once (two replicas of one EFA give it once). Rejects an
// empty request, unknown or repeated IDs (INVALID_ARGUMENT) and unhealthy
// devices (FAILED_PRECONDITION), naming the device ID. Pure.
absl::StatusOr<v1beta1::ContainerAllocateResponse> AllocateContainer(
    const topology::DeviceTable& table, const v1beta1::ContainerAllocateRequest& request);

// The late-binding Allocate answer for one container: the request checked as
// AllocateContainer does, answered with only the CDI device
// vpc.amazonaws.com/efa=<claim> of its IDs (plugin/alignment/cdi_spec.h), named
// as `handover` says: in cdi_devices, in the annotation
// cdi.k8s.io/vpc.amazonaws.com-efa_<claim>, or both. The device nodes and
// environment come from the claim's CDI spec. Pure.
absl::StatusOr<v1beta1::ContainerAllocateResponse> AllocateContainerLate(
    const topology::DeviceTable& table, const v1beta1::ContainerAllocateRequest& request,
    CdiHandover handover, std::string_view resource = kResourceName);

class DevicePluginService final : public v1beta1::DevicePlugin::CallbackService {
 public:
  struct Options {
    bool report_numa = true;  // TopologyInfo on each device, for the Topology Manager
    int replicas = 1;         // device IDs per EFA (docs/alignment.md, "Sharing")
    std::string resource_name = kResourceName;  // the name it serves (claim names)
  };
  explicit DevicePluginService(Options options);
  ~DevicePluginService() override;

  // Replaces the served devices and the host model (may be null). Every
  // open ListAndWatch stream receives the new full list if it differs from
  // the last one. `model_pending`: the model is being loaded and a later
  // call brings it; GetPreferredAllocation and PreStartContainer wait for
  // it (up to kModelWait, then they use the fallback). Thread-safe.
  void SetDevices(std::vector<topology::EfaDevice> devices,
                  std::shared_ptr<const topology::HostModel> model = nullptr,
                  bool model_pending = false);
  // How long a call that places EFAs waits for a pending host model.
  static constexpr std::chrono::seconds kModelWait{2};
  // Sets how GetPreferredAllocation learns the admitted container's
  // accelerators. Set before serving.
  void SetTargetFinder(TargetFinder finder);
  // Turns late binding on: the options ask for PreStartContainer, Allocate
  // answers with a CDI device (named as `handover` says) and
  // PreStartContainer calls `binder`. Set before serving.
  void SetLateBinding(PreStartBinder binder, CdiHandover handover = CdiHandover::kBoth);
  // Sends the current list again on every open ListAndWatch stream, although
  // it has not changed: the kubelet rewrites its device checkpoint on every
  // ListAndWatch message (devicemanager/manager.go,
  // genericDeviceUpdateCallback). Thread-safe.
  void Resend();
  // The devices served now. Thread-safe.
  std::shared_ptr<const topology::DeviceTable> Table() const { return table(); }
  // The ListAndWatch message for the current devices. Thread-safe.
  v1beta1::ListAndWatchResponse CurrentList() const;
  // Ends every open ListAndWatch stream; later streams end at once.
  // Thread-safe.
  void Shutdown();
  // `callback` runs on a gRPC thread when a ListAndWatch stream of the
  // current registration ends for a reason other than Shutdown() (the
  // kubelet went away or cancelled it). Streams of earlier registrations end
  // silently: the kubelet closes them when a new registration replaces them.
  // Set before serving.
  void SetStreamEndCallback(std::function<void()> callback);
  // Tells `observer` (not owned; null: none) of every unary RPC handled.
  // Set before serving.
  void SetRpcObserver(RpcObserver* observer) { rpc_observer_ = observer; }
  // Marks the start of a registration attempt: streams opened from now on
  // belong to it. Thread-safe.
  void BeginRegistration();
  int open_streams() const;

  // get_preferred_allocation_available, and pre_start_required with late
  // binding.
  v1beta1::DevicePluginOptions PluginOptions() const;

  grpc::ServerUnaryReactor* GetDevicePluginOptions(grpc::CallbackServerContext* context,
                                                   const v1beta1::Empty* request,
                                                   v1beta1::DevicePluginOptions* response) override;
  grpc::ServerWriteReactor<v1beta1::ListAndWatchResponse>* ListAndWatch(
      grpc::CallbackServerContext* context, const v1beta1::Empty* request) override;
  grpc::ServerUnaryReactor* GetPreferredAllocation(
      grpc::CallbackServerContext* context, const v1beta1::PreferredAllocationRequest* request,
      v1beta1::PreferredAllocationResponse* response) override;
  grpc::ServerUnaryReactor* Allocate(grpc::CallbackServerContext* context,
                                     const v1beta1::AllocateRequest* request,
                                     v1beta1::AllocateResponse* response) override;
  grpc::ServerUnaryReactor* PreStartContainer(
      grpc::CallbackServerContext* context, const v1beta1::PreStartContainerRequest* request,
      v1beta1::PreStartContainerResponse* response) override;

 private:
  class Stream;
  friend class Stream;
  void StreamDone(Stream* stream);
  // Lets every open stream send list_ if it has not yet.
  void PumpStreamsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::shared_ptr<const topology::DeviceTable> table() const;
  // The table once its host model is loaded (or kModelWait passed).
  std::shared_ptr<const topology::DeviceTable> TableWithModel() const;
  bool ModelReady() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !table_->model_pending || shutdown_;
  }

  const Options options_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const topology::DeviceTable> table_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const v1beta1::ListAndWatchResponse> list_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<Stream*> streams_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t registration_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void()> on_stream_end_;
  TargetFinder target_finder_;
  PreStartBinder binder_;  // set: late binding
  CdiHandover handover_ = CdiHandover::kBoth;
  RpcObserver* rpc_observer_ = nullptr;
};

}  // namespace efa::plugin
