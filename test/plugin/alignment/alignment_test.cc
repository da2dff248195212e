#include "plugin/alignment/alignment.h"

#include <catch2/catch.hpp>
#include <optional>

#include "test/sim/sim_root.h"
#include "test/support/devices.h"
#include "topology/efa_discovery.h"
#include "topology/hwloc_loader.h"
#include "topology/nvidia_gpus.h"

using namespace efa::plugin;
using efa::sim::SimGpuUuid;
using efa::sim::SimRoot;
using efa::topology::PciAddress;

namespace {

using efa::testing::kEfa;

std::shared_ptr<const efa::topology::HostModel> Model(const SimRoot& sim) {
  auto topo = efa::topology::LoadTopology({sim.path().string(), ""});
  REQUIRE(topo.ok());
  return efa::topology::HostModel::FromHwloc(efa::topology::DiscoverEfaDevices(sim.roots()),
                                             topo->get());
}

PciAddress Bdf(const char* text) { return *PciAddress::Parse(text); }

v1::ListPodResourcesResponse List(
    std::vector<std::tuple<std::string, std::string,
                           std::vector<std::pair<std::string, std::vector<std::string>>>>>
        containers) {
  v1::ListPodResourcesResponse list;
  for (auto& [pod, container, devices] : containers) {
    auto* p = list.add_pod_resources();
    p->set_name(pod);
    p->set_namespace_("default");
    auto* c = p->add_containers();
    c->set_name(container);
    for (auto& [resource, ids] : devices) {
      auto* d = c->add_devices();
      d->set_resource_name(resource);
      for (auto& id : ids) d->add_device_ids(id);
    }
  }
  return list;
}

}  // namespace

TEST_CASE("FindAdmittedContainer picks the container whose GPUs are not checkpointed yet",
          "[alignment]") {
  auto list = List({{"running", "main", {{"nvidia.com/gpu", {"GPU-a"}}}},
                    {"both", "main", {{"nvidia.com/gpu", {"GPU-c"}}, {kEfa, {"rdmap79s0"}}}},
                    {"admitting", "train", {{"nvidia.com/gpu", {"GPU-b"}}}},
                    {"cpu-only", "main", {}}});
  auto containers = ContainersWithDevices(list, AcceleratorResources{});
  REQUIRE(containers.size() == 3);

  KubeletCheckpoint checkpoint;
  checkpoint.entries.push_back({"uid-1", "main", "nvidia.com/gpu", {"GPU-a"}, {}, {}});
  // Devices of other plugins do not matter.
  checkpoint.entries.push_back({"uid-1", "main", "example.com/fpga", {"fpga0"}, {}, {}});
  checkpoint.entries.push_back({"uid-2", "main", "nvidia.com/gpu", {"GPU-c"}, {}, {}});
  checkpoint.entries.push_back({"uid-2", "main", kEfa, {"rdmap79s0"}, {}, {}});
  auto checkpointed = [&] { return CheckpointedContainers(checkpoint, AcceleratorResources{}); };
  auto cp = checkpointed();
  REQUIRE(cp.size() == 2);
  CHECK(cp[0].pod_uid == "uid-1");
  PodNames names;
  int candidates = -1;
  auto found = FindAdmittedContainer(containers, &cp, names, &candidates);
  REQUIRE(found.has_value());
  CHECK(candidates == 1);
  CHECK(found->Name() == "default/admitting/train");

  SECTION("a running GPU-only pod is never the one being admitted") {
    checkpoint.entries.push_back({"uid-3", "train", "nvidia.com/gpu", {"GPU-b"}, {}, {}});
    cp = checkpointed();
    CHECK_FALSE(FindAdmittedContainer(containers, &cp, names, &candidates).has_value());
    CHECK(candidates == 0);
  }
  SECTION("a deleted pod's stale entry holding the same GPU and EFAs does not hide it") {
    // The kubelet keeps a deleted pod in the checkpoint until its next write.
    checkpoint.entries.push_back({"uid-old", "train", "nvidia.com/gpu", {"GPU-b"}, {}, {}});
    checkpoint.entries.push_back({"uid-old", "train", kEfa, {"rdmap80s0"}, {}, {}});
    cp = checkpointed();
    found = FindAdmittedContainer(containers, &cp, names, &candidates);
    REQUIRE(found.has_value());
    CHECK(found->Name() == "default/admitting/train");
  }
  SECTION("a stale GPU-only entry hides it unless its UID is known to be another pod's") {
    checkpoint.entries.push_back({"uid-old", "train", "nvidia.com/gpu", {"GPU-b"}, {}, {}});
    cp = checkpointed();
    CHECK_FALSE(FindAdmittedContainer(containers, &cp, names, &candidates).has_value());

    // Learned while the old pod ran: pod-resources listed it alone with GPU-b.
    LearnPodNames(ContainersWithDevices(List({{"old", "train", {{"nvidia.com/gpu", {"GPU-b"}}}}}),
                                        AcceleratorResources{}),
                  cp, names);
    REQUIRE(names.size() == 1);
    CHECK(names.at("uid-old") == "default/old");
    found = FindAdmittedContainer(containers, &cp, names, &candidates);
    REQUIRE(found.has_value());
    CHECK(found->Name() == "default/admitting/train");

    // The pod it was learned as is the one listed: still a running pod.
    auto same = ContainersWithDevices(List({{"old", "train", {{"nvidia.com/gpu", {"GPU-b"}}}}}),
                                      AcceleratorResources{});
    CHECK_FALSE(FindAdmittedContainer(same, &cp, names, &candidates).has_value());
    CHECK(candidates == 0);
  }
  SECTION("LearnPodNames learns only unique matches and forgets UIDs no longer checkpointed") {
    names["uid-gone"] = "default/gone";
    LearnPodNames(containers, cp, names);
    CHECK(names == PodNames{{"uid-1", "default/running"}, {"uid-2", "default/both"}});
    auto twice = ContainersWithDevices(List({{"x", "main", {{"nvidia.com/gpu", {"GPU-a"}}}},
                                             {"y", "main", {{"nvidia.com/gpu", {"GPU-a"}}}}}),
                                       AcceleratorResources{});
    LearnPodNames(twice, cp, names);  // ambiguous or absent: keeps what it knew
    CHECK(names.at("uid-1") == "default/running");
    CHECK(names.at("uid-2") == "default/both");  // no match: a deleted pod still checkpointed
  }
  SECTION("without a checkpoint two GPU-only containers are ambiguous") {
    CHECK_FALSE(FindAdmittedContainer(containers, nullptr, names, &candidates).has_value());
    CHECK(candidates == 2);
  }
}

TEST_CASE("ResolveTargets maps NVIDIA UUIDs and indices to PCI addresses", "[alignment]") {
  SimRoot sim("p5.48xlarge");
  auto model = Model(sim);
  std::vector<std::string> errors;
  auto gpus = efa::topology::ReadNvidiaGpus(sim.path() / "proc", &errors);
  REQUIRE(gpus.size() == 8);
  CHECK(errors.empty());
  auto t = ResolveTargets({{"nvidia.com/gpu", SimGpuUuid(Bdf("0000:64:00.0"))},
                           {"nvidia.com/gpu", "0"},
                           {"nvidia.com/gpu", "GPU-unknown"}},
                          AcceleratorResources{}, gpus, *model);
  CHECK(t.pci == std::vector<PciAddress>{Bdf("0000:53:00.0"), Bdf("0000:64:00.0")});
  CHECK(t.unresolved == std::vector<std::string>{"GPU-unknown"});
}

TEST_CASE("ResolveTargets maps time-sliced replicas and MIG devices to their GPU", "[alignment]") {
  SimRoot sim("p5.48xlarge");
  auto model = Model(sim);
  auto gpus = efa::topology::ReadNvidiaGpus(sim.path() / "proc", nullptr);
  REQUIRE(gpus.size() == 8);
  const std::string uuid = SimGpuUuid(Bdf("0000:64:00.0"));  // GPU 1
  struct Case {
    std::string id;
    std::optional<PciAddress> gpu;
  };
  const std::vector<Case> cases = {
      {uuid + "::0", Bdf("0000:64:00.0")},  // time-slicing replica
      {uuid + "::13", Bdf("0000:64:00.0")},
      {"2::1", Bdf("0000:75:00.0")},                     // replica of GPU index 2
      {"3:0", Bdf("0000:86:00.0")},                      // MIG device 0 of GPU 3 (index)
      {"3:5::2", Bdf("0000:86:00.0")},                   // a replica of it
      {"MIG-" + uuid + "/7/0", Bdf("0000:64:00.0")},     // legacy MIG UUID names its parent
      {"MIG-8f2c1d90-3e5a-4b17-9c2e-5da9abb51763", {}},  // R470+ MIG UUID: no parent in /proc
      {"3:", {}},
      {"3:x", {}},
      {":1", {}},
      {"8:0", {}},
      {"GPU-unknown::1", {}},
  };
  for (const Case& c : cases) {
    INFO(c.id);
    CHECK(efa::topology::NvidiaDeviceAddress(gpus, c.id) == c.gpu);
  }
  // The busy GPUs of prediction come through the same resolution.
  auto t = ResolveTargets({{"nvidia.com/gpu", uuid + "::3"}, {"nvidia.com/gpu", "3:1"}},
                          AcceleratorResources{}, gpus, *model);
  CHECK(t.pci == std::vector<PciAddress>{Bdf("0000:64:00.0"), Bdf("0000:86:00.0")});
  CHECK(t.unresolved.empty());
}

TEST_CASE("ResolveTargets maps Neuron devices and cores through the AWS table", "[alignment]") {
  SimRoot sim("trn2.48xlarge");
  auto model = Model(sim);
  REQUIRE(model->neuron_table() != nullptr);
  auto t = ResolveTargets({{"aws.amazon.com/neuron", "3"},
                           {"aws.amazon.com/neuroncore", "5"},
                           {"aws.amazon.com/neuron", "x"}},
                          AcceleratorResources{}, {}, *model);
  CHECK(t.neuron_indices == std::vector<int>{1, 3});
  CHECK(t.unresolved == std::vector<std::string>{"x"});
}

TEST_CASE("IsAligned compares an allocation with the best placement", "[alignment]") {
  SimRoot sim("p5.48xlarge");
  auto model = Model(sim);
  Targets gpu53;
  gpu53.pci = {Bdf("0000:53:00.0")};
  CHECK(IsAligned(*model, {"rdmap79s0", "rdmap80s0", "rdmap81s0", "rdmap82s0"}, gpu53));
  CHECK_FALSE(IsAligned(*model, {"rdmap79s0", "rdmap80s0", "rdmap81s0", "rdmap96s0"}, gpu53));
  // Eight EFAs for one GPU: four behind its switch and four on its NUMA node
  // is the best there is.
  CHECK(IsAligned(*model,
                  {"rdmap79s0", "rdmap80s0", "rdmap81s0", "rdmap82s0", "rdmap96s0", "rdmap97s0",
                   "rdmap98s0", "rdmap99s0"},
                  gpu53));
  CHECK_FALSE(IsAligned(*model,
                        {"rdmap79s0", "rdmap80s0", "rdmap81s0", "rdmap82s0", "rdmap147s0",
                         "rdmap148s0", "rdmap149s0", "rdmap150s0"},
                        gpu53));

  SimRoot trn2("trn2.48xlarge");
  auto tm = Model(trn2);
  Targets neuron0;
  neuron0.neuron_indices = {0};
  CHECK(IsAligned(*tm, {"rdmap201s0"}, neuron0));        // c9:00.0, the table's choice
  CHECK_FALSE(IsAligned(*tm, {"rdmap202s0"}, neuron0));  // ca:00.0, same switch only
}

TEST_CASE("DescribeTargets names GPUs by PCI address and Neuron devices by index", "[alignment]") {
  CHECK(DescribeTargets({}) == "no known accelerators");
  Targets targets;
  targets.pci = {*PciAddress::Parse("0000:53:00.0"), *PciAddress::Parse("0000:64:00.0")};
  targets.neuron_indices = {3};
  CHECK(DescribeTargets(targets) == "accelerators 0000:53:00.0, 0000:64:00.0, neuron3");
}
