#include "test/fake_kubelet/fake_accelerator_plugin.h"

#include <sys/un.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/server_context.h"
#include "test/fake_kubelet/serve_unix.h"

namespace efa::testing {

namespace fs = std::filesystem;

namespace {

// How long Register may take: the kubelet dials back within it (10 s).
constexpr auto kRegisterTimeout = std::chrono::seconds(15);
// How often a ListAndWatch handler with nothing to send checks whether the
// kubelet has gone; a cancelled call is noticed only then.
constexpr auto kCancelPoll = absl::Milliseconds(50);
constexpr auto kShutdownGrace = std::chrono::seconds(2);

std::vector<FakeAcceleratorPlugin::Accelerator> FindAccelerators(const sim::MachineSpec& machine,
                                                                 AcceleratorKind kind) {
  const sim::Kind wanted =
      kind == AcceleratorKind::kNvidiaGpu ? sim::Kind::kGpu : sim::Kind::kNeuron;
  std::vector<FakeAcceleratorPlugin::Accelerator> found;
  for (const sim::PcieGroup& group : machine.groups) {
    for (const sim::Endpoint& endpoint : group.endpoints) {
      if (endpoint.kind == wanted) found.push_back({"", endpoint.addr, group.numa});
    }
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.address < b.address; });
  for (size_t i = 0; i < found.size(); ++i) {
    found[i].id =
        kind == AcceleratorKind::kNvidiaGpu ? sim::SimGpuUuid(found[i].address) : std::to_string(i);
  }
  return found;
}

}  // namespace

class FakeAcceleratorPlugin::Service final : public v1beta1::DevicePlugin::Service {
 public:
  explicit Service(FakeAcceleratorPlugin* plugin) : plugin_(plugin) {
    for (size_t i = 0; i < plugin_->accelerators_.size(); ++i) {
      rank_[plugin_->accelerators_[i].id] = i;
    }
  }

  grpc::Status GetDevicePluginOptions(grpc::ServerContext* /*context*/,
                                      const v1beta1::Empty* /*request*/,
                                      v1beta1::DevicePluginOptions* response) override {
    response->set_get_preferred_allocation_available(true);
    return grpc::Status::OK;
  }

  grpc::Status ListAndWatch(grpc::ServerContext* context, const v1beta1::Empty* /*request*/,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override {
    int sent = -1;
    while (true) {
      v1beta1::ListAndWatchResponse response;
      {
        absl::MutexLock lock(&plugin_->mu_);
        auto changed = [&]() {
          plugin_->mu_.AssertHeld();
          return plugin_->stopping_ || plugin_->version_ != sent;
        };
        while (!plugin_->mu_.AwaitWithTimeout(absl::Condition(&changed), kCancelPoll)) {
          if (context->IsCancelled()) return grpc::Status::CANCELLED;
        }
        if (plugin_->stopping_) return grpc::Status::OK;
        sent = plugin_->version_;
        for (size_t i = 0; i < plugin_->accelerators_.size(); ++i) {
          const Accelerator& accelerator = plugin_->accelerators_[i];
          v1beta1::Device* device = response.add_devices();
          device->set_id(accelerator.id);
          device->set_health(plugin_->healthy_[i] ? "Healthy" : "Unhealthy");
          if (plugin_->options_.report_numa && accelerator.numa >= 0) {
            device->mutable_topology()->add_nodes()->set_id(accelerator.numa);
          }
        }
      }
      if (!writer->Write(response)) return grpc::Status::OK;
    }
  }

  grpc::Status GetPreferredAllocation(grpc::ServerContext* /*context*/,
                                      const v1beta1::PreferredAllocationRequest* request,
                                      v1beta1::PreferredAllocationResponse* response) override {
    for (const auto& container : request->container_requests()) {
      auto* answer = response->add_container_responses();
      std::set<std::string> taken;
      auto take = [&](const std::string& id) {
        if (answer->deviceids_size() < container.allocation_size() && rank_.count(id) != 0 &&
            taken.insert(id).second) {
          answer->add_deviceids(id);
        }
      };
      for (const auto& id : container.must_include_deviceids()) take(id);
      // Lowest PCI address (or Neuron index) first.
      std::vector<std::string> available(container.available_deviceids().begin(),
                                         container.available_deviceids().end());
      std::erase_if(available, [&](const std::string& id) { return rank_.count(id) == 0; });
      std::sort(available.begin(), available.end(),
                [&](const auto& a, const auto& b) { return rank_.at(a) < rank_.at(b); });
      for (const auto& id : available) take(id);
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext* /*context*/, const v1beta1::AllocateRequest* request,
                        v1beta1::AllocateResponse* response) override {
    std::vector<std::vector<std::string>> requested;
    for (const auto& container : request->container_requests()) {
      std::set<std::string> seen;
      for (const auto& id : container.devices_ids()) {
        if (rank_.count(id) == 0) {
          return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              absl::StrFormat("unknown device \"%s\"", id));
        }
        if (!seen.insert(id).second) {
          return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              absl::StrFormat("device \"%s\" requested twice", id));
        }
      }
      requested.emplace_back(container.devices_ids().begin(), container.devices_ids().end());
    }
    const bool nvidia = plugin_->options_.kind == AcceleratorKind::kNvidiaGpu;
    for (const auto& ids : requested) {
      auto* answer = response->add_container_responses();
      const std::string list = absl::StrJoin(ids, ",");
      if (nvidia) {
        (*answer->mutable_envs())["NVIDIA_VISIBLE_DEVICES"] = list;
        if (plugin_->options_.mofed_enabled) (*answer->mutable_envs())["NVIDIA_MOFED"] = "enabled";
      } else {
        for (const auto& id : ids) {
          auto* spec = answer->add_devices();
          spec->set_host_path("/dev/neuron" + id);
          spec->set_container_path("/dev/neuron" + id);
          spec->set_permissions("rw");
        }
        (*answer->mutable_envs())["AWS_NEURON_VISIBLE_DEVICES"] = list;
      }
    }
    absl::MutexLock lock(&plugin_->mu_);
    for (auto& ids : requested) plugin_->allocations_.push_back(std::move(ids));
    return grpc::Status::OK;
  }

  grpc::Status PreStartContainer(grpc::ServerContext* /*context*/,
                                 const v1beta1::PreStartContainerRequest* /*request*/,
                                 v1beta1::PreStartContainerResponse* /*response*/) override {
    return grpc::Status::OK;
  }

 private:
  FakeAcceleratorPlugin* const plugin_;
  // ID -> position in PCI order.
  std::map<std::string, size_t> rank_;
};

FakeAcceleratorPlugin::FakeAcceleratorPlugin(const sim::MachineSpec& machine,
                                             FakeAcceleratorPluginOptions options)
    : dir_(options.device_plugin_dir),
      socket_name_(!options.socket_name.empty()                  ? options.socket_name
                   : options.kind == AcceleratorKind::kNvidiaGpu ? "nvidia-gpu.sock"
                                                                 : "aws-neuron.sock"),
      options_(options),
      resource_(options.kind == AcceleratorKind::kNvidiaGpu ? kNvidiaGpuResource : kNeuronResource),
      accelerators_(FindAccelerators(machine, options.kind)) {
  absl::MutexLock lock(&mu_);
  healthy_.assign(accelerators_.size(), true);
}

namespace {

FakeAcceleratorPluginOptions DefaultOptions(AcceleratorKind kind, const fs::path& dir) {
  FakeAcceleratorPluginOptions options;
  options.kind = kind;
  options.device_plugin_dir = dir;
  return options;
}

}  // namespace

FakeAcceleratorPlugin::FakeAcceleratorPlugin(const sim::MachineSpec& machine, AcceleratorKind kind,
                                             const fs::path& device_plugin_dir)
    : FakeAcceleratorPlugin(machine, DefaultOptions(kind, device_plugin_dir)) {}

FakeAcceleratorPlugin::~FakeAcceleratorPlugin() { Stop(); }

absl::Status FakeAcceleratorPlugin::Start() {
  absl::MutexLock lifecycle_lock(&lifecycle_mu_);
  const fs::path path = socket_path();
  if (server_ != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(path.string(), ": already serving"));
  }
  if (absl::Status fits = CheckUnixSocketPath(path); !fits.ok()) return fits;
  std::error_code ec;
  fs::remove(path, ec);
  if (ec) return absl::UnavailableError(absl::StrCat(path.string(), ": ", ec.message()));
  {
    absl::MutexLock lock(&mu_);
    stopping_ = false;
  }
  auto service = std::make_unique<Service>(this);
  auto server = ServeOnUnixSocket(path, service.get());
  if (!server.ok()) return server.status();
  service_ = std::move(service);
  server_ = *std::move(server);

  // Serve first: the kubelet dials back before it answers.
  const fs::path kubelet = dir_ / "kubelet.sock";
  auto stub = v1beta1::Registration::NewStub(
      grpc::CreateChannel("unix:" + kubelet.string(), grpc::InsecureChannelCredentials()));
  v1beta1::RegisterRequest request;
  request.set_version("v1beta1");
  request.set_endpoint(socket_name_);
  request.set_resource_name(resource_);
  request.mutable_options()->set_get_preferred_allocation_available(true);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kRegisterTimeout);
  v1beta1::Empty empty;
  const grpc::Status status = stub->Register(&context, request, &empty);
  if (!status.ok()) {
    StopLocked();
    return absl::UnavailableError(absl::StrFormat("%s: Register %s failed: %s", kubelet.string(),
                                                  resource_, status.error_message()));
  }
  return absl::OkStatus();
}

void FakeAcceleratorPlugin::Stop() {
  absl::MutexLock lifecycle_lock(&lifecycle_mu_);
  StopLocked();
}

void FakeAcceleratorPlugin::StopLocked() {
  if (server_ == nullptr) return;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  server_->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
  server_->Wait();
  server_.reset();
  service_.reset();
  std::error_code ec;
  fs::remove(socket_path(), ec);
}

std::vector<std::string> FakeAcceleratorPlugin::ids() const {
  std::vector<std::string> ids;
  for (const auto& accelerator : accelerators_) ids.push_back(accelerator.id);
  return ids;
}

absl::Status FakeAcceleratorPlugin::SetHealthy(const std::string& id, bool healthy) {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < accelerators_.size(); ++i) {
    if (accelerators_[i].id != id) continue;
    if (healthy_[i] != healthy) {
      healthy_[i] = healthy;
      ++version_;
    }
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrFormat("%s: no device \"%s\"", resource_, id));
}

std::vector<std::vector<std::string>> FakeAcceleratorPlugin::allocations() const {
  absl::MutexLock lock(&mu_);
  return allocations_;
}

}  // namespace efa::testing
