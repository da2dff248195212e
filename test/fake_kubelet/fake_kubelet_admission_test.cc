// The fake kubelet's device manager: pod admission, the checkpoint and the
// pod-resources API, with an EFA-like plugin written here and the fake GPU
// plugin.
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/escaping.h"
#include "absl/synchronization/mutex.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/server_context.h"
#include "nlohmann/json.hpp"
#include "podresources/v1/api.grpc.pb.h"
#include "test/fake_kubelet/fake_accelerator_plugin.h"
#include "test/fake_kubelet/fake_kubelet.h"
#include "test/sim/machine_spec.h"
#include "test/support/devices.h"
#include "test/support/temp_dir.h"

namespace fs = std::filesystem;
using efa::testing::AcceleratorKind;
using efa::testing::FakeAcceleratorPlugin;
using efa::testing::FakeKubelet;
using namespace std::chrono_literals;
using Json = nlohmann::json;
using Requests = std::vector<std::pair<std::string, int>>;

using efa::testing::TempDir;

namespace {

using efa::testing::kEfa;
using efa::testing::kGpu;
constexpr auto kWait = 5s;

// Calls pod-resources List on `socket`.
grpc::Status ListPodResources(const fs::path& socket, v1::ListPodResourcesResponse* response,
                              std::chrono::milliseconds deadline = kWait) {
  auto stub = v1::PodResourcesLister::NewStub(
      grpc::CreateChannel("unix:" + socket.string(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + deadline);
  return stub->List(&context, v1::ListPodResourcesRequest(), response);
}

// The container as List shows it, or null when not listed.
const v1::ContainerResources* FindListed(const v1::ListPodResourcesResponse& response,
                                         const std::string& pod, const std::string& container) {
  for (const auto& p : response.pod_resources()) {
    if (p.name() != pod) continue;
    for (const auto& c : p.containers()) {
      if (c.name() == container) return &c;
    }
  }
  return nullptr;
}

// What List says of one container: "absent" when the pod or container is not
// listed, else "resource=id,id;..." over its device entries in order.
std::string Listed(const v1::ListPodResourcesResponse& response, const std::string& pod,
                   const std::string& container) {
  const v1::ContainerResources* c = FindListed(response, pod, container);
  if (c == nullptr) return "absent";
  std::string out;
  for (const auto& devices : c->devices()) {
    if (!out.empty()) out += ";";
    out += devices.resource_name() + "=";
    for (int i = 0; i < devices.device_ids_size(); ++i) {
      out += (i > 0 ? "," : "") + devices.device_ids(i);
    }
    if (devices.has_topology()) {
      for (const auto& node : devices.topology().nodes()) {
        out += "@" + std::to_string(node.id());
      }
    }
  }
  return out;
}

Json ReadJson(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return Json::parse(text.str());
}

// The checkpoint's entries as "pod/container/resource", in file order.
std::vector<std::string> CheckpointEntries(const fs::path& path) {
  if (!fs::exists(path)) return {"no checkpoint"};
  const Json doc = ReadJson(path);
  std::vector<std::string> out;
  for (const auto& entry : doc["Data"]["PodDeviceEntries"]) {
    out.push_back(entry["PodUID"].get<std::string>() + "/" +
                  entry["ContainerName"].get<std::string>() + "/" +
                  entry["ResourceName"].get<std::string>());
  }
  return out;
}

v1beta1::Device Device(const std::string& id, int numa) {
  v1beta1::Device device;
  device.set_id(id);
  device.set_health("Healthy");
  if (numa >= 0) device.mutable_topology()->add_nodes()->set_id(numa);
  return device;
}

// An EFA-like device plugin: efa0..efa7 (NUMA 0 for 0-3, 1 for 4-7), a
// preference given by the test (default: the available IDs from the last),
// hooks the test sets to look at the kubelet while an RPC runs, and a record
// of the calls. Thread-safe; the hooks run on gRPC threads and must not use
// Catch2's assertions.
class EfaLikePlugin final : public v1beta1::DevicePlugin::Service {
 public:
  using Hook = std::function<void(const std::vector<std::string>& ids)>;

  EfaLikePlugin(fs::path socket, bool pre_start_required, std::string resource = kEfa)
      : socket_(std::move(socket)), resource_(std::move(resource)) {
    options_.set_get_preferred_allocation_available(true);
    options_.set_pre_start_required(pre_start_required);
    for (int i = 0; i < 8; ++i) devices_.push_back(Device("efa" + std::to_string(i), i / 4));
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_.string(), grpc::InsecureServerCredentials());
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    REQUIRE(server_ != nullptr);
  }
  ~EfaLikePlugin() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    server_->Shutdown();
  }

  grpc::Status Register(const fs::path& kubelet_socket) {
    auto stub = v1beta1::Registration::NewStub(
        grpc::CreateChannel("unix:" + kubelet_socket.string(), grpc::InsecureChannelCredentials()));
    v1beta1::RegisterRequest request;
    request.set_version("v1beta1");
    request.set_endpoint(socket_.filename().string());
    request.set_resource_name(resource_);
    *request.mutable_options() = options_;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kWait);
    v1beta1::Empty empty;
    return stub->Register(&context, request, &empty);
  }

  // Runs in GetPreferredAllocation with the available IDs, in Allocate with
  // the requested IDs, in PreStartContainer with its IDs.
  void SetHooks(Hook on_prefer, Hook on_allocate, Hook on_pre_start) {
    absl::MutexLock lock(&mu_);
    on_prefer_ = std::move(on_prefer);
    on_allocate_ = std::move(on_allocate);
    on_pre_start_ = std::move(on_pre_start);
  }
  // What GetPreferredAllocation answers, given the available IDs and size.
  void SetPreference(
      std::function<std::vector<std::string>(const std::vector<std::string>&, int)> prefer) {
    absl::MutexLock lock(&mu_);
    prefer_ = std::move(prefer);
  }
  void FailAllocate(grpc::Status status) {
    absl::MutexLock lock(&mu_);
    allocate_status_ = std::move(status);
  }
  void FailPreStart(grpc::Status status) {
    absl::MutexLock lock(&mu_);
    pre_start_status_ = std::move(status);
  }
  std::vector<std::vector<std::string>> pre_starts() const {
    absl::MutexLock lock(&mu_);
    return pre_starts_;
  }

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* response) override {
    *response = options_;
    return grpc::Status::OK;
  }

  grpc::Status ListAndWatch(grpc::ServerContext* context, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override {
    v1beta1::ListAndWatchResponse response;
    for (const auto& device : devices_) *response.add_devices() = device;
    if (!writer->Write(response)) return grpc::Status::OK;
    absl::MutexLock lock(&mu_);
    auto done = [&]() {
      mu_.AssertHeld();
      return stopping_;
    };
    while (!mu_.AwaitWithTimeout(absl::Condition(&done), absl::Milliseconds(50))) {
      if (context->IsCancelled()) break;
    }
    return grpc::Status::OK;
  }

  grpc::Status GetPreferredAllocation(grpc::ServerContext*,
                                      const v1beta1::PreferredAllocationRequest* request,
                                      v1beta1::PreferredAllocationResponse* response) override {
    for (const auto& container : request->container_requests()) {
      const std::vector<std::string> available(container.available_deviceids().begin(),
                                               container.available_deviceids().end());
      Hook hook;
      std::vector<std::string> preferred;
      {
        absl::MutexLock lock(&mu_);
        hook = on_prefer_;
        if (prefer_) {
          preferred = prefer_(available, container.allocation_size());
        } else {
          for (auto it = available.rbegin();
               it != available.rend() &&
               static_cast<int>(preferred.size()) < container.allocation_size();
               ++it) {
            preferred.push_back(*it);
          }
        }
      }
      if (hook) hook(available);
      auto* answer = response->add_container_responses();
      for (const auto& id : preferred) answer->add_deviceids(id);
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* request,
                        v1beta1::AllocateResponse* response) override {
    for (const auto& container : request->container_requests()) {
      const std::vector<std::string> ids(container.devices_ids().begin(),
                                         container.devices_ids().end());
      Hook hook;
      grpc::Status status;
      {
        absl::MutexLock lock(&mu_);
        hook = on_allocate_;
        status = allocate_status_;
      }
      if (hook) hook(ids);
      if (!status.ok()) return status;
      auto* answer = response->add_container_responses();
      std::string list;
      for (const auto& id : ids) {
        auto* spec = answer->add_devices();
        spec->set_host_path("/dev/infiniband/" + id);
        spec->set_container_path("/dev/infiniband/" + id);
        spec->set_permissions("rw");
        list += (list.empty() ? "" : ",") + id;
      }
      (*answer->mutable_envs())["EFA_DEVICES"] = list;
    }
    return grpc::Status::OK;
  }

  grpc::Status PreStartContainer(grpc::ServerContext*,
                                 const v1beta1::PreStartContainerRequest* request,
                                 v1beta1::PreStartContainerResponse*) override {
    const std::vector<std::string> ids(request->devices_ids().begin(),
                                       request->devices_ids().end());
    Hook hook;
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      pre_starts_.push_back(ids);
      hook = on_pre_start_;
      status = pre_start_status_;
    }
    if (hook) hook(ids);
    return status;
  }

 private:
  const fs::path socket_;
  const std::string resource_;
  v1beta1::DevicePluginOptions options_;
  std::vector<v1beta1::Device> devices_;
  std::unique_ptr<grpc::Server> server_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Hook on_prefer_ ABSL_GUARDED_BY(mu_);
  Hook on_allocate_ ABSL_GUARDED_BY(mu_);
  Hook on_pre_start_ ABSL_GUARDED_BY(mu_);
  std::function<std::vector<std::string>(const std::vector<std::string>&, int)> prefer_
      ABSL_GUARDED_BY(mu_);
  grpc::Status allocate_status_ ABSL_GUARDED_BY(mu_);
  grpc::Status pre_start_status_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<std::string>> pre_starts_ ABSL_GUARDED_BY(mu_);
};

// A kubelet directory with the fake kubelet (device plugins and
// pod-resources), the fake GPU plugin of a p5 and the EFA-like plugin, all
// registered and streaming.
class Node {
 public:
  explicit Node(bool efa_pre_start = false, bool kubelet_1_20 = false,
                std::chrono::milliseconds endpoint_grace = std::chrono::minutes(5))
      : kubelet_(Options(dir_.path() / "kubelet", kubelet_1_20, endpoint_grace)),
        gpus_(*efa::sim::FindMachine("p5.48xlarge"), AcceleratorKind::kNvidiaGpu,
              dir_.path() / "kubelet/device-plugins") {
    REQUIRE(kubelet_.Start().ok());
    REQUIRE(gpus_.Start().ok());
    efa_ = std::make_unique<EfaLikePlugin>(kubelet_.dir() / "efa.sock", efa_pre_start);
    REQUIRE(efa_->Register(kubelet_.socket_path()).ok());
    REQUIRE(kubelet_.WaitForListAndWatchMessages(kGpu, 1, kWait));
    REQUIRE(kubelet_.WaitForListAndWatchMessages(kEfa, 1, kWait));
  }

  FakeKubelet& kubelet() { return kubelet_; }
  FakeAcceleratorPlugin& gpus() { return gpus_; }
  EfaLikePlugin& efa() { return *efa_; }
  std::vector<std::string> gpu_ids() const { return gpus_.ids(); }

  // Replaces the EFA plugin (after a kubelet restart, or a plugin restart
  // that serves `resource` now) and waits for its list.
  void ReRegisterEfa(bool pre_start, const std::string& resource = kEfa) {
    efa_.reset();
    efa_ = std::make_unique<EfaLikePlugin>(kubelet_.dir() / "efa.sock", pre_start, resource);
    REQUIRE(efa_->Register(kubelet_.socket_path()).ok());
    REQUIRE(kubelet_.WaitForStreaming(resource, true, kWait));
  }

  grpc::Status List(v1::ListPodResourcesResponse* response) {
    return ListPodResources(kubelet_.pod_resources_socket_path(), response);
  }

 private:
  static FakeKubelet::Options Options(const fs::path& kubelet_dir, bool kubelet_1_20,
                                      std::chrono::milliseconds endpoint_grace) {
    FakeKubelet::Options options = FakeKubelet::ForKubeletDir(kubelet_dir);
    options.kubelet_1_20 = kubelet_1_20;
    options.endpoint_stop_grace_period = endpoint_grace;
    return options;
  }

  TempDir dir_;
  FakeKubelet kubelet_;
  FakeAcceleratorPlugin gpus_;
  std::unique_ptr<EfaLikePlugin> efa_;
};

// What a hook saw, recorded on a gRPC thread and checked on the test's.
class Seen {
 public:
  void Add(std::string what) {
    absl::MutexLock lock(&mu_);
    seen_.push_back(std::move(what));
  }
  std::vector<std::string> get() const {
    absl::MutexLock lock(&mu_);
    return seen_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> seen_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

TEST_CASE("FakeKubelet serves the pod-resources socket beside the device-plugin dir",
          "[fake_kubelet][concurrency]") {
  const FakeKubelet::Options options = FakeKubelet::ForKubeletDir("/var/lib/kubelet");
  CHECK(options.device_plugin_dir == "/var/lib/kubelet/device-plugins");
  CHECK(options.pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock");
  CHECK_FALSE(options.kubelet_1_20);

  TempDir dir;
  FakeKubelet kubelet(FakeKubelet::ForKubeletDir(dir.path()));
  CHECK(kubelet.pod_resources_socket_path() == dir.path() / "pod-resources/kubelet.sock");
  REQUIRE(kubelet.Start().ok());
  CHECK(fs::is_socket(dir.path() / "pod-resources/kubelet.sock"));
  CHECK(fs::is_socket(dir.path() / "device-plugins/kubelet.sock"));
  v1::ListPodResourcesResponse response;
  REQUIRE(ListPodResources(kubelet.pod_resources_socket_path(), &response).ok());
  CHECK(response.pod_resources().empty());
  kubelet.Stop();
  CHECK_FALSE(fs::exists(dir.path() / "pod-resources/kubelet.sock"));

  // Without a pod-resources path nothing is served and it cannot be started.
  FakeKubelet plain(dir.path() / "device-plugins");
  CHECK(plain.pod_resources_socket_path().empty());
  REQUIRE(plain.Start().ok());
  CHECK(plain.StartPodResources().message() == "no pod-resources socket was configured");
}

TEST_CASE("FakeKubelet admits a container's resources one at a time in the given order",
          "[fake_kubelet][concurrency]") {
  Node node;
  const std::vector<std::string> gpus = node.gpu_ids();
  // What List says of the container being admitted while the EFA plugin's
  // GetPreferredAllocation and Allocate run.
  Seen seen;
  auto look = [&](const std::string& when, const std::string& pod) {
    return [&node, &seen, when, pod](const std::vector<std::string>&) {
      v1::ListPodResourcesResponse response;
      const grpc::Status status = node.List(&response);
      seen.Add(when + ": " + (status.ok() ? Listed(response, pod, "main") : "List failed"));
    };
  };

  SECTION("GPUs first: the EFA plugin sees the container's GPU in pod-resources") {
    node.efa().SetHooks(look("prefer", "gpu-first"), look("allocate", "gpu-first"), nullptr);
    auto admitted = node.kubelet().AdmitContainer("gpu-first", "default", "uid-1", "main",
                                                  {{kGpu, 1}, {kEfa, 4}});
    REQUIRE(admitted.ok());
    CHECK(admitted->start_status.ok());
    REQUIRE(admitted->allocations.size() == 2);
    CHECK(admitted->allocations[0].resource == kGpu);
    // The GPU plugin prefers the lowest PCI address.
    CHECK(admitted->allocations[0].device_ids == std::vector<std::string>{gpus[0]});
    CHECK(admitted->allocations[0].response.envs().at("NVIDIA_VISIBLE_DEVICES") == gpus[0]);
    CHECK(admitted->allocations[1].resource == kEfa);
    // The EFA-like plugin prefers the last available IDs: taken as given.
    CHECK(admitted->allocations[1].device_ids ==
          std::vector<std::string>{"efa7", "efa6", "efa5", "efa4"});
    CHECK(admitted->allocations[1].response.envs().at("EFA_DEVICES") == "efa7,efa6,efa5,efa4");
    CHECK(seen.get() ==
          std::vector<std::string>{"prefer: " + std::string(kGpu) + "=" + gpus[0] + "@0",
                                   "allocate: " + std::string(kGpu) + "=" + gpus[0] + "@0"});
  }

  SECTION("EFAs first: the EFA plugin sees the container without devices") {
    node.efa().SetHooks(look("prefer", "efa-first"), look("allocate", "efa-first"), nullptr);
    auto admitted = node.kubelet().AdmitContainer("efa-first", "default", "uid-2", "main",
                                                  {{kEfa, 2}, {kGpu, 2}});
    REQUIRE(admitted.ok());
    REQUIRE(admitted->allocations.size() == 2);
    CHECK(admitted->allocations[0].resource == kEfa);
    CHECK(admitted->allocations[0].device_ids == std::vector<std::string>{"efa7", "efa6"});
    CHECK(admitted->allocations[1].device_ids == std::vector<std::string>{gpus[0], gpus[1]});
    // Listed from the start, without devices: even the EFAs being allocated
    // appear only once Allocate has returned.
    CHECK(seen.get() == std::vector<std::string>{"prefer: ", "allocate: "});
  }

  // Afterwards List shows every resource, one entry per device with its NUMA
  // node (the shape of kubelets since 1.21).
  v1::ListPodResourcesResponse response;
  REQUIRE(node.List(&response).ok());
  REQUIRE(response.pod_resources_size() == 1);
  CHECK(response.pod_resources(0).namespace_() == "default");
  REQUIRE(response.pod_resources(0).containers_size() == 1);
  const auto& devices = response.pod_resources(0).containers(0).devices();
  CHECK(devices.size() == (response.pod_resources(0).name() == "gpu-first" ? 5 : 4));
  for (const auto& d : devices) {
    CHECK(d.device_ids_size() == 1);
    CHECK(d.topology().nodes_size() == 1);
  }
}

TEST_CASE("FakeKubelet asks the plugin's preference over the free devices and fills a shortfall",
          "[fake_kubelet][concurrency]") {
  Node node;
  Seen seen;
  node.efa().SetHooks(
      [&](const std::vector<std::string>& available) {
        std::string all;
        for (const auto& id : available) all += id + " ";
        seen.Add(all);
      },
      nullptr, nullptr);
  REQUIRE(node.kubelet().AdmitContainer("a", "ns", "uid-a", "main", {{kEfa, 2}}).ok());

  // Only one usable preferred ID (an unknown, a taken one, a duplicate): the
  // kubelet adds the first free IDs in sorted order.
  node.efa().SetPreference([](const std::vector<std::string>&, int) {
    return std::vector<std::string>{"nope", "efa7", "efa2", "efa2"};
  });
  auto admitted = node.kubelet().AdmitContainer("b", "ns", "uid-b", "main", {{kEfa, 3}});
  REQUIRE(admitted.ok());
  CHECK(admitted->allocations[0].device_ids == std::vector<std::string>{"efa2", "efa0", "efa1"});
  CHECK(node.kubelet().container_devices("uid-b", "main", kEfa) ==
        std::vector<std::string>{"efa2", "efa0", "efa1"});
  CHECK(seen.get() == std::vector<std::string>{"efa0 efa1 efa2 efa3 efa4 efa5 efa6 efa7 ",
                                               "efa0 efa1 efa2 efa3 efa4 efa5 "});
}

TEST_CASE("FakeKubelet writes the checkpoint once all of a container's resources are allocated",
          "[fake_kubelet][concurrency]") {
  Node node;
  const fs::path checkpoint = node.kubelet().checkpoint_path();
  CHECK(checkpoint == node.kubelet().dir() / "kubelet_internal_checkpoint");
  // Written on every device list already, with no entries.
  REQUIRE(fs::exists(checkpoint));
  const Json empty = ReadJson(checkpoint);
  CHECK(empty["Data"]["PodDeviceEntries"].is_null());
  CHECK(empty["Data"]["RegisteredDevices"][kEfa].size() == 8);

  Seen seen;
  node.efa().SetHooks(
      nullptr,
      [&](const std::vector<std::string>&) {
        for (const auto& entry : CheckpointEntries(checkpoint)) seen.Add(entry);
        seen.Add("end");
      },
      nullptr);
  auto admitted =
      node.kubelet().AdmitContainer("pod", "ns", "uid-1", "main", {{kGpu, 2}, {kEfa, 2}});
  REQUIRE(admitted.ok());
  // The GPUs were allocated before the EFA Allocate ran, but not checkpointed.
  CHECK(seen.get() == std::vector<std::string>{"end"});

  const Json doc = ReadJson(checkpoint);
  CHECK(doc["Checksum"].is_number_unsigned());
  const Json& entries = doc["Data"]["PodDeviceEntries"];
  REQUIRE(entries.size() == 2);
  CHECK(entries[0]["PodUID"] == "uid-1");
  CHECK(entries[0]["ContainerName"] == "main");
  CHECK(entries[0]["ResourceName"] == kGpu);
  const std::vector<std::string> gpus = node.gpu_ids();
  CHECK(entries[0]["DeviceIDs"] == Json::object({{"0", Json::array({gpus[0], gpus[1]})}}));
  CHECK(entries[1]["ResourceName"] == kEfa);
  CHECK(entries[1]["DeviceIDs"] == Json::object({{"1", Json::array({"efa7", "efa6"})}}));
  for (size_t i = 0; i < 2; ++i) {
    std::string bytes;
    REQUIRE(absl::Base64Unescape(entries[i]["AllocResp"].get<std::string>(), &bytes));
    v1beta1::ContainerAllocateResponse parsed;
    REQUIRE(parsed.ParseFromString(bytes));
    CHECK(parsed.SerializeAsString() == admitted->allocations[i].response.SerializeAsString());
  }
  CHECK(doc["Data"]["RegisteredDevices"][kGpu].size() == 8);
  CHECK(doc["Data"]["RegisteredDevices"][kEfa].size() == 8);
  // Written atomically: no temporary file is left behind.
  for (const auto& file : fs::directory_iterator(node.kubelet().dir())) {
    CHECK(file.path().filename().string().find("tmp") == std::string::npos);
  }
}

TEST_CASE("A device list arriving during admission checkpoints the half-admitted container",
          "[fake_kubelet][concurrency]") {
  // The kubelet rewrites the checkpoint on every ListAndWatch message
  // (genericDeviceUpdateCallback), whatever admission is in progress.
  Node node;
  const fs::path checkpoint = node.kubelet().checkpoint_path();
  const std::string spare = node.gpu_ids()[7];
  Seen seen;
  node.efa().SetHooks(
      nullptr,
      [&](const std::vector<std::string>&) {
        (void)node.gpus().SetHealthy(spare, false);
        const bool updated = node.kubelet().WaitForDevices(
            kGpu, [](const auto& d) { return d.size() == 8 && d[7].health() != "Healthy"; }, kWait);
        seen.Add(updated ? "updated" : "not updated");
        for (const auto& entry : CheckpointEntries(checkpoint)) seen.Add(entry);
      },
      nullptr);
  REQUIRE(node.kubelet().AdmitContainer("pod", "ns", "uid-1", "main", {{kGpu, 1}, {kEfa, 1}}).ok());
  CHECK(seen.get() == std::vector<std::string>{"updated", "uid-1/main/nvidia.com/gpu"});
  CHECK(CheckpointEntries(checkpoint) ==
        std::vector<std::string>{"uid-1/main/nvidia.com/gpu", "uid-1/main/vpc.amazonaws.com/efa"});
}

TEST_CASE("FakeKubelet rejects a container it cannot satisfy and keeps nothing of it",
          "[fake_kubelet][concurrency]") {
  Node node;
  const fs::path checkpoint = node.kubelet().checkpoint_path();

  SECTION("not enough devices") {
    auto admitted =
        node.kubelet().AdmitContainer("big", "ns", "uid-big", "main", {{kGpu, 2}, {kEfa, 9}});
    REQUIRE_FALSE(admitted.ok());
    CHECK(admitted.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK(admitted.status().message() ==
          "UnexpectedAdmissionError: Allocate failed due to requested number of devices "
          "unavailable for vpc.amazonaws.com/efa. Requested: 9, Available: 8, which is "
          "unexpected");
    // The GPU plugin did allocate, but the kubelet let the GPUs go.
    CHECK(node.gpus().allocations().size() == 1);
  }
  SECTION("the plugin's Allocate fails") {
    node.efa().FailAllocate(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no such EFA"));
    auto admitted =
        node.kubelet().AdmitContainer("big", "ns", "uid-big", "main", {{kGpu, 2}, {kEfa, 1}});
    REQUIRE_FALSE(admitted.ok());
    CHECK(admitted.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(admitted.status().message() ==
          "UnexpectedAdmissionError: Allocate failed due to rpc error: code = InvalidArgument "
          "desc = no such EFA, which is unexpected");
    node.efa().FailAllocate(grpc::Status::OK);
  }
  SECTION("an unregistered resource") {
    auto admitted = node.kubelet().AdmitContainer("big", "ns", "uid-big", "main",
                                                  {{kGpu, 2}, {"example.com/fpga", 1}});
    REQUIRE_FALSE(admitted.ok());
    CHECK(admitted.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(admitted.status().message() ==
          "UnexpectedAdmissionError: Allocate failed due to can't allocate unregistered device "
          "example.com/fpga, which is unexpected");
  }

  v1::ListPodResourcesResponse response;
  REQUIRE(node.List(&response).ok());
  CHECK(response.pod_resources().empty());
  CHECK(node.kubelet().container_devices("uid-big", "main", kGpu).empty());
  CHECK(CheckpointEntries(checkpoint).empty());
  // Every GPU and EFA is free again.
  auto all = node.kubelet().AdmitContainer("all", "ns", "uid-all", "main", {{kGpu, 8}, {kEfa, 8}});
  REQUIRE(all.ok());
  CHECK(all->allocations[0].device_ids == node.gpu_ids());
}

TEST_CASE("FakeKubelet checks its admission arguments", "[fake_kubelet][concurrency]") {
  Node node;
  auto status = [&](const std::string& uid, const std::string& container, const Requests& r) {
    auto admitted = node.kubelet().AdmitContainer("p", "ns", uid, container, r);
    return admitted.ok() ? std::string("OK") : std::string(admitted.status().message());
  };
  CHECK(status("", "main", {}) == "pod UID: empty");
  CHECK(status("u", "", {}) == "container name: empty");
  CHECK(status("u", "main", {{kGpu, -1}}) == "nvidia.com/gpu: negative device count -1");
  CHECK(status("u", "main", {{kGpu, 1}, {kGpu, 1}}) == "nvidia.com/gpu: requested twice");
  // A request for 0 devices is no request; the container is still admitted.
  auto admitted = node.kubelet().AdmitContainer("p", "ns", "u", "main", {{kGpu, 0}});
  REQUIRE(admitted.ok());
  CHECK(admitted->allocations.empty());
  CHECK(status("u", "main", {{kGpu, 1}}) == "pod u container \"main\" is already admitted");
  // A second container of the same pod is its own admission.
  CHECK(status("u", "sidecar", {{kEfa, 1}}) == "OK");
  v1::ListPodResourcesResponse response;
  REQUIRE(node.List(&response).ok());
  REQUIRE(response.pod_resources_size() == 1);
  CHECK(Listed(response, "p", "main") == "");
  CHECK(Listed(response, "p", "sidecar") == "vpc.amazonaws.com/efa=efa7@1");
}

TEST_CASE("FakeKubelet calls PreStartContainer after all of the container's resources",
          "[fake_kubelet][concurrency]") {
  Node node(/*efa_pre_start=*/true);
  Seen seen;
  node.efa().SetHooks(nullptr, nullptr, [&](const std::vector<std::string>&) {
    v1::ListPodResourcesResponse response;
    seen.Add(node.List(&response).ok() ? Listed(response, "pod", "main") : "List failed");
  });
  auto admitted =
      node.kubelet().AdmitContainer("pod", "ns", "uid-1", "main", {{kEfa, 2}, {kGpu, 1}});
  REQUIRE(admitted.ok());
  CHECK(admitted->start_status.ok());
  CHECK(node.efa().pre_starts() == std::vector<std::vector<std::string>>{{"efa7", "efa6"}});
  const std::string gpu = node.gpu_ids()[0];
  CHECK(seen.get() == std::vector<std::string>{"vpc.amazonaws.com/efa=efa7@1;"
                                               "vpc.amazonaws.com/efa=efa6@1;"
                                               "nvidia.com/gpu=" +
                                               gpu + "@0"});

  // A failing PreStartContainer leaves the container admitted, not started.
  node.efa().FailPreStart(grpc::Status(grpc::StatusCode::UNAVAILABLE, "busy"));
  admitted = node.kubelet().AdmitContainer("pod2", "ns", "uid-2", "main", {{kEfa, 1}});
  REQUIRE(admitted.ok());
  CHECK(admitted->start_status.code() == absl::StatusCode::kUnavailable);
  CHECK(admitted->start_status.message() ==
        "device plugin PreStartContainer rpc failed with err: rpc error: code = Unavailable "
        "desc = busy");
  CHECK(node.kubelet().container_devices("uid-2", "main", kEfa) ==
        std::vector<std::string>{"efa5"});
  node.efa().FailPreStart(grpc::Status::OK);
  CHECK(node.kubelet().StartContainer("uid-2", "main").ok());
  CHECK(node.efa().pre_starts().size() == 3);
  CHECK(node.kubelet().StartContainer("uid-2", "other").message() ==
        "pod uid-2 container \"other\" is not admitted");
}

TEST_CASE("FakeKubelet frees a deleted pod's devices", "[fake_kubelet][concurrency]") {
  Node node;
  REQUIRE(node.kubelet().AdmitContainer("pod", "ns", "uid-1", "main", {{kGpu, 8}}).ok());
  auto refused = node.kubelet().AdmitContainer("next", "ns", "uid-2", "main", {{kGpu, 1}});
  CHECK(refused.status().code() == absl::StatusCode::kResourceExhausted);

  REQUIRE(node.kubelet().RemovePod("uid-1").ok());
  CHECK(node.kubelet().container_devices("uid-1", "main", kGpu).empty());
  CHECK(CheckpointEntries(node.kubelet().checkpoint_path()).empty());
  v1::ListPodResourcesResponse response;
  REQUIRE(node.List(&response).ok());
  CHECK(response.pod_resources().empty());
  CHECK(node.kubelet().AdmitContainer("next", "ns", "uid-2", "main", {{kGpu, 1}}).ok());
  CHECK(node.kubelet().RemovePod("uid-1").message() == "pod uid-1 is not known");
}

TEST_CASE("FakeKubelet restores the allocations from the checkpoint when it restarts",
          "[fake_kubelet][concurrency]") {
  Node node;
  const std::vector<std::string> gpus = node.gpu_ids();
  REQUIRE(node.kubelet().AdmitContainer("pod", "ns", "uid-1", "main", {{kGpu, 2}, {kEfa, 1}}).ok());
  const fs::path old_socket = node.kubelet().pod_resources_socket_path();
  REQUIRE(node.kubelet().Restart().ok());
  CHECK(fs::is_socket(node.kubelet().pod_resources_socket_path()));

  // The allocations are back from the checkpoint at once, but List shows no
  // pod until the pods are synced from the API server.
  CHECK(node.kubelet().container_devices("uid-1", "main", kEfa) ==
        std::vector<std::string>{"efa7"});
  CHECK_FALSE(node.kubelet().pods_synced());
  v1::ListPodResourcesResponse response;
  REQUIRE(node.List(&response).ok());
  CHECK(response.pod_resources().empty());
  CHECK(node.kubelet().AdmitContainer("next", "ns", "uid-2", "main", {{kGpu, 1}}).status() ==
        absl::FailedPreconditionError("the kubelet restarted and has not synced its pods from "
                                      "the API server yet (SyncPods)"));
  node.kubelet().SyncPods();
  CHECK(node.kubelet().pods_synced());
  response.Clear();
  REQUIRE(node.List(&response).ok());
  CHECK(Listed(response, "pod", "main") == "nvidia.com/gpu=" + gpus[0] + "@0;nvidia.com/gpu=" +
                                               gpus[1] + "@0;vpc.amazonaws.com/efa=efa7@1");
  // Nothing is allocatable until the plugins are back; then the held devices
  // stay taken.
  auto refused = node.kubelet().AdmitContainer("next", "ns", "uid-2", "main", {{kGpu, 1}});
  CHECK(refused.status().message() ==
        "UnexpectedAdmissionError: Allocate failed due to requested number of devices "
        "unavailable for nvidia.com/gpu. Requested: 1, Available: 0, which is unexpected");
  node.gpus().Stop();
  REQUIRE(node.gpus().Start().ok());
  REQUIRE(node.kubelet().WaitForStreaming(kGpu, true, kWait));
  auto next = node.kubelet().AdmitContainer("next", "ns", "uid-2", "main", {{kGpu, 1}});
  REQUIRE(next.ok());
  CHECK(next->allocations[0].device_ids == std::vector<std::string>{gpus[2]});

  // What the kubelet restores is what the file holds: without it, nothing.
  fs::remove(node.kubelet().checkpoint_path());
  REQUIRE(node.kubelet().Restart().ok());
  CHECK(node.kubelet().container_devices("uid-1", "main", kGpu).empty());
  node.kubelet().SyncPods();
  response.Clear();
  REQUIRE(node.List(&response).ok());
  CHECK(Listed(response, "pod", "main") == "");
}

TEST_CASE("FakeKubelet's pod-resources server can be slow, rate limited or absent",
          "[fake_kubelet][concurrency]") {
  TempDir dir;
  FakeKubelet kubelet(FakeKubelet::ForKubeletDir(dir.path()));
  REQUIRE(kubelet.Start().ok());
  const fs::path socket = kubelet.pod_resources_socket_path();
  v1::ListPodResourcesResponse response;
  REQUIRE(ListPodResources(socket, &response).ok());
  CHECK(kubelet.pod_resources_calls() == 1);

  SECTION("slow") {
    kubelet.SetPodResourcesDelay(300ms);
    grpc::Status status = ListPodResources(socket, &response, 50ms);
    CHECK(status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
    kubelet.SetPodResourcesDelay(20ms);
    CHECK(ListPodResources(socket, &response).ok());
    // A call waiting out the delay ends when the server stops.
    kubelet.SetPodResourcesDelay(60s);
    const int calls = kubelet.pod_resources_calls();
    grpc::Status waiting;
    v1::ListPodResourcesResponse late;
    std::thread caller([&] { waiting = ListPodResources(socket, &late, 30s); });
    const bool arrived = kubelet.WaitForPodResourcesCalls(calls + 1, kWait);
    kubelet.StopPodResources();
    caller.join();
    REQUIRE(arrived);
    CHECK(waiting.error_code() == grpc::StatusCode::UNAVAILABLE);
    CHECK(waiting.error_message() == "kubelet is shutting down");
  }
  SECTION("rate limited") {
    kubelet.SetPodResourcesExhausted(true);
    grpc::Status status = ListPodResources(socket, &response);
    CHECK(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
    CHECK(status.error_message() == "rejected by rate limit");
    CHECK(kubelet.pod_resources_calls() == 2);
    kubelet.SetPodResourcesExhausted(false);
    CHECK(ListPodResources(socket, &response).ok());
  }
  SECTION("absent") {
    kubelet.StopPodResources();
    CHECK_FALSE(fs::exists(socket));
    grpc::Status status = ListPodResources(socket, &response);
    CHECK(status.error_code() == grpc::StatusCode::UNAVAILABLE);
    kubelet.StopPodResources();  // idempotent
    REQUIRE(kubelet.StartPodResources().ok());
    CHECK(kubelet.StartPodResources().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(ListPodResources(socket, &response).ok());
    // A restart serves it again even when it was stopped.
    kubelet.StopPodResources();
    REQUIRE(kubelet.Restart().ok());
    CHECK(ListPodResources(socket, &response).ok());
  }
}

TEST_CASE("FakeKubelet lists allocatable devices and leaves Get unimplemented",
          "[fake_kubelet][concurrency]") {
  Node node;
  REQUIRE(node.kubelet().AdmitContainer("pod", "ns", "uid-1", "main", {{kEfa, 1}}).ok());
  auto stub = v1::PodResourcesLister::NewStub(
      grpc::CreateChannel("unix:" + node.kubelet().pod_resources_socket_path().string(),
                          grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext context;
    v1::AllocatableResourcesResponse response;
    REQUIRE(stub->GetAllocatableResources(&context, {}, &response).ok());
    // Healthy devices, allocated or not, one entry per device.
    REQUIRE(response.devices_size() == 16);
    int efa = 0;
    for (const auto& d : response.devices()) {
      CHECK(d.device_ids_size() == 1);
      CHECK(d.topology().nodes_size() == 1);
      if (d.resource_name() == kEfa) ++efa;
    }
    CHECK(efa == 8);
  }
  {
    grpc::ClientContext context;
    v1::GetPodResourcesResponse response;
    v1::GetPodResourcesRequest request;
    request.set_pod_name("pod");
    request.set_pod_namespace("ns");
    const grpc::Status status = stub->Get(&context, request, &response);
    CHECK(status.error_code() == grpc::StatusCode::UNIMPLEMENTED);
    CHECK(status.error_message() == "PodResources API Get method disabled");
  }
}

TEST_CASE("FakeKubelet imitates kubelet 1.20's pod-resources and checkpoint shapes",
          "[fake_kubelet][concurrency]") {
  Node node(/*efa_pre_start=*/false, /*kubelet_1_20=*/true);
  REQUIRE(node.kubelet().AdmitContainer("pod", "ns", "uid-1", "main", {{kEfa, 2}, {kGpu, 2}}).ok());
  v1::ListPodResourcesResponse response;
  REQUIRE(node.List(&response).ok());
  const std::vector<std::string> gpus = node.gpu_ids();
  // One entry per resource and NUMA node.
  CHECK(Listed(response, "pod", "main") ==
        "vpc.amazonaws.com/efa=efa7,efa6@1;nvidia.com/gpu=" + gpus[0] + "," + gpus[1] + "@0");

  auto stub = v1::PodResourcesLister::NewStub(
      grpc::CreateChannel("unix:" + node.kubelet().pod_resources_socket_path().string(),
                          grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  v1::AllocatableResourcesResponse allocatable;
  const grpc::Status status = stub->GetAllocatableResources(&context, {}, &allocatable);
  CHECK(status.error_code() == grpc::StatusCode::UNIMPLEMENTED);
  CHECK(status.error_message() ==
        "unknown method GetAllocatableResources for service v1.PodResourcesLister");
}

TEST_CASE("FakeKubelet records devices without topology under -1, or 0 as kubelet 1.20",
          "[fake_kubelet][concurrency]") {
  const bool kubelet_1_20 = GENERATE(false, true);
  TempDir dir;
  FakeKubelet::Options options = FakeKubelet::ForKubeletDir(dir.path());
  options.kubelet_1_20 = kubelet_1_20;
  FakeKubelet kubelet(options);
  REQUIRE(kubelet.Start().ok());
  // g5: every GPU on numa_node -1, so none reports a NUMA node.
  FakeAcceleratorPlugin gpus(*efa::sim::FindMachine("g5.48xlarge"), AcceleratorKind::kNvidiaGpu,
                             kubelet.dir());
  REQUIRE(gpus.Start().ok());
  REQUIRE(kubelet.WaitForStreaming(kGpu, true, kWait));
  REQUIRE(kubelet.AdmitContainer("pod", "ns", "uid-1", "main", {{kGpu, 1}}).ok());

  const Json doc = ReadJson(kubelet.checkpoint_path());
  const std::string key = kubelet_1_20 ? "0" : "-1";
  CHECK(doc["Data"]["PodDeviceEntries"][0]["DeviceIDs"] ==
        Json::object({{key, Json::array({gpus.ids()[0]})}}));
  v1::ListPodResourcesResponse response;
  REQUIRE(ListPodResources(kubelet.pod_resources_socket_path(), &response).ok());
  CHECK(Listed(response, "pod", "main") ==
        std::string(kGpu) + "=" + gpus.ids()[0] + (kubelet_1_20 ? "@0" : ""));
}

TEST_CASE(
    "After a restart FakeKubelet lists no pod until SyncPods and writes the checkpoint at the "
    "first device list",
    "[fake_kubelet][concurrency]") {
  Node node(/*efa_pre_start=*/true);
  REQUIRE(node.kubelet().AdmitContainer("pod", "ns", "uid-1", "main", {{kGpu, 1}, {kEfa, 2}}).ok());
  const fs::path checkpoint = node.kubelet().checkpoint_path();
  const Json before = ReadJson(checkpoint);
  REQUIRE(before["Data"]["RegisteredDevices"][kEfa].size() == 8);

  REQUIRE(node.kubelet().Restart().ok());
  // Read back, not written: the file is as the old kubelet left it.
  CHECK(ReadJson(checkpoint) == before);
  CHECK(node.kubelet().container_devices("uid-1", "main", kEfa) ==
        std::vector<std::string>{"efa7", "efa6"});
  v1::ListPodResourcesResponse response;
  REQUIRE(node.List(&response).ok());
  CHECK(response.pod_resources().empty());
  CHECK(node.kubelet().StartContainer("uid-1", "main").code() ==
        absl::StatusCode::kFailedPrecondition);

  // The first plugin back writes it: the allocations as read, and no device
  // of a plugin that has not registered again.
  node.gpus().Stop();
  REQUIRE(node.gpus().Start().ok());
  REQUIRE(node.kubelet().WaitForListAndWatchMessages(kGpu, 2, kWait));
  const Json after = ReadJson(checkpoint);
  CHECK(after["Data"]["PodDeviceEntries"] == before["Data"]["PodDeviceEntries"]);
  CHECK(after["Data"]["RegisteredDevices"][kGpu].size() == 8);
  CHECK(after["Data"]["RegisteredDevices"][kEfa].empty());
  REQUIRE(node.List(&response).ok());
  CHECK(response.pod_resources().empty());

  node.kubelet().SyncPods();
  response.Clear();
  REQUIRE(node.List(&response).ok());
  CHECK(Listed(response, "pod", "main") == "nvidia.com/gpu=" + node.gpu_ids()[0] +
                                               "@0;vpc.amazonaws.com/efa=efa7@1;" +
                                               "vpc.amazonaws.com/efa=efa6@1");
  // Started again by the synced kubelet with the same IDs, once the EFA
  // plugin is back (a stopped endpoint has no options: no call before).
  CHECK(node.kubelet().StartContainer("uid-1", "main").ok());
  CHECK(node.efa().pre_starts().size() == 1);
  node.ReRegisterEfa(/*pre_start=*/true);
  CHECK(node.kubelet().StartContainer("uid-1", "main").ok());
  CHECK(node.efa().pre_starts() == std::vector<std::vector<std::string>>{{"efa7", "efa6"}});
}

TEST_CASE("A container restart calls PreStartContainer again with the same IDs and no Allocate",
          "[fake_kubelet][concurrency]") {
  Node node(/*efa_pre_start=*/true);
  Seen seen;
  node.efa().SetHooks([&](const auto&) { seen.Add("prefer"); },
                      [&](const auto& ids) { seen.Add("allocate " + ids[0] + "," + ids[1]); },
                      [&](const auto& ids) { seen.Add("pre-start " + ids[0] + "," + ids[1]); });
  REQUIRE(node.kubelet().AdmitContainer("pod", "ns", "uid-1", "main", {{kEfa, 2}}).ok());
  CHECK(seen.get() ==
        std::vector<std::string>{"prefer", "allocate efa7,efa6", "pre-start efa7,efa6"});
  const auto gpu_allocations = node.gpus().allocations().size();
  REQUIRE(node.kubelet().StartContainer("uid-1", "main").ok());
  REQUIRE(node.kubelet().StartContainer("uid-1", "main").ok());
  CHECK(seen.get() == std::vector<std::string>{"prefer", "allocate efa7,efa6",
                                               "pre-start efa7,efa6", "pre-start efa7,efa6",
                                               "pre-start efa7,efa6"});
  CHECK(node.gpus().allocations().size() == gpu_allocations);

  // Admitted but not started (a regular container waiting for init
  // containers): Allocate only; the first StartContainer calls
  // PreStartContainer.
  auto waiting = node.kubelet().AdmitContainer("pod2", "ns", "uid-2", "main", {{kEfa, 2}},
                                               FakeKubelet::ContainerOptions{.start = false});
  REQUIRE(waiting.ok());
  CHECK(node.efa().pre_starts().size() == 3);
  REQUIRE(node.kubelet().StartContainer("uid-2", "main").ok());
  CHECK(node.efa().pre_starts().back() == std::vector<std::string>{"efa5", "efa4"});
}

TEST_CASE("A container whose devices the checkpoint lost is allocated again when it starts",
          "[fake_kubelet][concurrency]") {
  Node node(/*efa_pre_start=*/true);
  REQUIRE(node.kubelet().AdmitContainer("pod", "ns", "uid-1", "main", {{kGpu, 1}}).ok());
  REQUIRE(node.kubelet().AdmitContainer("pod", "ns", "uid-1", "efa", {{kEfa, 1}}).ok());
  fs::remove(node.kubelet().checkpoint_path());
  REQUIRE(node.kubelet().Restart().ok());
  node.gpus().Stop();
  REQUIRE(node.gpus().Start().ok());
  // Allocate goes to an open endpoint only: Register returning does not
  // mean the stream is open yet (a loaded machine showed it).
  REQUIRE(node.kubelet().WaitForStreaming(kGpu, true, kWait));
  node.ReRegisterEfa(/*pre_start=*/true);
  node.kubelet().SyncPods();
  // The GPU plugin asks for no PreStartContainer: Allocate again.
  const auto gpu_allocations = node.gpus().allocations().size();
  REQUIRE(node.kubelet().StartContainer("uid-1", "main").ok());
  CHECK(node.gpus().allocations().size() == gpu_allocations + 1);
  CHECK(node.kubelet().container_devices("uid-1", "main", kGpu).size() == 1);
  CHECK(CheckpointEntries(node.kubelet().checkpoint_path()) ==
        std::vector<std::string>{"uid-1/main/nvidia.com/gpu"});
  // The EFA plugin does: the start fails as the kubelet's does.
  CHECK(node.kubelet().StartContainer("uid-1", "efa") ==
        absl::FailedPreconditionError(
            "no devices found allocated in local cache for pod uid-1, container efa, resource "
            "vpc.amazonaws.com/efa"));
}

TEST_CASE(
    "A plugin that registers another resource name leaves the old one's containers their "
    "devices; their starts fail as the kubelet's",
    "[fake_kubelet][concurrency]") {
  constexpr char kShared[] = "vpc.amazonaws.com/efa.shared";
  const bool grace_over = GENERATE(false, true);
  CAPTURE(grace_over);
  Node node(/*efa_pre_start=*/true, /*kubelet_1_20=*/false,
            grace_over ? std::chrono::milliseconds(0) : std::chrono::minutes(5));
  REQUIRE(node.kubelet().AdmitContainer("pod", "ns", "uid-1", "main", {{kEfa, 2}}).ok());
  // The plugin restarts serving the shared name, on the same socket.
  node.ReRegisterEfa(/*pre_start=*/true, kShared);
  CHECK_FALSE(node.kubelet().streaming(kEfa));
  REQUIRE(node.kubelet().AdmitContainer("pod2", "ns", "uid-2", "main", {{kShared, 1}}).ok());
  const auto pre_starts = node.efa().pre_starts().size();

  // The old name's allocation stays in podDevices and the checkpoint.
  CHECK(node.kubelet().container_devices("uid-1", "main", kEfa).size() == 2);
  CHECK(CheckpointEntries(node.kubelet().checkpoint_path()) ==
        std::vector<std::string>{"uid-1/main/" + std::string(kEfa),
                                 "uid-2/main/" + std::string(kShared)});
  const Json registered = ReadJson(node.kubelet().checkpoint_path())["Data"]["RegisteredDevices"];
  CHECK(registered.contains(kShared));
  const absl::Status start = node.kubelet().StartContainer("uid-1", "main");
  const auto admit = node.kubelet().AdmitContainer("pod3", "ns", "uid-3", "main", {{kEfa, 1}});
  if (grace_over) {
    // GetCapacity dropped the stopped endpoint and its devices.
    CHECK_FALSE(registered.contains(kEfa));
    CHECK(start ==
          absl::FailedPreconditionError("endpoint not found in cache for a registered resource: "
                                        "vpc.amazonaws.com/efa"));
    CHECK(admit.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK_THAT(std::string(admit.status().message()),
               Catch::Contains("can't allocate unregistered device vpc.amazonaws.com/efa"));
  } else {
    // A stopped endpoint: no healthy device, and PreStartContainer refused
    // without reaching the plugin now on its socket.
    CHECK(registered[kEfa] == Json::array());
    CHECK_THAT(std::string(start.message()),
               Catch::Contains("device plugin PreStartContainer rpc failed with err: endpoint") &&
                   Catch::Contains("has been stopped"));
    CHECK(admit.status().code() == absl::StatusCode::kResourceExhausted);
  }
  CHECK(node.efa().pre_starts().size() == pre_starts);
}

TEST_CASE("A deleted pod leaves List at once and the checkpoint at the kubelet's next write",
          "[fake_kubelet][concurrency]") {
  Node node;
  const fs::path checkpoint = node.kubelet().checkpoint_path();
  REQUIRE(node.kubelet().AdmitContainer("a", "ns", "uid-a", "main", {{kEfa, 8}}).ok());
  REQUIRE(node.kubelet().RemovePod("uid-a", FakeKubelet::CheckpointWrite::kAsKubelet).ok());
  CHECK(CheckpointEntries(checkpoint) ==
        std::vector<std::string>{"uid-a/main/" + std::string(kEfa)});
  // Still allocated: nothing has run UpdateAllocatedDevices yet.
  CHECK(node.kubelet().container_devices("uid-a", "main", kEfa).size() == 8);

  SECTION("a List drops the allocation; the file keeps it until the next write") {
    v1::ListPodResourcesResponse response;
    REQUIRE(node.List(&response).ok());
    CHECK(response.pod_resources().empty());
    CHECK(node.kubelet().container_devices("uid-a", "main", kEfa).empty());
    CHECK(CheckpointEntries(checkpoint) ==
          std::vector<std::string>{"uid-a/main/" + std::string(kEfa)});
    REQUIRE(node.kubelet().AdmitContainer("b", "ns", "uid-b", "main", {}).ok());
    CHECK(CheckpointEntries(checkpoint).empty());
  }
  SECTION("a kubelet restarted after a List dropped it reads it back, and drops it at sync") {
    // The file kept it (List writes nothing); the restarted device manager
    // restores it from there and drops it as no active pod's.
    v1::ListPodResourcesResponse response;
    REQUIRE(node.List(&response).ok());
    REQUIRE(node.kubelet().Restart().ok());
    CHECK(node.kubelet().container_devices("uid-a", "main", kEfa).size() == 8);
    node.kubelet().SyncPods();
    CHECK(node.kubelet().container_devices("uid-a", "main", kEfa).empty());
    CHECK(CheckpointEntries(checkpoint).empty());
  }
  SECTION("an admission drops it before it allocates") {
    auto admitted = node.kubelet().AdmitContainer("b", "ns", "uid-b", "main", {{kEfa, 8}});
    REQUIRE(admitted.ok());
    CHECK(CheckpointEntries(checkpoint) ==
          std::vector<std::string>{"uid-b/main/" + std::string(kEfa)});
  }
  SECTION("not while a restarted kubelet's sources are not ready") {
    REQUIRE(node.kubelet().Restart().ok());
    REQUIRE(node.kubelet().AdmitContainer("c", "ns", "uid-c", "main", {{kGpu, 1}}).ok() == false);
    REQUIRE(node.kubelet().RemovePod("uid-a").code() == absl::StatusCode::kNotFound);
    v1::ListPodResourcesResponse response;
    REQUIRE(node.List(&response).ok());
    CHECK(node.kubelet().container_devices("uid-a", "main", kEfa).size() == 8);
    node.kubelet().SyncPods();
    CHECK(node.kubelet().container_devices("uid-a", "main", kEfa).empty());
    CHECK(CheckpointEntries(checkpoint).empty());
  }
}

TEST_CASE("A pod removed while the kubelet restarts keeps its devices until the pods are synced",
          "[fake_kubelet][concurrency]") {
  Node node;
  REQUIRE(node.kubelet().AdmitContainer("a", "ns", "uid-a", "main", {{kEfa, 2}}).ok());
  REQUIRE(node.kubelet().AdmitContainer("b", "ns", "uid-b", "main", {{kEfa, 2}}).ok());
  REQUIRE(node.kubelet().Restart().ok());
  REQUIRE(node.kubelet().RemovePod("uid-a").ok());
  CHECK(CheckpointEntries(node.kubelet().checkpoint_path()).size() == 2);
  node.kubelet().SyncPods();
  CHECK(CheckpointEntries(node.kubelet().checkpoint_path()) ==
        std::vector<std::string>{"uid-b/main/" + std::string(kEfa)});
  v1::ListPodResourcesResponse response;
  REQUIRE(node.List(&response).ok());
  REQUIRE(response.pod_resources_size() == 1);
  CHECK(response.pod_resources(0).name() == "b");
}

TEST_CASE(
    "An init container's devices are in the checkpoint, not in List, and go to the pod's "
    "regular container first",
    "[fake_kubelet][concurrency]") {
  Node node;
  Seen seen;
  node.efa().SetHooks(
      [&](const auto& available) { seen.Add("prefer from " + std::to_string(available.size())); },
      nullptr, nullptr);
  const FakeKubelet::ContainerOptions init{.init = true};
  auto first = node.kubelet().AdmitContainer("pod", "ns", "uid-1", "init", {{kEfa, 2}}, init);
  REQUIRE(first.ok());
  CHECK(first->allocations[0].device_ids == std::vector<std::string>{"efa7", "efa6"});
  v1::ListPodResourcesResponse response;
  REQUIRE(node.List(&response).ok());
  REQUIRE(response.pod_resources_size() == 1);
  CHECK(response.pod_resources(0).containers().empty());
  CHECK(CheckpointEntries(node.kubelet().checkpoint_path()) ==
        std::vector<std::string>{"uid-1/init/" + std::string(kEfa)});

  // The regular container asks for 3: the init container's 2 (no question to
  // the plugin for them), then one more with those 2 as must-include.
  node.efa().SetPreference([](const std::vector<std::string>&, int) {
    return std::vector<std::string>{"efa7", "efa6", "efa0"};
  });
  auto main = node.kubelet().AdmitContainer("pod", "ns", "uid-1", "main", {{kEfa, 3}});
  REQUIRE(main.ok());
  CHECK(main->allocations[0].device_ids == std::vector<std::string>{"efa6", "efa7", "efa0"});
  // Offered: the 6 free ones and the 2 reused.
  CHECK(seen.get() == std::vector<std::string>{"prefer from 8", "prefer from 8"});
  response.Clear();
  REQUIRE(node.List(&response).ok());
  CHECK(Listed(response, "pod", "main") ==
        "vpc.amazonaws.com/efa=efa0@0;vpc.amazonaws.com/efa=efa6@1;vpc.amazonaws.com/efa=efa7@1");
  // A second regular container finds nothing left to reuse: a free one (the
  // preference names none that is free).
  auto other = node.kubelet().AdmitContainer("pod", "ns", "uid-1", "other", {{kEfa, 1}});
  REQUIRE(other.ok());
  CHECK(other->allocations[0].device_ids == std::vector<std::string>{"efa1"});
}

namespace {

// The container's dynamic_resources as List shows them, in text form;
// "absent" when the pod or container is not listed.
std::string ListedClaims(const v1::ListPodResourcesResponse& response, const std::string& pod,
                         const std::string& container) {
  const v1::ContainerResources* c = FindListed(response, pod, container);
  if (c == nullptr) return "absent";
  std::string out;
  for (const auto& r : c->dynamic_resources()) out += "{" + r.ShortDebugString() + "}";
  return out;
}

}  // namespace

TEST_CASE("FakeKubelet lists the ResourceClaims each container uses, as the kubelet does",
          "[fake_kubelet][dra]") {
  Node node;
  // A node in the middle of a move: a pod holding EFAs by the device plugin,
  // a pod holding EFAs through a claim of a driver that names its devices,
  // a pod of DRANET (which names none) and a GPU claim of two devices.
  auto old_pod = node.kubelet().AdmitContainer("old", "default", "uid-old", "main", {{kEfa, 2}});
  REQUIRE(old_pod.ok());
  using Claim = FakeKubelet::PreparedClaim;
  const Claim efas{
      "efas",
      "ml",
      {{"dra.net", {{"node-a", "pci-0000-10-1b-0", {}}, {"node-a", "pci-0000-20-1b-0", {}}}}}};
  REQUIRE(node.kubelet().PrepareClaim("new", "ml", "uid-new", efas, {"main"}).ok());
  const Claim dranet{"efa-dranet", "ml", {{"dra.net", {}}}};
  REQUIRE(node.kubelet().PrepareClaim("dranet", "ml", "uid-dranet", dranet, {"main"}).ok());
  const Claim gpus{"gpus",
                   "ml",
                   {{"gpu.nvidia.com",
                     {{"node-a", "gpu-0", {"k8s.gpu.nvidia.com/device=gpu-0"}},
                      {"node-a", "gpu-1", {"k8s.gpu.nvidia.com/device=gpu-1"}}}}}};
  // The second pod of the shared claim is only referenced.
  REQUIRE(node.kubelet().PrepareClaim("new", "ml", "uid-new", gpus, {"main", "sidecar"}).ok());

  v1::ListPodResourcesResponse response;
  REQUIRE(node.List(&response).ok());
  CHECK(ListedClaims(response, "old", "main").empty());
  CHECK(Listed(response, "old", "main").starts_with(std::string(kEfa) + "="));
  const std::string dra_efas =
      "{claim_name: \"efas\" claim_namespace: \"ml\" claim_resources { driver_name: \"dra.net\" "
      "pool_name: \"node-a\" device_name: \"pci-0000-10-1b-0\" } claim_resources { driver_name: "
      "\"dra.net\" pool_name: \"node-a\" device_name: \"pci-0000-20-1b-0\" }}";
  // The second GPU's entry carries the first's CDI device too, as the
  // kubelet's GetDynamicResources fills it.
  const std::string dra_gpus =
      "{claim_name: \"gpus\" claim_namespace: \"ml\" claim_resources { cdi_devices { name: "
      "\"k8s.gpu.nvidia.com/device=gpu-0\" } driver_name: \"gpu.nvidia.com\" pool_name: "
      "\"node-a\" device_name: \"gpu-0\" } claim_resources { cdi_devices { name: "
      "\"k8s.gpu.nvidia.com/device=gpu-0\" } cdi_devices { name: "
      "\"k8s.gpu.nvidia.com/device=gpu-1\" } driver_name: \"gpu.nvidia.com\" pool_name: "
      "\"node-a\" device_name: \"gpu-1\" }}";
  CHECK(ListedClaims(response, "new", "main") == dra_efas + dra_gpus);
  CHECK(ListedClaims(response, "new", "sidecar") == dra_gpus);
  CHECK(ListedClaims(response, "dranet", "main") ==
        "{claim_name: \"efa-dranet\" claim_namespace: \"ml\"}");

  // A pod referencing a claim of another namespace is refused.
  CHECK(node.kubelet().PrepareClaim("x", "default", "uid-x", efas, {"main"}).code() ==
        absl::StatusCode::kInvalidArgument);
  // Removing the pod unprepares its claims: the DRANET pod's claim is gone.
  REQUIRE(node.kubelet().RemovePod("uid-dranet").ok());
  REQUIRE(node.List(&response).ok());
  CHECK(ListedClaims(response, "dranet", "main") == "absent");
  CHECK(ListedClaims(response, "new", "main") == dra_efas + dra_gpus);
}

TEST_CASE("Kubelet 1.20 lists no ResourceClaims", "[fake_kubelet][dra]") {
  Node node(false, /*kubelet_1_20=*/true);
  const FakeKubelet::PreparedClaim claim{"efas", "ml", {{"dra.net", {{"node-a", "pci-0", {}}}}}};
  REQUIRE(node.kubelet().PrepareClaim("new", "ml", "uid-new", claim, {"main"}).ok());
  v1::ListPodResourcesResponse response;
  REQUIRE(node.List(&response).ok());
  CHECK(ListedClaims(response, "new", "main").empty());
}
