// fake-gpu-plugin: a stand-in for NVIDIA's k8s-device-plugin in the
// end-to-end suite (test/e2e/run.sh). It registers `nvidia.com/gpu` with the
// kubelet, advertises one device per GPU PCI address, named by a GPU UUID as
// the NVIDIA plugin does by default, and answers Allocate with
// NVIDIA_VISIBLE_DEVICES (and NVIDIA_MOFED=enabled with --mofed, as the NVIDIA
// plugin does when its MOFED option is on).
//
// Like the NVIDIA plugin on GPUs without NVLink information, it offers
// GetPreferredAllocation and prefers the lowest PCI addresses (must-include
// devices first). --no-preferred-allocation turns the option off: then the
// kubelet picks the GPUs itself, in Go map order (random).
//
// With --proc-root it first writes <proc-root>/driver/nvidia/gpus/<bdf>/information
// for every GPU, with the "GPU UUID:" and "Bus Location:" lines the NVIDIA
// driver writes, so that the EFA plugin can map the UUIDs to PCI addresses.
// With --sysfs-root each GPU must exist there, and its numa_node is
// advertised as the device's TopologyInfo.
//
// It registers again when its socket is deleted or kubelet.sock is re-created
// (a kubelet restart), like a real plugin. SIGTERM/SIGINT: removes its socket
// and exits 0. Exits 1 on bad flags or when it cannot serve.
#include <signal.h>
#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "deviceplugin/v1beta1/api.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/server_context.h"
#include "test/e2e/term_signals.h"

namespace {

namespace fs = std::filesystem;

// The GPUs of the simulated p5.48xlarge, one behind each Nitro switch.
constexpr char kDefaultGpus[] =
    "0000:53:00.0,0000:64:00.0,0000:75:00.0,0000:86:00.0,"
    "0000:97:00.0,0000:a8:00.0,0000:b9:00.0,0000:ca:00.0";

// One line, stamped like the EFA plugin's log so that the two can be merged.
void Log(const std::string& message) {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  tm local{};
  localtime_r(&now.tv_sec, &local);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &local);
  std::fprintf(stderr, "[%s.%03ld] fake-gpu-plugin: %s\n", stamp, now.tv_nsec / 1000000,
               message.c_str());
  std::fflush(stderr);
}

struct Gpu {
  std::string bdf;    // 0000:53:00.0
  std::string uuid;   // GPU-...
  int64_t numa = -1;  // -1: not advertised
};

// A stable UUID per PCI address, shaped like the driver's ("GPU-" + 8-4-4-4-12
// hex digits), so that a run is reproducible.
std::string UuidFor(const std::string& bdf, int index) {
  unsigned domain = 0, bus = 0, slot = 0, function = 0;
  std::sscanf(bdf.c_str(), "%x:%x:%x.%x", &domain, &bus, &slot, &function);
  return absl::StrFormat("GPU-%08x-%04x-4e2e-8e2e-%012x", 0xfa4e2e00u + index, domain,
                         (static_cast<uint64_t>(bus) << 16) | (slot << 8) | function);
}

absl::StatusOr<std::string> ReadFirstLine(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) {
    return absl::NotFoundError(absl::StrCat(path.string(), ": cannot read"));
  }
  return std::string(absl::StripAsciiWhitespace(line));
}

absl::StatusOr<std::vector<Gpu>> MakeGpus(const std::string& list, const std::string& sysfs_root) {
  std::vector<Gpu> gpus;
  for (absl::string_view bdf : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    Gpu gpu;
    gpu.bdf = std::string(absl::StripAsciiWhitespace(bdf));
    unsigned a, b, c, d;
    if (std::sscanf(gpu.bdf.c_str(), "%4x:%2x:%2x.%1x", &a, &b, &c, &d) != 4 ||
        gpu.bdf.size() != 12) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--gpus: \"%s\" is not a PCI address like 0000:53:00.0", gpu.bdf));
    }
    gpu.uuid = UuidFor(gpu.bdf, static_cast<int>(gpus.size()));
    if (!sysfs_root.empty()) {
      const fs::path dev = fs::path(sysfs_root) / "bus/pci/devices" / gpu.bdf;
      absl::StatusOr<std::string> vendor = ReadFirstLine(dev / "vendor");
      if (!vendor.ok()) return vendor.status();
      if (*vendor != "0x10de") {
        return absl::FailedPreconditionError(absl::StrFormat("%s: vendor %s is not NVIDIA (0x10de)",
                                                             (dev / "vendor").string(), *vendor));
      }
      absl::StatusOr<std::string> numa = ReadFirstLine(dev / "numa_node");
      if (numa.ok() && !absl::SimpleAtoi(*numa, &gpu.numa)) gpu.numa = -1;
    }
    gpus.push_back(gpu);
  }
  if (gpus.empty()) return absl::InvalidArgumentError("--gpus: no PCI address given");
  return gpus;
}

// <proc-root>/driver/nvidia/gpus/<bdf>/information, as the NVIDIA driver
// writes it (the lines that matter: "GPU UUID:" and "Bus Location:").
absl::Status WriteProcTree(const fs::path& proc_root, const std::vector<Gpu>& gpus) {
  for (size_t i = 0; i < gpus.size(); ++i) {
    const fs::path dir = proc_root / "driver/nvidia/gpus" / gpus[i].bdf;
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return absl::InternalError(absl::StrCat(dir.string(), ": ", ec.message()));
    std::ofstream out(dir / "information");
    out << "Model: \t\t NVIDIA H100 80GB HBM3\n"
        << "IRQ:   \t\t " << 100 + i << "\n"
        << "GPU UUID: \t " << gpus[i].uuid << "\n"
        << "Video BIOS: \t 96.00.99.00.01\n"
        << "Bus Type: \t PCIe\n"
        << "DMA Size: \t 52 bits\n"
        << "DMA Mask: \t 0xfffffffffffff\n"
        << "Bus Location: \t " << gpus[i].bdf << "\n"
        << "Device Minor: \t " << i << "\n"
        << "GPU Excluded:\t No\n";
    if (!out.flush()) {
      return absl::InternalError(absl::StrCat((dir / "information").string(), ": cannot write"));
    }
  }
  return absl::OkStatus();
}

class FakeGpuService final : public v1beta1::DevicePlugin::Service {
 public:
  FakeGpuService(std::vector<Gpu> gpus, bool mofed, bool preferred)
      : gpus_(std::move(gpus)), mofed_(mofed), preferred_(preferred) {}

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* options) override {
    options->set_get_preferred_allocation_available(preferred_);
    return grpc::Status::OK;
  }

  // Sends the full list once, then holds the stream open until the kubelet
  // ends it or Shutdown is called.
  grpc::Status ListAndWatch(grpc::ServerContext* context, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override {
    v1beta1::ListAndWatchResponse response;
    for (const Gpu& gpu : gpus_) {
      v1beta1::Device* device = response.add_devices();
      device->set_id(gpu.uuid);
      device->set_health("Healthy");
      if (gpu.numa >= 0) device->mutable_topology()->add_nodes()->set_id(gpu.numa);
    }
    if (!writer->Write(response)) return grpc::Status::OK;
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return shutdown_ || context->IsCancelled();
    };
    while (!done()) mu_.AwaitWithTimeout(absl::Condition(&done), absl::Milliseconds(200));
    return grpc::Status::OK;
  }

  // The must-include devices, then the available ones by PCI address (the
  // GPU list is in PCI order), up to the allocation size.
  grpc::Status GetPreferredAllocation(grpc::ServerContext*,
                                      const v1beta1::PreferredAllocationRequest* request,
                                      v1beta1::PreferredAllocationResponse* response) override {
    for (const auto& container : request->container_requests()) {
      v1beta1::ContainerPreferredAllocationResponse* out = response->add_container_responses();
      if (!preferred_) continue;
      const auto& available = container.available_deviceids();
      std::vector<std::string> chosen(container.must_include_deviceids().begin(),
                                      container.must_include_deviceids().end());
      for (const Gpu& gpu : gpus_) {
        if (static_cast<int>(chosen.size()) >= container.allocation_size()) break;
        if (std::find(available.begin(), available.end(), gpu.uuid) != available.end() &&
            std::find(chosen.begin(), chosen.end(), gpu.uuid) == chosen.end()) {
          chosen.push_back(gpu.uuid);
        }
      }
      for (const std::string& id : chosen) out->add_deviceids(id);
      Log(absl::StrFormat("GetPreferredAllocation %d of %d available: %s",
                          container.allocation_size(), available.size(), Describe(chosen)));
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* request,
                        v1beta1::AllocateResponse* response) override {
    for (const auto& container : request->container_requests()) {
      for (const std::string& id : container.devices_ids()) {
        if (!Known(id)) {
          return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              absl::StrFormat("unknown device \"%s\": not a GPU of this node", id));
        }
      }
    }
    for (const auto& container : request->container_requests()) {
      const std::string ids = absl::StrJoin(container.devices_ids(), ",");
      v1beta1::ContainerAllocateResponse* out = response->add_container_responses();
      (*out->mutable_envs())["NVIDIA_VISIBLE_DEVICES"] = ids;
      if (mofed_) (*out->mutable_envs())["NVIDIA_MOFED"] = "enabled";
      Log(absl::StrFormat(
          "Allocate %s%s",
          Describe({container.devices_ids().begin(), container.devices_ids().end()}),
          mofed_ ? " (NVIDIA_MOFED=enabled)" : ""));
    }
    return grpc::Status::OK;
  }

  grpc::Status PreStartContainer(grpc::ServerContext*, const v1beta1::PreStartContainerRequest*,
                                 v1beta1::PreStartContainerResponse*) override {
    return grpc::Status::OK;
  }

  // Ends every ListAndWatch stream (before the server shuts down).
  void Shutdown() {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
  }

 private:
  bool Known(const std::string& id) const {
    for (const Gpu& gpu : gpus_) {
      if (gpu.uuid == id) return true;
    }
    return false;
  }

  // "GPU-... (0000:53:00.0),..." for the log.
  std::string Describe(const std::vector<std::string>& ids) const {
    std::vector<std::string> parts;
    for (const std::string& id : ids) {
      std::string part = id;
      for (const Gpu& gpu : gpus_) {
        if (gpu.uuid == id) part += " (" + gpu.bdf + ")";
      }
      parts.push_back(part);
    }
    return parts.empty() ? "none" : absl::StrJoin(parts, ",");
  }

  const std::vector<Gpu> gpus_;
  const bool mofed_;
  const bool preferred_;
  absl::Mutex mu_;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

// One serving of the plugin socket: a fresh service and server each time.
struct Serving {
  std::unique_ptr<FakeGpuService> service;
  std::unique_ptr<grpc::Server> server;

  void Stop() {
    if (service) service->Shutdown();
    if (server) server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server.reset();
    service.reset();
  }
};

absl::Status Serve(const fs::path& socket, const std::vector<Gpu>& gpus, bool mofed, bool preferred,
                   Serving* serving) {
  serving->Stop();
  std::error_code ec;
  fs::remove(socket, ec);  // A stale file from an earlier run.
  serving->service = std::make_unique<FakeGpuService>(gpus, mofed, preferred);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix://" + socket.string(), grpc::InsecureServerCredentials());
  builder.RegisterService(serving->service.get());
  serving->server = builder.BuildAndStart();
  if (!serving->server) {
    return absl::UnavailableError(absl::StrCat(socket.string(), ": cannot serve"));
  }
  return absl::OkStatus();
}

absl::Status Register(const fs::path& kubelet_socket, const std::string& endpoint,
                      const std::string& resource, bool preferred) {
  auto channel =
      grpc::CreateChannel("unix://" + kubelet_socket.string(), grpc::InsecureChannelCredentials());
  auto stub = v1beta1::Registration::NewStub(channel);
  v1beta1::RegisterRequest request;
  request.set_version("v1beta1");
  request.set_endpoint(endpoint);
  request.set_resource_name(resource);
  // Kubelet 1.20 takes the options from here, not from GetDevicePluginOptions.
  request.mutable_options()->set_get_preferred_allocation_available(preferred);
  v1beta1::Empty empty;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(15));
  const grpc::Status status = stub->Register(&context, request, &empty);
  if (!status.ok()) {
    return absl::UnavailableError(
        absl::StrCat(kubelet_socket.string(), ": Register failed: ", status.error_message()));
  }
  return absl::OkStatus();
}

// The change time of a path (nanoseconds), or nullopt if it does not exist.
std::optional<int64_t> ChangeTime(const fs::path& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"A fake NVIDIA GPU device plugin for the end-to-end suite."};
  std::string kubelet_dir = "/var/lib/kubelet";
  std::string resource = "nvidia.com/gpu";
  std::string socket_name = "efa-e2e-fake-gpu.sock";
  std::string gpu_list = kDefaultGpus;
  std::string proc_root;
  std::string sysfs_root;
  bool mofed = false;
  bool no_preferred = false;
  app.add_option("--kubelet-dir", kubelet_dir, "The kubelet's root directory")
      ->capture_default_str();
  app.add_option("--resource", resource, "The resource to register")->capture_default_str();
  app.add_option("--socket-name", socket_name, "The plugin socket's name in device-plugins/")
      ->capture_default_str();
  app.add_option("--gpus", gpu_list, "The GPUs' PCI addresses, comma-separated")
      ->capture_default_str();
  app.add_option("--proc-root", proc_root,
                 "Write <proc-root>/driver/nvidia/gpus/<bdf>/information for every GPU");
  app.add_option("--sysfs-root", sysfs_root,
                 "Check the GPUs exist there and advertise their NUMA nodes");
  app.add_flag("--mofed", mofed, "Answer Allocate with NVIDIA_MOFED=enabled");
  app.add_flag("--no-preferred-allocation", no_preferred,
               "Do not offer GetPreferredAllocation (the kubelet then picks GPUs at random)");
  CLI11_PARSE(app, argc, argv);

  absl::StatusOr<std::vector<Gpu>> gpus = MakeGpus(gpu_list, sysfs_root);
  if (!gpus.ok()) {
    Log(std::string(gpus.status().message()));
    return 1;
  }
  if (!proc_root.empty()) {
    if (absl::Status status = WriteProcTree(proc_root, *gpus); !status.ok()) {
      Log(std::string(status.message()));
      return 1;
    }
  }
  for (const Gpu& gpu : *gpus) {
    Log(absl::StrFormat("GPU %s = %s (NUMA %d)", gpu.uuid, gpu.bdf, gpu.numa));
  }

  // Signals are taken synchronously by the main loop below.
  sigset_t signals = efa::e2e::BlockTermSignals();

  const fs::path dir = fs::path(kubelet_dir) / "device-plugins";
  const fs::path socket = dir / socket_name;
  const fs::path kubelet_socket = dir / "kubelet.sock";
  Serving serving;
  bool registered = false;
  std::optional<int64_t> kubelet_ctime;
  int backoff_ms = 250;
  auto next_try = std::chrono::steady_clock::now();

  for (;;) {
    // A kubelet restart deletes our socket and creates a new kubelet.sock.
    const std::optional<int64_t> now_ctime = ChangeTime(kubelet_socket);
    const bool socket_gone = serving.server && !fs::exists(socket);
    if (registered && (socket_gone || now_ctime != kubelet_ctime)) {
      Log(socket_gone ? "socket deleted: registering again"
                      : "kubelet.sock re-created: registering again");
      registered = false;
      next_try = std::chrono::steady_clock::now();
    }
    if (!registered && std::chrono::steady_clock::now() >= next_try) {
      absl::Status status = absl::OkStatus();
      if (!serving.server || !fs::exists(socket))
        status = Serve(socket, *gpus, mofed, !no_preferred, &serving);
      if (status.ok()) status = Register(kubelet_socket, socket_name, resource, !no_preferred);
      if (status.ok()) {
        registered = true;
        kubelet_ctime = ChangeTime(kubelet_socket);
        backoff_ms = 250;
        Log(absl::StrFormat("registered %s (%d devices%s%s) at %s", resource, gpus->size(),
                            mofed ? ", NVIDIA_MOFED=enabled" : "",
                            no_preferred ? "" : ", preferring the lowest PCI addresses",
                            kubelet_socket.string()));
      } else {
        Log(absl::StrFormat("%s; retrying in %d ms", status.message(), backoff_ms));
        next_try = std::chrono::steady_clock::now() + std::chrono::milliseconds(backoff_ms);
        backoff_ms = std::min(backoff_ms * 2, 4000);
      }
    }
    const timespec tick{0, 250 * 1000 * 1000};
    const int sig = sigtimedwait(&signals, nullptr, &tick);
    if (sig == SIGTERM || sig == SIGINT) break;
  }
  serving.Stop();
  std::error_code ec;
  fs::remove(socket, ec);
  Log("stopped");
  return 0;
}
