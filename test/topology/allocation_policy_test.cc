#include "topology/allocation_policy.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "test/sim/sim_root.h"
#include "test/topology/synthetic_host.h"
#include "topology/efa_discovery.h"
#include "topology/hwloc_loader.h"

using efa::sim::SimRoot;
using namespace efa::topology;

namespace {

// The model of a simulated machine, built once per test process.
const HostModel& Machine(const std::string& name) {
  static auto* models = new std::map<std::string, std::shared_ptr<const HostModel>>();
  auto it = models->find(name);
  if (it != models->end()) return *it->second;
  SimRoot sim(name);
  auto topology = LoadTopology({"", sim.xml().string()});
  REQUIRE(topology.ok());
  auto model = HostModel::FromHwloc(DiscoverEfaDevices(sim.roots()), topology->get());
  REQUIRE(model->warnings().empty());
  return *models->emplace(name, model).first->second;
}

std::vector<std::string> MachineNames() {
  std::vector<std::string> names;
  for (const auto& spec : efa::sim::BuiltinMachines()) names.push_back(spec.instance_type);
  return names;
}

PciAddress Pci(const std::string& short_bdf) {
  auto addr = PciAddress::Parse(short_bdf);
  REQUIRE(addr.has_value());
  return *addr;
}

// The ID of the EFA at "4f:00.0".
std::string IdAt(const HostModel& model, const std::string& short_bdf) {
  const PciAddress pci = Pci(short_bdf);
  for (const EfaPlacement& e : model.efas()) {
    if (e.pci == pci) return e.id;
  }
  FAIL("no EFA at " << short_bdf);
  return "";
}

// "4f:00.0" for a known EFA ID, the ID itself otherwise.
std::string ShortPci(const HostModel& model, const std::string& id) {
  auto e = model.FindEfa(id);
  return e ? model.efas()[*e].pci.ToString().substr(5) : id;
}

std::vector<std::string> AllIds(const HostModel& model) {
  std::vector<std::string> ids;
  for (const EfaPlacement& e : model.efas()) ids.push_back(e.id);
  return ids;
}

std::string Join(const std::vector<std::string>& v) { return absl::StrJoin(v, " "); }

}  // namespace

TEST_CASE("ChooseEfas meets the acceptance cases of every simulated machine", "[policy]") {
  struct Case {
    std::string what;
    std::string machine;
    std::vector<std::string> accelerators = {};  // target GPUs or Neuron devices, "53:00.0"
    std::vector<int> neurons = {};               // target Neuron indices
    int size = 0;
    std::vector<std::string> unavailable = {};  // EFAs not on offer (the others are)
    std::vector<std::string> must_include = {};
    std::vector<std::string> expected = {};
    std::vector<std::string> extra_available = {};  // IDs the model does not know
  };
  const std::vector<Case> cases = {
      // p5: one GPU and four EFAs behind each Nitro switch.
      {.what = "the EFAs behind the GPU's switch",
       .machine = "p5.48xlarge",
       .accelerators = {"53:00.0"},
       .size = 4,
       .expected = {"4f:00.0", "50:00.0", "51:00.0", "52:00.0"}},
      {.what = "two GPUs: the four behind each",
       .machine = "p5.48xlarge",
       .accelerators = {"53:00.0", "64:00.0"},
       .size = 8,
       .expected = {"4f:00.0", "50:00.0", "51:00.0", "52:00.0", "60:00.0", "61:00.0", "62:00.0",
                    "63:00.0"}},
      {.what = "two GPUs, four EFAs: two behind each",
       .machine = "p5.48xlarge",
       .accelerators = {"64:00.0", "53:00.0"},
       .size = 4,
       .expected = {"4f:00.0", "50:00.0", "60:00.0", "61:00.0"}},
      {.what = "a GPU whose switch is taken: its NUMA node next",
       .machine = "p5.48xlarge",
       .accelerators = {"53:00.0"},
       .size = 2,
       .unavailable = {"4f:00.0", "50:00.0", "51:00.0", "52:00.0"},
       .expected = {"60:00.0", "61:00.0"}},
      {.what = "no target: one whole switch, the first GPU's",
       .machine = "p5.48xlarge",
       .size = 4,
       .expected = {"4f:00.0", "50:00.0", "51:00.0", "52:00.0"}},
      {.what = "no target, first switch broken: the next whole one",
       .machine = "p5.48xlarge",
       .size = 4,
       .unavailable = {"4f:00.0"},
       .expected = {"60:00.0", "61:00.0", "62:00.0", "63:00.0"}},
      {.what = "no target, first switch half taken (its GPU too): the next",
       .machine = "p5.48xlarge",
       .size = 2,
       .unavailable = {"4f:00.0", "50:00.0"},
       .expected = {"60:00.0", "61:00.0"}},
      {.what = "no target, eight: two whole switches",
       .machine = "p5.48xlarge",
       .size = 8,
       .expected = {"4f:00.0", "50:00.0", "51:00.0", "52:00.0", "60:00.0", "61:00.0", "62:00.0",
                    "63:00.0"}},
      {.what = "no target, four with the first switches broken: a whole one on NUMA 1",
       .machine = "p5.48xlarge",
       .size = 4,
       .unavailable = {"4f:00.0", "60:00.0", "71:00.0", "82:00.0"},
       .expected = {"93:00.0", "94:00.0", "95:00.0", "96:00.0"}},
      {.what = "no target: the must-include EFA's switch",
       .machine = "p5.48xlarge",
       .size = 4,
       .must_include = {"c9:00.0"},
       .expected = {"c6:00.0", "c7:00.0", "c8:00.0", "c9:00.0"}},
      {.what = "no target, six with a must-include: its switch, then the first",
       .machine = "p5.48xlarge",
       .size = 6,
       .must_include = {"61:00.0"},
       .expected = {"4f:00.0", "50:00.0", "60:00.0", "61:00.0", "62:00.0", "63:00.0"}},
      {.what = "a GPU and a must-include elsewhere: the rest by the GPU",
       .machine = "p5.48xlarge",
       .accelerators = {"53:00.0"},
       .size = 4,
       .must_include = {"c9:00.0"},
       .expected = {"4f:00.0", "50:00.0", "51:00.0", "c9:00.0"}},
      {.what = "two GPUs, a must-include behind one: the other gets its share",
       .machine = "p5.48xlarge",
       .accelerators = {"53:00.0", "64:00.0"},
       .size = 4,
       .must_include = {"60:00.0"},
       .expected = {"4f:00.0", "50:00.0", "60:00.0", "61:00.0"}},
      {.what = "must-include beyond the size",
       .machine = "p5.48xlarge",
       .size = 1,
       .must_include = {"4f:00.0", "c9:00.0"},
       .expected = {"4f:00.0", "c9:00.0"}},
      {.what = "more than there is: everything",
       .machine = "p5.48xlarge",
       .accelerators = {"53:00.0"},
       .size = 40,
       .unavailable = {"4f:00.0", "c9:00.0"},
       .expected = {}},
      {.what = "an address that is no accelerator: as without target",
       .machine = "p5.48xlarge",
       .accelerators = {"00:1b.0"},
       .size = 4,
       .expected = {"4f:00.0", "50:00.0", "51:00.0", "52:00.0"}},
      {.what = "unknown IDs only when the known ones run out",
       .machine = "p4d.24xlarge",
       .size = 5,
       .unavailable = {"20:1b.0"},
       .expected = {"10:1b.0", "90:1b.0", "a0:1b.0", "efa_ghost", "efa_other"},
       .extra_available = {"efa_other", "efa_ghost", "efa_zzz"}},
      // p4d: two GPUs and one EFA per root complex, no switch.
      {.what = "the EFA on the GPU's root complex",
       .machine = "p4d.24xlarge",
       .accelerators = {"10:1c.0"},
       .size = 1,
       .expected = {"10:1b.0"}},
      {.what = "the EFA on the GPU's root complex (NUMA 1)",
       .machine = "p4d.24xlarge",
       .accelerators = {"90:1d.0"},
       .size = 1,
       .expected = {"90:1b.0"}},
      {.what = "then the same NUMA node",
       .machine = "p4d.24xlarge",
       .accelerators = {"10:1c.0"},
       .size = 2,
       .expected = {"10:1b.0", "20:1b.0"}},
      {.what = "p4d has four",
       .machine = "p4d.24xlarge",
       .size = 8,
       .expected = {"10:1b.0", "20:1b.0", "90:1b.0", "a0:1b.0"}},
      // p5en: two GPUs and four EFAs per switch.
      {.what = "the GPU's switch",
       .machine = "p5en.48xlarge",
       .accelerators = {"59:00.0"},
       .size = 4,
       .expected = {"55:00.0", "56:00.0", "57:00.0", "58:00.0"}},
      {.what = "two GPUs on one switch share its four",
       .machine = "p5en.48xlarge",
       .accelerators = {"59:00.0", "5a:00.0"},
       .size = 4,
       .expected = {"55:00.0", "56:00.0", "57:00.0", "58:00.0"}},
      {.what = "eight GPUs, four EFAs: one per switch",
       .machine = "p5en.48xlarge",
       .accelerators = {"59:00.0", "5a:00.0", "72:00.0", "73:00.0", "8b:00.0", "8c:00.0", "a4:00.0",
                        "a5:00.0"},
       .size = 4,
       .expected = {"55:00.0", "6e:00.0", "87:00.0", "a0:00.0"}},
      {.what = "no target, half a switch taken: its second GPU is likely free",
       .machine = "p5en.48xlarge",
       .size = 2,
       .unavailable = {"55:00.0", "56:00.0"},
       .expected = {"57:00.0", "58:00.0"}},
      // p6-b200: two GPUs and two EFAs per switch.
      {.what = "the GPU's switch",
       .machine = "p6-b200.48xlarge",
       .accelerators = {"58:00.0"},
       .size = 2,
       .expected = {"55:00.0", "56:00.0"}},
      {.what = "two GPUs on two switches",
       .machine = "p6-b200.48xlarge",
       .accelerators = {"57:00.0", "a2:00.0"},
       .size = 2,
       .expected = {"55:00.0", "a0:00.0"}},
      {.what = "no target: one switch",
       .machine = "p6-b200.48xlarge",
       .size = 2,
       .expected = {"55:00.0", "56:00.0"}},
      // g5: one EFA, NUMA unknown everywhere.
      {.what = "the only EFA",
       .machine = "g5.48xlarge",
       .accelerators = {"00:1a.0"},
       .size = 1,
       .expected = {"00:15.0"}},
      {.what = "the only EFA, without target",
       .machine = "g5.48xlarge",
       .size = 4,
       .expected = {"00:15.0"}},
      // Trainium: AWS's tables decide.
      {.what = "Neuron 0",
       .machine = "trn1.32xlarge",
       .neurons = {0},
       .size = 1,
       .expected = {"10:1a.0"}},
      {.what = "Neuron 2",
       .machine = "trn1.32xlarge",
       .neurons = {2},
       .size = 1,
       .expected = {"a0:1a.0"}},
      {.what = "Neuron 0 and 1 share an EFA: then its root complex",
       .machine = "trn1.32xlarge",
       .neurons = {0, 1},
       .size = 2,
       .expected = {"10:19.0", "10:1a.0"}},
      {.what = "no target: one root complex",
       .machine = "trn1.32xlarge",
       .size = 2,
       .expected = {"10:19.0", "10:1a.0"}},
      {.what = "Neuron 5",
       .machine = "trn1n.32xlarge",
       .neurons = {5},
       .size = 1,
       .expected = {"20:18.0"}},
      {.what = "Neuron 0",
       .machine = "trn2.48xlarge",
       .neurons = {0},
       .size = 1,
       .expected = {"c9:00.0"}},
      {.what = "Neuron 0, two: its switch",
       .machine = "trn2.48xlarge",
       .neurons = {0},
       .size = 2,
       .expected = {"c9:00.0", "ca:00.0"}},
      {.what = "Neuron 4 and 5",
       .machine = "trn2.48xlarge",
       .neurons = {5, 4},
       .size = 2,
       .expected = {"57:00.0", "6c:00.0"}},
      {.what = "a Neuron device by PCI address",
       .machine = "trn2.48xlarge",
       .accelerators = {"cb:00.0"},
       .size = 2,
       .expected = {"c9:00.0", "ca:00.0"}},
      {.what = "a Neuron index beyond the table: as without target",
       .machine = "trn2.48xlarge",
       .neurons = {16},
       .size = 2,
       .expected = {"56:00.0", "57:00.0"}},
      {.what = "nothing on a node without EFA", .machine = "m5.8xlarge", .size = 2, .expected = {}},
  };
  for (const Case& c : cases) {
    SECTION(c.machine + ": " + c.what) {
      const HostModel& model = Machine(c.machine);
      AllocationRequest request;
      std::set<std::string> unavailable;
      for (const std::string& bdf : c.unavailable) unavailable.insert(IdAt(model, bdf));
      for (const std::string& id : AllIds(model)) {
        if (!unavailable.contains(id)) request.available.push_back(id);
      }
      for (const std::string& id : c.extra_available) request.available.push_back(id);
      for (const std::string& bdf : c.must_include)
        request.must_include.push_back(IdAt(model, bdf));
      for (const std::string& bdf : c.accelerators) request.target_accelerators.push_back(Pci(bdf));
      request.target_neuron_indices = c.neurons;
      request.size = c.size;

      std::vector<std::string> got;
      for (const std::string& id : ChooseEfas(model, request)) got.push_back(ShortPci(model, id));
      std::vector<std::string> expected = c.expected;
      if (c.what == "more than there is: everything") {
        expected.clear();
        for (const std::string& id : request.available) expected.push_back(ShortPci(model, id));
      }
      CHECK(Join(got) == Join(expected));
    }
  }
}

namespace {

struct RandomCase {
  AllocationRequest request;
  std::set<std::string> offered;  // available ∪ must-include
};

// A random request; draws use the raw mt19937 output, which the standard
// fixes, so the cases are the same everywhere.
RandomCase MakeRandomCase(const HostModel& model, std::mt19937& rng) {
  auto below = [&rng](size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng() % n); };
  RandomCase c;
  const std::vector<std::string> ids = AllIds(model);
  const size_t keep_per_mille = below(1001);
  for (const std::string& id : ids) {
    if (below(1000) < keep_per_mille) c.request.available.push_back(id);
  }
  if (below(10) == 0) c.request.available.push_back("efa_unknown");
  if (below(10) == 0 && !c.request.available.empty()) {
    c.request.available.push_back(c.request.available.front());  // a duplicate
  }
  c.request.size = static_cast<int>(below(ids.size() + 4));
  const size_t musts = std::min<size_t>(below(3), c.request.available.size());
  for (size_t i = 0; i < musts && static_cast<int>(i) < c.request.size; ++i) {
    c.request.must_include.push_back(c.request.available[below(c.request.available.size())]);
  }
  switch (below(3)) {
    case 0:
      break;
    case 1:
      for (size_t i = 0, n = below(4); i < n && !model.accelerators().empty(); ++i) {
        c.request.target_accelerators.push_back(
            model.accelerators()[below(model.accelerators().size())].pci);
      }
      break;
    case 2:
      for (size_t i = 0, n = below(4); i < n; ++i) {
        c.request.target_neuron_indices.push_back(static_cast<int>(below(18)) - 1);
      }
      break;
  }
  c.offered.insert(c.request.available.begin(), c.request.available.end());
  c.offered.insert(c.request.must_include.begin(), c.request.must_include.end());
  return c;
}

template <typename T>
void Shuffle(std::vector<T>& v, std::mt19937& rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng() % i]);
}

// The distance class of an EFA from an accelerator.
Distance DistanceOf(const HostModel& model, size_t efa, size_t accel) {
  for (const Neighbour& n : model.Neighbours(efa)) {
    if (n.accelerator == accel) return n.distance;
  }
  return Distance::kOther;
}

// For each EFA, its node in the placement tree at each depth (root 0,
// NUMA node 1, root complex 2, leaf 3).
std::vector<std::vector<int>> TreeGroups(const HostModel& model) {
  const auto& tree = model.placement_tree();
  std::vector<int> parent(tree.size(), -1);
  for (size_t i = 0; i < tree.size(); ++i) {
    for (int c : tree[i].children) parent[static_cast<size_t>(c)] = static_cast<int>(i);
  }
  std::vector<std::vector<int>> groups(model.efas().size(), std::vector<int>(4, -1));
  for (size_t i = 0; i < tree.size(); ++i) {
    for (size_t e : tree[i].efas) {
      int node = static_cast<int>(i);
      for (int depth = 3; depth >= 0 && node >= 0; --depth) {
        groups[e][static_cast<size_t>(depth)] = node;
        node = parent[static_cast<size_t>(node)];
      }
    }
  }
  return groups;
}

void CheckProperties(const HostModel& model, std::mt19937& rng, int rounds) {
  for (int round = 0; round < rounds; ++round) {
    RandomCase c = MakeRandomCase(model, rng);
    const AllocationRequest& r = c.request;
    const std::vector<std::string> got = ChooseEfas(model, r);
    INFO("available: " << Join(r.available) << "\nmust: " << Join(r.must_include)
                       << "\nsize: " << r.size << "\ngot: " << Join(got));

    const std::set<std::string> unique(got.begin(), got.end());
    REQUIRE(unique.size() == got.size());
    for (const std::string& id : got) REQUIRE(c.offered.contains(id));
    for (const std::string& id : r.must_include) REQUIRE(unique.contains(id));
    REQUIRE(got.size() == std::min<size_t>(static_cast<size_t>(r.size), c.offered.size()));

    // Same input, same output, whatever the order of the lists.
    REQUIRE(ChooseEfas(model, r) == got);
    AllocationRequest shuffled = r;
    Shuffle(shuffled.available, rng);
    Shuffle(shuffled.must_include, rng);
    Shuffle(shuffled.target_accelerators, rng);
    Shuffle(shuffled.target_neuron_indices, rng);
    REQUIRE(ChooseEfas(model, shuffled) == got);

    // Known EFAs in PCI order, then unknown IDs.
    std::vector<size_t> indices;
    bool unknown_seen = false;
    for (const std::string& id : got) {
      auto e = model.FindEfa(id);
      REQUIRE_FALSE((e.has_value() && unknown_seen));
      unknown_seen |= !e.has_value();
      if (e) indices.push_back(*e);
    }
    REQUIRE(std::is_sorted(indices.begin(), indices.end()));

    // With one GPU target and nothing forced: no unchosen free EFA is nearer.
    if (r.must_include.empty() && r.target_neuron_indices.empty() &&
        r.target_accelerators.size() == 1) {
      const size_t accel = model.FindAccelerator(r.target_accelerators[0]).value();
      Distance farthest_chosen = Distance::kSameSwitch;
      for (size_t e : indices)
        farthest_chosen = std::max(farthest_chosen, DistanceOf(model, e, accel));
      for (const std::string& id : r.available) {
        auto e = model.FindEfa(id);
        if (!e || unique.contains(id)) continue;
        REQUIRE(DistanceOf(model, *e, accel) >= farthest_chosen);
      }
    }

    // Without targets or must-include: inside one group of the placement
    // tree (switch, root complex, NUMA node) whenever one has room for all.
    if (r.must_include.empty() && r.target_accelerators.empty() &&
        r.target_neuron_indices.empty() && r.size > 0) {
      const std::vector<std::vector<int>> groups = TreeGroups(model);  // [efa][depth]
      for (int depth = 3; depth >= 1; --depth) {
        std::map<int, int> free_in;
        for (const std::string& id : c.offered) {
          if (auto e = model.FindEfa(id)) ++free_in[groups[*e][static_cast<size_t>(depth)]];
        }
        bool fits = false;
        for (auto [group, n] : free_in) fits |= n >= r.size;
        if (!fits) continue;
        std::set<int> used;
        for (size_t e : indices) used.insert(groups[e][static_cast<size_t>(depth)]);
        INFO("depth " << depth);
        REQUIRE(used.size() == 1);
      }
    }
  }
}

}  // namespace

TEST_CASE("ChooseEfas keeps its promises on random requests on every machine", "[policy]") {
  for (const std::string& name : MachineNames()) {
    SECTION(name) {
      std::mt19937 rng(20240604);
      CheckProperties(Machine(name), rng, 400);
    }
  }
}

TEST_CASE("ChooseEfas keeps its promises on a large synthetic node", "[policy]") {
  auto model = SyntheticHost(/*switches=*/128, /*efas_per_switch=*/8, /*gpus_per_switch=*/1,
                             /*numa_nodes=*/4);
  REQUIRE(model->efas().size() == 1024);
  REQUIRE(model->accelerators().size() == 128);
  std::mt19937 rng(7);
  CheckProperties(*model, rng, 60);
}

TEST_CASE("ChooseEfas spreads over many targets on a synthetic node", "[policy]") {
  auto model = SyntheticHost(64, 8, 2, 2);  // 512 EFAs, 128 GPUs
  AllocationRequest request;
  request.available = AllIds(*model);
  for (size_t a = 0; a < model->accelerators().size(); a += 2) {
    request.target_accelerators.push_back(model->accelerators()[a].pci);
  }
  request.size = 256;  // four per target, all behind the target's switch
  const std::vector<std::string> got = ChooseEfas(*model, request);
  REQUIRE(got.size() == 256);
  std::map<int, int> per_switch;
  for (const std::string& id : got)
    ++per_switch[model->EfaGroup(GroupLevel::kSwitch, *model->FindEfa(id))];
  CHECK(per_switch.size() == 64);
  for (auto [sw, n] : per_switch) CHECK(n == 4);
}

TEST_CASE("ChooseEfas returns nothing for nothing", "[policy]") {
  const HostModel& model = Machine("p5.48xlarge");
  CHECK(ChooseEfas(model, {}).empty());
  AllocationRequest request;
  request.available = AllIds(model);
  request.size = 0;
  CHECK(ChooseEfas(model, request).empty());
  request.size = -3;
  CHECK(ChooseEfas(model, request).empty());
  request.size = 4;
  request.available.clear();
  CHECK(ChooseEfas(model, request).empty());
}
