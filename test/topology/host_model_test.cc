#include "topology/host_model.h"

#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "test/sim/sim_root.h"
#include "topology/efa_discovery.h"
#include "topology/hwloc_loader.h"
#include "topology/instance_type.h"

using efa::sim::Naming;
using efa::sim::SimRoot;
using namespace efa::topology;

namespace {

enum class Source { kFakeRoot, kXml };

std::shared_ptr<const HostModel> ModelOf(const SimRoot& sim, Source source,
                                         const HostModelOptions& options = {}) {
  const Inventory inv = DiscoverEfaDevices(sim.roots());
  auto topology = LoadTopology(source == Source::kXml ? TopologySource{"", sim.xml().string()}
                                                      : TopologySource{sim.path().string(), ""});
  REQUIRE(topology.ok());
  return HostModel::FromHwloc(inv, topology->get(), options);
}

PciAddress Pci(const char* text) {
  auto addr = PciAddress::Parse(text);
  REQUIRE(addr.has_value());
  return *addr;
}

// The lines Describe() writes for one EFA: its placement and neighbours.
std::vector<std::string> EfaLines(const HostModel& model, const std::string& id) {
  std::vector<std::string> out;
  bool in = false;
  for (absl::string_view line : absl::StrSplit(model.Describe(), '\n')) {
    if (line.substr(0, 4) == "efa ") in = line.substr(4, id.size() + 1) == id + " ";
    if (in && (line.substr(0, 4) == "efa " || line.substr(0, 2) == "  ")) {
      out.emplace_back(line);
    }
  }
  return out;
}

std::vector<std::string> Addresses(const std::vector<PciAddress>& pcis) {
  std::vector<std::string> out;
  for (const PciAddress& p : pcis) out.push_back(p.ToString());
  return out;
}

}  // namespace

TEST_CASE("HostModel places the EFAs and accelerators of every simulated machine", "[topology]") {
  struct Case {
    std::string machine;
    size_t gpus = 0;
    size_t neurons = 0;
    std::string efa = {};  // one EFA and what Describe() says about it
    std::vector<std::string> lines = {};
  };
  const std::vector<Case> cases = {
      {.machine = "p4d.24xlarge",
       .gpus = 8,
       .neurons = 0,
       .efa = "rdmap16s27",
       .lines = {"efa rdmap16s27 0000:10:1b.0 numa=0 root=pci0000:10 switch=-",
                 "  root-complex: 0000:10:1c.0 0000:10:1d.0", "  numa: 0000:20:1c.0 0000:20:1d.0",
                 "  other: 0000:90:1c.0 0000:90:1d.0 0000:a0:1c.0 0000:a0:1d.0"}},
      // The four NVSwitches (class 0x0680) are not GPUs.
      {.machine = "p5.48xlarge",
       .gpus = 8,
       .neurons = 0,
       .efa = "rdmap96s0",
       .lines = {"efa rdmap96s0 0000:60:00.0 numa=0 root=pci0000:55 switch=0000:56:00.0",
                 "  switch: 0000:64:00.0", "  numa: 0000:53:00.0 0000:75:00.0 0000:86:00.0",
                 "  other: 0000:97:00.0 0000:a8:00.0 0000:b9:00.0 0000:ca:00.0"}},
      {.machine = "p5en.48xlarge",
       .gpus = 8,
       .neurons = 0,
       .efa = "rdmap137s0",
       .lines = {"efa rdmap137s0 0000:89:00.0 numa=1 root=pci0000:84 switch=0000:85:00.0",
                 "  switch: 0000:8b:00.0 0000:8c:00.0", "  numa: 0000:a4:00.0 0000:a5:00.0",
                 "  other: 0000:59:00.0 0000:5a:00.0 0000:72:00.0 0000:73:00.0"}},
      // The ConnectX-7 functions are neither EFAs nor accelerators.
      {.machine = "p6-b200.48xlarge",
       .gpus = 8,
       .neurons = 0,
       .efa = "rdmap86s0",
       .lines = {"efa rdmap86s0 0000:56:00.0 numa=0 root=pci0000:52 switch=0000:53:00.0",
                 "  switch: 0000:57:00.0 0000:58:00.0", "  numa: 0000:70:00.0 0000:71:00.0",
                 "  other: 0000:89:00.0 0000:8a:00.0 0000:a2:00.0 0000:a3:00.0"}},
      {.machine = "trn1.32xlarge",
       .gpus = 0,
       .neurons = 16,
       .efa = "rdmap144s26",
       .lines = {"efa rdmap144s26 0000:90:1a.0 numa=1 root=pci0000:90 switch=-",
                 "  root-complex: 0000:90:1b.0 0000:90:1c.0 0000:90:1d.0 0000:90:1e.0",
                 "  numa: 0000:a0:1b.0 0000:a0:1c.0 0000:a0:1d.0 0000:a0:1e.0",
                 "  other: 0000:10:1b.0 0000:10:1c.0 0000:10:1d.0 0000:10:1e.0 0000:20:1b.0 "
                 "0000:20:1c.0 0000:20:1d.0 0000:20:1e.0"}},
      {.machine = "trn1n.32xlarge",
       .gpus = 0,
       .neurons = 16,
       .efa = "rdmap16s23",
       .lines = {"efa rdmap16s23 0000:10:17.0 numa=0 root=pci0000:10 switch=-",
                 "  root-complex: 0000:10:1b.0 0000:10:1c.0 0000:10:1d.0 0000:10:1e.0",
                 "  numa: 0000:20:1b.0 0000:20:1c.0 0000:20:1d.0 0000:20:1e.0",
                 "  other: 0000:90:1b.0 0000:90:1c.0 0000:90:1d.0 0000:90:1e.0 0000:a0:1b.0 "
                 "0000:a0:1c.0 0000:a0:1d.0 0000:a0:1e.0"}},
      {.machine = "trn2.48xlarge",
       .gpus = 0,
       .neurons = 16,
       .efa = "rdmap201s0",
       .lines =
           {"efa rdmap201s0 0000:c9:00.0 numa=1 root=pci0000:c6 switch=0000:c7:00.0",
            "  switch: 0000:cb:00.0 0000:cc:00.0",
            "  numa: 0000:b5:00.0 0000:b6:00.0 0000:e1:00.0 0000:e2:00.0 0000:f7:00.0 0000:f8:00.0",
            "  other: 0000:58:00.0 0000:59:00.0 0000:6e:00.0 0000:6f:00.0 0000:84:00.0 "
            "0000:85:00.0 0000:9a:00.0 0000:9b:00.0"}},
      // numa_node -1 everywhere: the only proximity left is the shared root bus.
      {.machine = "g5.48xlarge",
       .gpus = 8,
       .neurons = 0,
       .efa = "rdmap0s21",
       .lines = {"efa rdmap0s21 0000:00:15.0 numa=? root=pci0000:00 switch=-",
                 "  root-complex: 0000:00:16.0 0000:00:17.0 0000:00:18.0 0000:00:19.0 0000:00:1a.0 "
                 "0000:00:1b.0 0000:00:1c.0 0000:00:1d.0"}},
      {.machine = "no-efa", .gpus = 0, .neurons = 0},
  };
  for (const Case& c : cases) {
    SECTION(c.machine) {
      SimRoot sim(c.machine);
      const Inventory inv = DiscoverEfaDevices(sim.roots());
      auto model = ModelOf(sim, Source::kFakeRoot);
      size_t gpus = 0, neurons = 0;
      for (const Accelerator& a : model->accelerators()) {
        (a.kind == AcceleratorKind::kNvidiaGpu ? gpus : neurons)++;
      }
      CHECK(gpus == c.gpus);
      CHECK(neurons == c.neurons);
      CHECK(model->warnings().empty());
      REQUIRE(model->efas().size() == inv.devices.size());
      for (size_t i = 0; i < inv.devices.size(); ++i) {
        const EfaPlacement& p = model->efas()[i];
        CHECK(p.id == inv.devices[i].ibdev);
        CHECK(p.pci == inv.devices[i].pci);
        CHECK(p.numa_node == inv.devices[i].numa_node);
        // hwloc's host bridge names the same root complex as the sysfs path.
        CHECK(p.root_complex == inv.devices[i].root_complex);
        CHECK(model->Neighbours(i).size() == model->accelerators().size());
      }
      if (!c.efa.empty()) CHECK(EfaLines(*model, c.efa) == c.lines);
    }
  }
}

TEST_CASE("HostModel is the same from the hwloc XML and from the fake root", "[topology]") {
  for (const efa::sim::MachineSpec& spec : efa::sim::BuiltinMachines()) {
    for (Naming naming : {Naming::kUdev, Naming::kKernel}) {
      SimRoot sim(spec, naming);
      const std::string from_root = ModelOf(sim, Source::kFakeRoot)->Describe();
      const std::string from_xml = ModelOf(sim, Source::kXml)->Describe();
      INFO(spec.instance_type);
      CHECK(from_xml == from_root);
    }
  }
}

TEST_CASE("HostModel rebuilt from plain placements equals the hwloc model", "[topology]") {
  // Create() derives distances from the placements; FromHwloc() from the
  // closest common ancestor in the PCI tree. They must agree everywhere.
  for (const efa::sim::MachineSpec& spec : efa::sim::BuiltinMachines()) {
    SimRoot sim(spec);
    auto model = ModelOf(sim, Source::kXml);
    auto rebuilt = HostModel::Create(model->instance_type(), model->efas(), model->accelerators());
    INFO(spec.instance_type);
    CHECK(rebuilt->Describe() == model->Describe());
  }
}

TEST_CASE("HostModel groups EFAs by switch, root complex and NUMA node", "[topology]") {
  SimRoot sim("p5.48xlarge");
  auto model = ModelOf(sim, Source::kFakeRoot);
  CHECK(model->GroupCount(GroupLevel::kSwitch) == 8);
  CHECK(model->GroupCount(GroupLevel::kRootComplex) == 8);
  CHECK(model->GroupCount(GroupLevel::kNuma) == 2);
  CHECK(model->GroupEfas(GroupLevel::kSwitch, 1) == std::vector<size_t>{4, 5, 6, 7});
  const size_t gpu64 = model->FindAccelerator(Pci("0000:64:00.0")).value();
  CHECK(model->AcceleratorGroup(GroupLevel::kSwitch, gpu64) == 1);
  CHECK(model->AcceleratorGroup(GroupLevel::kNuma, gpu64) == 0);
  // Root, two NUMA nodes, eight root complexes with one switch leaf each.
  const auto& tree = model->placement_tree();
  REQUIRE(tree.size() == 1 + 2 + 8 + 8);
  CHECK(tree[0].children.size() == 2);
  size_t leaves = 0;
  for (const PlacementNode& node : tree) {
    if (!node.children.empty()) continue;
    ++leaves;
    CHECK(node.efas.size() == 4);
    CHECK(node.accelerators.size() == 1);
  }
  CHECK(leaves == 8);
  CHECK_FALSE(model->FindAccelerator(Pci("0000:00:1b.0")).has_value());  // an NVSwitch
  CHECK(model->FindEfa("rdmap96s0") == 4u);
  CHECK_FALSE(model->FindEfa("rdmap96s1").has_value());
}

TEST_CASE("HostModel takes the instance type from DMI unless told otherwise", "[topology]") {
  SimRoot sim("trn2.48xlarge");
  CHECK(ModelOf(sim, Source::kFakeRoot)->instance_type() == "trn2.48xlarge");
  CHECK(ModelOf(sim, Source::kXml)->instance_type() == "trn2.48xlarge");
  CHECK(ReadInstanceType(sim.sys()).value() == "trn2.48xlarge");

  // Configuration wins, and picks the Neuron table.
  auto model = ModelOf(sim, Source::kXml, {"trn2u.48xlarge"});
  CHECK(model->instance_type() == "trn2u.48xlarge");
  REQUIRE(model->neuron_table() != nullptr);
  CHECK(model->neuron_table()->name == "trn2");
  CHECK(ModelOf(sim, Source::kXml, {"p5.48xlarge"})->neuron_table() == nullptr);
}

TEST_CASE("HostModel maps Neuron devices to EFAs through AWS's tables", "[topology]") {
  struct Case {
    int neuron;
    std::string efa_pci;
    std::string efa_id;
  };
  const std::map<std::string, std::vector<Case>> cases = {
      {"trn1.32xlarge",
       {{0, "0000:10:1a.0", "rdmap16s26"},
        {1, "0000:10:1a.0", "rdmap16s26"},
        {12, "0000:10:19.0", "rdmap16s25"},
        {15, "0000:a0:19.0", "rdmap160s25"}}},
      {"trn1n.32xlarge", {{0, "0000:10:17.0", "rdmap16s23"}, {5, "0000:20:18.0", "rdmap32s24"}}},
      {"trn2.48xlarge",
       {{0, "0000:c9:00.0", "rdmap201s0"},
        {6, "0000:56:00.0", "rdmap86s0"},
        {15, "0000:f6:00.0", "rdmap246s0"}}},
  };
  for (const auto& [machine, neurons] : cases) {
    SECTION(machine) {
      SimRoot sim(machine);
      auto model = ModelOf(sim, Source::kFakeRoot);
      CHECK(model->warnings().empty());
      for (const Case& c : neurons) {
        INFO("Neuron " << c.neuron);
        CHECK(Addresses(model->NeuronEfaAddresses(c.neuron)) ==
              std::vector<std::string>{c.efa_pci});
        REQUIRE(model->NeuronEfas(c.neuron).size() == 1);
        CHECK(model->efas()[model->NeuronEfas(c.neuron)[0]].id == c.efa_id);
      }
      CHECK(model->NeuronEfas(16).empty());
      CHECK(model->NeuronEfas(-1).empty());
    }
  }
  SECTION("p5.48xlarge has no table") {
    SimRoot p5("p5.48xlarge");
    auto model = ModelOf(p5, Source::kFakeRoot);
    CHECK(model->neuron_table() == nullptr);
    CHECK(model->NeuronEfaAddresses(0).empty());
    CHECK(model->NeuronEfas(0).empty());
  }
}

TEST_CASE("HostModel warns about Neuron table entries that are no EFA here", "[topology]") {
  auto model = HostModel::Create(
      "trn1.32xlarge", {{"efa_0", Pci("0000:10:1a.0"), 0, "pci0000:10", std::nullopt}}, {});
  CHECK(model->NeuronEfas(0) == std::vector<size_t>{0});
  CHECK(model->NeuronEfas(2).empty());
  REQUIRE(model->warnings().size() == 14);
  CHECK(model->warnings()[0] ==
        "Neuron table trn1: Neuron 2 -> 0000:a0:1a.0, which is not an EFA here");
}

TEST_CASE("HostModel places EFAs that hwloc does not know by sysfs alone", "[topology]") {
  SimRoot p5("p5.48xlarge");
  SimRoot p4d("p4d.24xlarge");
  const Inventory inv = DiscoverEfaDevices(p5.roots());
  auto topology = LoadTopology({"", p4d.xml().string()});
  REQUIRE(topology.ok());
  auto model = HostModel::FromHwloc(inv, topology->get(), {"p5.48xlarge"});
  REQUIRE(model->efas().size() == 32);
  REQUIRE(model->warnings().size() == 32);
  CHECK(model->warnings()[0] ==
        "rdmap79s0 (0000:4f:00.0): not in the hwloc topology; placed by sysfs alone");
  CHECK(EfaLines(*model, "rdmap79s0") ==
        std::vector<std::string>{"efa rdmap79s0 0000:4f:00.0 numa=0 root=pci0000:44 switch=-",
                                 "  numa: 0000:10:1c.0 0000:10:1d.0 0000:20:1c.0 0000:20:1d.0",
                                 "  other: 0000:90:1c.0 0000:90:1d.0 0000:a0:1c.0 0000:a0:1d.0"});
}

TEST_CASE("ClassifyAccelerator knows NVIDIA GPUs and Neuron devices only", "[topology]") {
  struct Case {
    uint16_t vendor, device, class_id;
    std::optional<AcceleratorKind> kind;
  };
  const std::vector<Case> cases = {
      {0x10de, 0x2330, 0x0302, AcceleratorKind::kNvidiaGpu},  // H100
      {0x10de, 0x2237, 0x0300, AcceleratorKind::kNvidiaGpu},  // A10G
      {0x10de, 0x22a3, 0x0680, std::nullopt},                 // NVSwitch
      {0x10de, 0x22ba, 0x0403, std::nullopt},                 // a GPU's audio function
      {0x1d0f, 0x7064, 0x0880, AcceleratorKind::kNeuron},     // Inferentia
      {0x1d0f, 0x7067, 0x0880, AcceleratorKind::kNeuron},
      {0x1d0f, 0x7164, 0x0880, AcceleratorKind::kNeuron},  // Trainium
      {0x1d0f, 0x7264, 0x0880, AcceleratorKind::kNeuron},  // Inferentia2
      {0x1d0f, 0x7364, 0x0880, AcceleratorKind::kNeuron},  // Trainium2
      {0x1d0f, 0x7068, 0x0880, std::nullopt},
      {0x1d0f, 0xefa1, 0x0200, std::nullopt},  // EFA
      {0x1d0f, 0xec20, 0x0200, std::nullopt},  // ENA
      {0x15b3, 0x1021, 0x0207, std::nullopt},  // ConnectX-7
  };
  for (const Case& c : cases) {
    INFO(std::hex << c.vendor << ":" << c.device);
    CHECK(ClassifyAccelerator(c.vendor, c.device, c.class_id) == c.kind);
  }
}
