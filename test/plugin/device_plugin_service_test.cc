#include "plugin/device_plugin_service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>
#include <future>
#include <set>

#include "test/sim/sim_root.h"
#include "topology/efa_discovery.h"
#include "topology/hwloc_loader.h"
#include "topology/replica_id.h"

namespace fs = std::filesystem;
using namespace efa::plugin;
using efa::sim::SimRoot;

namespace {

// The service on a real unix socket, with a client stub.
struct ServedPlugin {
  explicit ServedPlugin(const SimRoot& sim, bool report_numa = true, int replicas = 1,
                        TargetFinder finder = nullptr)
      : service(DevicePluginService::Options{report_numa, replicas}) {
    service.SetDevices(efa::topology::DiscoverEfaDevices(sim.roots()).devices);
    // The finder is set before serving, as the service's contract says.
    if (finder) service.SetTargetFinder(std::move(finder));
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
  CHECK(c.envs().size() == 3);
  CHECK(c.envs().at("EFA_DEVICES") == "rdmap79s0,rdmap82s0");
  CHECK(c.envs().at("EFA_PCI_ADDRESSES") == "0000:4f:00.0,0000:52:00.0");
  CHECK(c.envs().at("EFA_SHARING_REPLICAS") == "1");
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
  // Targets once `aligned` is set: the finder itself is set before serving.
  std::atomic<bool> aligned{false};
  ServedPlugin plugin(sim, true, 1, [&aligned](const efa::topology::HostModel&) {
    Targets t;
    if (aligned) t.pci = {*efa::topology::PciAddress::Parse("0000:64:00.0")};
    return t;
  });
  auto inv = efa::topology::DiscoverEfaDevices(sim.roots());
  auto topo = efa::topology::LoadTopology({sim.path().string(), ""});
  REQUIRE(topo.ok());
  plugin.service.SetDevices(inv.devices, efa::topology::HostModel::FromHwloc(inv, topo->get()));
  std::vector<std::string> all;
  for (const auto& d : inv.devices) all.push_back(d.ibdev);

  // No targets: one whole switch group, the one of the lowest GPU.
  CHECK(plugin.Preferred(all, {}, 4) ==
        std::vector<std::string>{"rdmap79s0", "rdmap80s0", "rdmap81s0", "rdmap82s0"});
  aligned = true;
  CHECK(plugin.Preferred(all, {}, 4) ==
        std::vector<std::string>{"rdmap96s0", "rdmap97s0", "rdmap98s0", "rdmap99s0"});
}

TEST_CASE(
    "GetPreferredAllocation waits for a host model being loaded, and answers without it rather "
    "than fail",
    "[plugin][concurrency]") {
  SimRoot sim("p5.48xlarge");
  ServedPlugin plugin(sim, true, 1, [](const efa::topology::HostModel&) {
    Targets t;
    t.pci = {*efa::topology::PciAddress::Parse("0000:64:00.0")};
    return t;
  });
  auto inv = efa::topology::DiscoverEfaDevices(sim.roots());
  std::vector<std::string> all;
  for (const auto& d : inv.devices) all.push_back(d.ibdev);
  // Registered before hwloc is loaded: the model comes later.
  plugin.service.SetDevices(inv.devices, nullptr, /*model_pending=*/true);
  auto answer = std::async(std::launch::async, [&] { return plugin.Preferred(all, {}, 4); });
  auto topo = efa::topology::LoadTopology({sim.path().string(), ""});
  REQUIRE(topo.ok());
  plugin.service.SetDevices(inv.devices, efa::topology::HostModel::FromHwloc(inv, topo->get()));
  // Whenever the call came, it was placed with the PCI tree: beside the GPU.
  CHECK(answer.get() ==
        std::vector<std::string>{"rdmap96s0", "rdmap97s0", "rdmap98s0", "rdmap99s0"});

  // A model that never comes (hwloc fails): after the wait, the fallback's
  // answer (NUMA node and root complex), four EFAs all the same.
  plugin.service.SetDevices(inv.devices, nullptr, /*model_pending=*/true);
  CHECK(plugin.Preferred(all, {}, 4).size() == 4);
}

TEST_CASE("Sharing: each EFA is listed as its replicas, which share its health",
          "[plugin][sharing][concurrency]") {
  SimRoot sim("p4d.24xlarge");
  ServedPlugin plugin(sim, /*report_numa=*/true, /*replicas=*/3);
  auto list = plugin.service.CurrentList();
  REQUIRE(list.devices_size() == 12);
  CHECK(list.devices(0).id() == "rdmap16s27::0");
  CHECK(list.devices(2).id() == "rdmap16s27::2");
  CHECK(list.devices(3).id() == "rdmap32s27::0");
  CHECK(list.devices(11).topology().nodes(0).id() == 1);
  auto devices = efa::topology::DiscoverEfaDevices(sim.roots()).devices;
  devices[1].health_problem = "gone";
  plugin.service.SetDevices(devices);
  list = plugin.service.CurrentList();
  for (int i = 0; i < 12; ++i) {
    INFO(list.devices(i).id());
    CHECK(list.devices(i).health() == (i / 3 == 1 ? "Unhealthy" : "Healthy"));
  }
  v1beta1::AllocateResponse response;
  grpc::Status status = plugin.Allocate({{"rdmap32s27::1"}}, &response);
  CHECK(status.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(status.error_message() == "device \"rdmap32s27::1\" is unhealthy: gone");
}

TEST_CASE("Sharing: Allocate gives each EFA once and names physical EFAs",
          "[plugin][sharing][concurrency]") {
  SimRoot sim("p4d.24xlarge");
  ServedPlugin plugin(sim, /*report_numa=*/true, /*replicas=*/4);
  v1beta1::AllocateResponse response;
  REQUIRE(plugin.Allocate({{"rdmap32s27::3", "rdmap16s27::0", "rdmap32s27::1"}}, &response).ok());
  const auto& c = response.container_responses(0);
  REQUIRE(c.devices_size() == 2);
  const std::string dev = (sim.path() / "dev/infiniband").string();
  CHECK(c.devices(0).host_path() == dev + "/uverbs0");
  CHECK(c.devices(1).host_path() == dev + "/uverbs1");
  CHECK(c.envs().at("EFA_DEVICES") == "rdmap16s27,rdmap32s27");
  CHECK(c.envs().at("EFA_PCI_ADDRESSES") == "0000:10:1b.0,0000:20:1b.0");

  // The bare ibdev name, a replica beyond the count and a repeat are refused.
  for (const auto& [ids, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"rdmap16s27"}, "unknown device \"rdmap16s27\": not an EFA of this node"},
           {{"rdmap16s27::4"}, "unknown device \"rdmap16s27::4\": not an EFA of this node"},
           {{"rdmap16s27::1", "rdmap16s27::1"}, "device \"rdmap16s27::1\" requested twice"}}) {
    grpc::Status status = plugin.Allocate({ids}, &response);
    CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(status.error_message() == message);
  }
}

TEST_CASE("Sharing: GetPreferredAllocation spreads over distinct EFAs, then the least shared",
          "[plugin][sharing][concurrency]") {
  SimRoot sim("p5.48xlarge");
  ServedPlugin plugin(sim, /*report_numa=*/true, /*replicas=*/2);
  auto inv = efa::topology::DiscoverEfaDevices(sim.roots());
  auto topo = efa::topology::LoadTopology({sim.path().string(), ""});
  REQUIRE(topo.ok());
  plugin.service.SetDevices(inv.devices, efa::topology::HostModel::FromHwloc(inv, topo->get()));
  // Set before any call, as its contract asks; the GPU is known from `gpu_known` on.
  std::atomic<bool> gpu_known{false};
  plugin.service.SetTargetFinder([&gpu_known](const efa::topology::HostModel&) {
    Targets t;
    if (gpu_known) t.pci = {*efa::topology::PciAddress::Parse("0000:64:00.0")};
    return t;
  });
  std::vector<std::string> all;
  for (const auto& d : inv.devices) {
    all.push_back(d.ibdev + "::0");
    all.push_back(d.ibdev + "::1");
  }
  auto without = [&](std::vector<std::string> ids) {
    std::vector<std::string> out;
    for (const auto& id : all) {
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) out.push_back(id);
    }
    return out;
  };
  // No targets: the switch of the lowest GPU, four different EFAs.
  CHECK(plugin.Preferred(all, {}, 4) ==
        std::vector<std::string>{"rdmap79s0::0", "rdmap80s0::0", "rdmap81s0::0", "rdmap82s0::0"});
  // One EFA there already shared: the rest of that switch goes first.
  CHECK(plugin.Preferred(without({"rdmap79s0::0", "rdmap80s0::0", "rdmap81s0::0"}), {}, 1) ==
        std::vector<std::string>{"rdmap82s0::0"});
  gpu_known = true;
  // Beside the GPU, least shared first.
  CHECK(plugin.Preferred(without({"rdmap96s0::0", "rdmap98s0::0"}), {}, 2) ==
        std::vector<std::string>{"rdmap97s0::0", "rdmap99s0::0"});
  // Asked for more than the switch's EFAs: distinct EFAs first, the switch's
  // then the nearest others (same NUMA node), not second replicas.
  auto six = plugin.Preferred(all, {}, 6);
  REQUIRE(six.size() == 6);
  std::set<std::string> efas;
  for (const auto& id : six) efas.insert(efa::topology::ParseReplicaId(id)->ibdev);
  CHECK(efas == std::set<std::string>{"rdmap79s0", "rdmap80s0", "rdmap96s0", "rdmap97s0",
                                      "rdmap98s0", "rdmap99s0"});
  // Second replicas only beyond the EFAs with a free replica: two EFAs left,
  // three asked: both, then a second replica of the nearer.
  auto three = plugin.Preferred({"rdmap96s0::0", "rdmap96s0::1", "rdmap79s0::1"}, {}, 3);
  CHECK(three == std::vector<std::string>{"rdmap79s0::1", "rdmap96s0::0", "rdmap96s0::1"});
  // Must-include replicas stay; bad IDs are ignored; never fails.
  auto must = plugin.Preferred(all, {"rdmap96s0::1"}, 2);
  CHECK(must == std::vector<std::string>{"rdmap96s0::1", "rdmap97s0::0"});
  CHECK(plugin.Preferred({"bogus", "rdmap96s0", "rdmap96s0::7"}, {}, 2).empty());
}
