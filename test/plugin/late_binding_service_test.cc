// The service's late-binding answers, without a daemon: the options, the
// CDI-only Allocate answer and PreStartContainer handing the IDs over.
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <map>

#include "absl/synchronization/mutex.h"
#include "plugin/alignment/cdi_spec.h"
#include "plugin/device_plugin_service.h"
#include "test/sim/sim_root.h"
#include "topology/efa_discovery.h"

namespace fs = std::filesystem;
using namespace efa::plugin;

namespace {

struct LatePlugin {
  explicit LatePlugin(const efa::sim::SimRoot& sim, CdiHandover handover = CdiHandover::kBoth)
      : service(DevicePluginService::Options{true}) {
    service.SetDevices(efa::topology::DiscoverEfaDevices(sim.roots()).devices);
    service.SetLateBinding(
        [this](const efa::topology::DeviceTable& table, const std::vector<std::string>& ids) {
          absl::MutexLock lock(&mu);
          calls.push_back(ids);
          tables.push_back(table.devices.size());
          return result;
        },
        handover);
    const fs::path socket = sim.path() / "plugin.sock";
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket.string(), grpc::InsecureServerCredentials());
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    stub = v1beta1::DevicePlugin::NewStub(
        grpc::CreateChannel("unix:" + socket.string(), grpc::InsecureChannelCredentials()));
  }
  ~LatePlugin() {
    service.Shutdown();
    server->Shutdown();
  }
  grpc::Status Allocate(const std::vector<std::string>& ids, v1beta1::AllocateResponse* response) {
    v1beta1::AllocateRequest request;
    auto* c = request.add_container_requests();
    for (const auto& id : ids) c->add_devices_ids(id);
    grpc::ClientContext context;
    return stub->Allocate(&context, request, response);
  }
  grpc::Status PreStart(const std::vector<std::string>& ids) {
    v1beta1::PreStartContainerRequest request;
    for (const auto& id : ids) request.add_devices_ids(id);
    v1beta1::PreStartContainerResponse response;
    grpc::ClientContext context;
    return stub->PreStartContainer(&context, request, &response);
  }

  DevicePluginService service;
  // What the binder answers, and what it was given (on gRPC threads).
  absl::Mutex mu;
  absl::Status result ABSL_GUARDED_BY(mu);
  std::vector<std::vector<std::string>> calls ABSL_GUARDED_BY(mu);
  std::vector<size_t> tables ABSL_GUARDED_BY(mu);
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub;
};

}  // namespace

TEST_CASE("Late binding asks for PreStartContainer and answers Allocate with a CDI device only",
          "[late-binding][concurrency]") {
  efa::sim::SimRoot sim("p4d.24xlarge");
  LatePlugin plugin(sim);
  CHECK(plugin.service.PluginOptions().pre_start_required());
  CHECK(plugin.service.PluginOptions().get_preferred_allocation_available());
  DevicePluginService best_effort(DevicePluginService::Options{true});
  CHECK_FALSE(best_effort.PluginOptions().pre_start_required());

  v1beta1::AllocateResponse response;
  REQUIRE(plugin.Allocate({"rdmap32s27", "rdmap16s27"}, &response).ok());
  REQUIRE(response.container_responses_size() == 1);
  const auto& c = response.container_responses(0);
  REQUIRE(c.cdi_devices_size() == 1);
  const std::string device = "vpc.amazonaws.com/efa=" + ClaimName({"rdmap16s27", "rdmap32s27"});
  CHECK(c.cdi_devices(0).name() == device);
  // By default also as an annotation, for kubelets before 1.28.
  CHECK(
      std::map<std::string, std::string>(c.annotations().begin(), c.annotations().end()) ==
      std::map<std::string, std::string>{
          {"cdi.k8s.io/vpc.amazonaws.com-efa_" + ClaimName({"rdmap16s27", "rdmap32s27"}), device}});
  CHECK(c.devices_size() == 0);
  CHECK(c.envs_size() == 0);
  CHECK(c.mounts_size() == 0);
  absl::MutexLock lock(&plugin.mu);
  CHECK(plugin.calls.empty());  // nothing is bound before PreStartContainer
}

TEST_CASE("Late-binding Allocate refuses bad IDs as best effort does",
          "[late-binding][concurrency]") {
  efa::sim::SimRoot sim("p4d.24xlarge");
  fs::remove(sim.path() / "dev/infiniband/uverbs1");  // rdmap32s27 unhealthy
  LatePlugin plugin(sim);
  struct Case {
    std::vector<std::string> ids;
    grpc::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"rdmap16s27", "nope"},
       grpc::StatusCode::INVALID_ARGUMENT,
       "unknown device \"nope\": not an EFA of this node"},
      {{"rdmap16s27", "rdmap16s27"},
       grpc::StatusCode::INVALID_ARGUMENT,
       "device \"rdmap16s27\" requested twice"},
      {{"rdmap32s27"},
       grpc::StatusCode::FAILED_PRECONDITION,
       "device \"rdmap32s27\" is unhealthy: " + (sim.path() / "dev/infiniband/uverbs1").string() +
           ": No such file or directory"},
      {{}, grpc::StatusCode::INVALID_ARGUMENT, "the container request names no devices"},
  };
  for (const Case& c : cases) {
    INFO(c.message);
    v1beta1::AllocateResponse response;
    grpc::Status status = plugin.Allocate(c.ids, &response);
    CHECK(status.error_code() == c.code);
    CHECK(status.error_message() == c.message);
    CHECK(response.container_responses_size() == 0);
  }
}

TEST_CASE("Late-binding PreStartContainer hands the IDs to the binder and returns its error",
          "[late-binding][concurrency]") {
  efa::sim::SimRoot sim("p4d.24xlarge");
  LatePlugin plugin(sim);
  CHECK(plugin.PreStart({"rdmap16s27", "rdmap32s27"}).ok());
  {
    absl::MutexLock lock(&plugin.mu);
    REQUIRE(plugin.calls.size() == 1);
    CHECK(plugin.calls[0] == std::vector<std::string>{"rdmap16s27", "rdmap32s27"});
    CHECK(plugin.tables[0] == 4);
    plugin.result = absl::FailedPreconditionError("cannot bind claim-x");
  }
  grpc::Status status = plugin.PreStart({"rdmap16s27"});
  CHECK(status.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(status.error_message() == "cannot bind claim-x");
}

TEST_CASE("Late-binding Allocate names the CDI device in the field, the annotation or both",
          "[late-binding][concurrency]") {
  efa::sim::SimRoot sim("p4d.24xlarge");
  const std::string claim = ClaimName({"rdmap16s27", "rdmap32s27"});
  const std::string device = "vpc.amazonaws.com/efa=" + claim;
  const std::string key = "cdi.k8s.io/vpc.amazonaws.com-efa_" + claim;
  struct Case {
    CdiHandover handover;
    std::vector<std::string> cdi_devices;
    std::map<std::string, std::string> annotations;
  };
  const std::vector<Case> cases = {
      {CdiHandover::kBoth, {device}, {{key, device}}},
      {CdiHandover::kCdiDevices, {device}, {}},
      {CdiHandover::kAnnotation, {}, {{key, device}}},
  };
  for (const Case& want : cases) {
    INFO("handover " << static_cast<int>(want.handover));
    LatePlugin plugin(sim, want.handover);
    v1beta1::AllocateResponse response;
    REQUIRE(plugin.Allocate({"rdmap32s27", "rdmap16s27"}, &response).ok());
    REQUIRE(response.container_responses_size() == 1);
    const auto& c = response.container_responses(0);
    std::vector<std::string> cdi_devices;
    for (const auto& d : c.cdi_devices()) cdi_devices.push_back(d.name());
    CHECK(cdi_devices == want.cdi_devices);
    CHECK(std::map<std::string, std::string>(c.annotations().begin(), c.annotations().end()) ==
          want.annotations);
    CHECK(c.devices_size() == 0);
    CHECK(c.envs_size() == 0);
    CHECK(c.mounts_size() == 0);
    // Bad IDs are refused in every mode.
    response.Clear();
    CHECK(plugin.Allocate({"nope"}, &response).error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  }
}
