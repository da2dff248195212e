#include "plugin/device_plugin_service.h"

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "test/sim/sim_root.h"
#include "topology/efa_discovery.h"
#include "topology/hwloc_loader.h"

namespace fs = std::filesystem;
using namespace efa::plugin;
using efa::sim::SimRoot;

namespace {

// The service on a real unix socket, with a client stub.
struct ServedPlugin {
  explicit ServedPlugin(const SimRoot& sim, bool report_numa = true)
      : service(DevicePluginService::Options{report_numa}) {
    service.SetDevices(efa::topology::DiscoverEfaDevices(sim.roots()).devices);
    socket = sim.path() / "plugin.sock";
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket.string(), grpc::InsecureServerCredentials());
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    stub = v1beta1::DevicePlugin::NewStub(
        grpc::CreateChannel("unix:" + socket.string(), grpc::InsecureChannelCredentials()));
  }
  ~ServedPlugin() {
    service.Shutdown();
    server->Shutdown();
  }
  grpc::Status Allocate(std::vector<std::vector<std::string>> containers,
                        v1beta1::AllocateResponse* response) {
    v1beta1::AllocateRequest request;
    for (const auto& ids : containers) {
      auto* c = request.add_container_requests();
      for (const auto& id : ids) c->add_devices_ids(id);
    }
    grpc::ClientContext context;
    return stub->Allocate(&context, request, response);
  }
  std::vector<std::string> Preferred(std::vector<std::string> available,
                                     std::vector<std::string> must, int size) {
    v1beta1::PreferredAllocationRequest request;
    auto* c = request.add_container_requests();
    for (const auto& id : available) c->add_available_deviceids(id);
    for (const auto& id : must) c->add_must_include_deviceids(id);
    c->set_allocation_size(size);
    v1beta1::PreferredAllocationResponse response;
    grpc::ClientContext context;
    REQUIRE(stub->GetPreferredAllocation(&context, request, &response).ok());
    REQUIRE(response.container_responses_size() == 1);
    auto& ids = response.container_responses(0).deviceids();
    return {ids.begin(), ids.end()};
  }

  DevicePluginService service;
  fs::path socket;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub;
};

}  // namespace

TEST_CASE("Allocate gives exactly the requested uverbs nodes and names them in the env",
          "[plugin][concurrency]") {
  SimRoot sim("p5.48xlarge");
  ServedPlugin plugin(sim);
  v1beta1::AllocateResponse response;
  REQUIRE(plugin.Allocate({{"rdmap82s0", "rdmap79s0"}}, &response).ok());
  REQUIRE(response.container_responses_size() == 1);
  const auto& c = response.container_responses(0);
  REQUIRE(c.devices_size() == 2);
  const std::string dev = (sim.path() / "dev/infiniband").string();
  CHECK(c.devices(0).container_path() == "/dev/infiniband/uverbs0");
  CHECK(c.devices(0).host_path() == dev + "/uverbs0");
  CHECK(c.devices(0).permissions() == "rw");
  CHECK(c.devices(1).container_path() == "/dev/infiniband/uverbs3");
  CHECK(c.devices(1).host_path() == dev + "/uverbs3");
  CHECK(c.envs().size() == 2);
  CHECK(c.envs().at("EFA_DEVICES") == "rdmap79s0,rdmap82s0");
  CHECK(c.envs().at("EFA_PCI_ADDRESSES") == "0000:4f:00.0,0000:52:00.0");
  CHECK(c.mounts_size() == 0);
  CHECK(c.cdi_devices_size() == 0);
}

TEST_CASE("Allocate answers every container of a request", "[plugin][concurrency]") {
  SimRoot sim("p4d.24xlarge");
  ServedPlugin plugin(sim);
  v1beta1::AllocateResponse response;
  REQUIRE(plugin.Allocate({{"rdmap16s27"}, {"rdmap160s27"}}, &response).ok());
  REQUIRE(response.container_responses_size() == 2);
  CHECK(response.container_responses(0).devices(0).container_path() == "/dev/infiniband/uverbs0");
  CHECK(response.container_responses(1).devices(0).container_path() == "/dev/infiniband/uverbs3");
}

TEST_CASE("Allocate rejects bad IDs naming them, and keeps serving", "[plugin][concurrency]") {
  SimRoot sim("p4d.24xlarge");
  fs::remove(sim.path() / "dev/infiniband/uverbs1");  // rdmap32s27 unhealthy
  ServedPlugin plugin(sim);
  struct Case {
    std::vector<std::vector<std::string>> containers;
    grpc::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"rdmap16s27", "nope"}},
       grpc::StatusCode::INVALID_ARGUMENT,
       "unknown device \"nope\": not an EFA of this node"},
      {{{"rdmap16s27", "rdmap16s27"}},
       grpc::StatusCode::INVALID_ARGUMENT,
       "device \"rdmap16s27\" requested twice"},
      {{{"rdmap32s27"}},
       grpc::StatusCode::FAILED_PRECONDITION,
       "device \"rdmap32s27\" is unhealthy: " + (sim.path() / "dev/infiniband/uverbs1").string() +
           ": No such file or directory"},
      {{{}}, grpc::StatusCode::INVALID_ARGUMENT, "the container request names no devices"},
      {{{"rdmap16s27\n\x01"}},
       grpc::StatusCode::INVALID_ARGUMENT,
       "unknown device \"rdmap16s27\\n\\x01\": not an EFA of this node"},
      // The second container is bad: the first gets nothing either.
      {{{"rdmap16s27"}, {"uverbs0"}},
       grpc::StatusCode::INVALID_ARGUMENT,
       "unknown device \"uverbs0\": not an EFA of this node"},
  };
  for (const Case& c : cases) {
    INFO(c.message);
    v1beta1::AllocateResponse response;
    grpc::Status status = plugin.Allocate(c.containers, &response);
    CHECK(status.error_code() == c.code);
    CHECK(status.error_message() == c.message);
    CHECK(response.container_responses_size() == 0);
  }
  v1beta1::AllocateResponse ok;
  CHECK(plugin.Allocate({{"rdmap16s27"}}, &ok).ok());
}

TEST_CASE("GetPreferredAllocation never fails and honours must-include", "[plugin][concurrency]") {
  SimRoot sim("p4d.24xlarge");
  ServedPlugin plugin(sim);
  // Must-include first, then the nearest free one; answered in PCI order.
  CHECK(plugin.Preferred({"rdmap160s27", "rdmap16s27", "rdmap32s27", "rdmap144s27"},
                         {"rdmap160s27"},
                         2) == std::vector<std::string>{"rdmap144s27", "rdmap160s27"});
  CHECK(plugin.Preferred({"bogus", "rdmap32s27"}, {}, 4) == std::vector<std::string>{"rdmap32s27"});
  CHECK(plugin.Preferred({}, {}, 0).empty());
}

TEST_CASE("ListAndWatch reports IDs, health and NUMA nodes, and each change",
          "[plugin][concurrency]") {
  SimRoot sim("g5.48xlarge");
  SECTION("with NUMA reporting") {
    SimRoot p4d("p4d.24xlarge");
    ServedPlugin plugin(p4d);
    auto list = plugin.service.CurrentList();
    REQUIRE(list.devices_size() == 4);
    CHECK(list.devices(0).id() == "rdmap16s27");
    CHECK(list.devices(0).health() == "Healthy");
    REQUIRE(list.devices(3).topology().nodes_size() == 1);
    CHECK(list.devices(3).topology().nodes(0).id() == 1);

    grpc::ClientContext context;
    auto reader = plugin.stub->ListAndWatch(&context, v1beta1::Empty());
    v1beta1::ListAndWatchResponse first, second;
    REQUIRE(reader->Read(&first));
    CHECK(first.devices_size() == 4);
    auto devices = efa::topology::DiscoverEfaDevices(p4d.roots()).devices;
    devices[2].health_problem = "gone";
    plugin.service.SetDevices(devices);
    REQUIRE(reader->Read(&second));
    CHECK(second.devices(2).health() == "Unhealthy");
    CHECK(second.devices(1).health() == "Healthy");
    plugin.service.Shutdown();
    CHECK_FALSE(reader->Read(&second));
    CHECK(reader->Finish().ok());
  }
  SECTION("NUMA unknown (-1) and reporting off give no topology") {
    ServedPlugin g5(sim);
    CHECK_FALSE(g5.service.CurrentList().devices(0).has_topology());
    SimRoot p4d("p4d.24xlarge");
    ServedPlugin off(p4d, /*report_numa=*/false);
    CHECK_FALSE(off.service.CurrentList().devices(0).has_topology());
  }
}

TEST_CASE("GetPreferredAllocation aligns with the accelerators the target finder reports",
          "[plugin][concurrency]") {
  SimRoot sim("p5.48xlarge");
  ServedPlugin plugin(sim);
  auto inv = efa::topology::DiscoverEfaDevices(sim.roots());
  auto topo = efa::topology::LoadTopology({sim.path().string(), ""});
  REQUIRE(topo.ok());
  plugin.service.SetDevices(inv.devices, efa::topology::HostModel::FromHwloc(inv, topo->get()));
  std::vector<std::string> all;
  for (const auto& d : inv.devices) all.push_back(d.ibdev);

  // No targets: one whole switch group, the one of the lowest GPU.
  CHECK(plugin.Preferred(all, {}, 4) ==
        std::vector<std::string>{"rdmap79s0", "rdmap80s0", "rdmap81s0", "rdmap82s0"});
  plugin.service.SetTargetFinder([](const efa::topology::HostModel&) {
    Targets t;
    t.pci = {*efa::topology::PciAddress::Parse("0000:64:00.0")};
    return t;
  });
  CHECK(plugin.Preferred(all, {}, 4) ==
        std::vector<std::string>{"rdmap96s0", "rdmap97s0", "rdmap98s0", "rdmap99s0"});
}
