// A fake accelerator device plugin for tests and the fake kubelet: a real
// v1beta1.DevicePlugin on a unix socket in the device-plugin directory that
// registers itself with the kubelet there, advertising a simulated machine's
// GPUs (as NVIDIA's k8s-device-plugin) or Neuron devices (as AWS's Neuron
// device plugin).
//
//   nvidia.com/gpu          IDs = GPU UUIDs (sim::SimGpuUuid, what the
//                           simulated driver lists in /proc); preference
//                           lowest PCI address first (NVIDIA's allocator with
//                           no NVLink information); Allocate answers
//                           NVIDIA_VISIBLE_DEVICES=<ids> and, with
//                           mofed_enabled, NVIDIA_MOFED=enabled.
//   aws.amazon.com/neuron   IDs = "0".."N-1", the index of the device in PCI
//                           order of the machine's Neuron devices (as
//                           /dev/neuronN); preference lowest index first;
//                           Allocate answers /dev/neuronN device specs and
//                           AWS_NEURON_VISIBLE_DEVICES=<ids>.
//
// Each device carries its PCIe group's NUMA node as TopologyInfo (none when
// the node is -1 or report_numa is off). GetPreferredAllocation puts the
// must-include IDs first and never fails; Allocate refuses an unknown or
// repeated ID with INVALID_ARGUMENT. Every device is healthy until
// SetHealthy says otherwise.
//
// Thread safety: every public method is thread-safe. Start and Stop are
// serialized among themselves.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "deviceplugin/v1beta1/api.pb.h"
#include "grpcpp/server.h"
#include "test/sim/machine_spec.h"
#include "topology/pci_address.h"

namespace efa::testing {

enum class AcceleratorKind { kNvidiaGpu, kNeuron };

struct FakeAcceleratorPluginOptions {
  AcceleratorKind kind = AcceleratorKind::kNvidiaGpu;
  // The kubelet's device-plugin directory: the plugin's socket is served and
  // kubelet.sock is dialled there.
  std::filesystem::path device_plugin_dir;
  // The socket's file name; empty: "nvidia-gpu.sock" or "aws-neuron.sock".
  std::string socket_name;
  // NVIDIA only: Allocate also sets NVIDIA_MOFED=enabled (--mofed-enabled).
  bool mofed_enabled = false;
  // Advertise the devices' NUMA nodes.
  bool report_numa = true;
};

class FakeAcceleratorPlugin {
 public:
  static constexpr char kNvidiaGpuResource[] = "nvidia.com/gpu";
  static constexpr char kNeuronResource[] = "aws.amazon.com/neuron";

  // One advertised device.
  struct Accelerator {
    std::string id;
    topology::PciAddress address;
    int numa = -1;  // -1: unknown
  };

  // The accelerators of `machine` of the kind in `options`, in PCI order.
  // Serves nothing until Start.
  FakeAcceleratorPlugin(const sim::MachineSpec& machine, FakeAcceleratorPluginOptions options);
  // The same with the default options for `kind` in `device_plugin_dir`.
  FakeAcceleratorPlugin(const sim::MachineSpec& machine, AcceleratorKind kind,
                        const std::filesystem::path& device_plugin_dir);
  // Stops serving (see Stop).
  ~FakeAcceleratorPlugin();

  FakeAcceleratorPlugin(const FakeAcceleratorPlugin&) = delete;
  FakeAcceleratorPlugin& operator=(const FakeAcceleratorPlugin&) = delete;

  // Serves on <dir>/<socket_name> (a stale file there is removed first), then
  // registers with <dir>/kubelet.sock, as a plugin does at start and again
  // after a kubelet restart (call Stop first). Fails naming the socket when
  // it cannot serve, or with the kubelet's answer when Register fails (then
  // serving nothing); FAILED_PRECONDITION when already serving.
  absl::Status Start();
  // Ends the ListAndWatch streams (as a dying plugin does), stops serving and
  // removes the socket. Idempotent.
  void Stop();

  // "nvidia.com/gpu" or "aws.amazon.com/neuron".
  const std::string& resource_name() const { return resource_; }
  std::filesystem::path socket_path() const { return dir_ / socket_name_; }
  // The devices advertised, in PCI order.
  const std::vector<Accelerator>& accelerators() const { return accelerators_; }
  // The IDs of accelerators(), in the same order.
  std::vector<std::string> ids() const;

  // Marks a device healthy or not; the new list is streamed at once.
  // NOT_FOUND for an unknown ID.
  absl::Status SetHealthy(const std::string& id, bool healthy);

  // The device IDs of each container request of each Allocate call so far,
  // in call order.
  std::vector<std::vector<std::string>> allocations() const;

 private:
  class Service;

  void StopLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lifecycle_mu_);

  const std::filesystem::path dir_;
  const std::string socket_name_;
  const FakeAcceleratorPluginOptions options_;
  const std::string resource_;
  const std::vector<Accelerator> accelerators_;

  absl::Mutex lifecycle_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::unique_ptr<Service> service_ ABSL_GUARDED_BY(lifecycle_mu_);
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(lifecycle_mu_);

  mutable absl::Mutex mu_;
  // Set while the server stops: ends the ListAndWatch handlers.
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Bumped on every health change: ListAndWatch sends the list again.
  int version_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<bool> healthy_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<std::string>> allocations_ ABSL_GUARDED_BY(mu_);
};

}  // namespace efa::testing
