#include "topology/host_model.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace efa::topology {
namespace {

constexpr uint16_t kNvidiaVendorId = 0x10de;
constexpr size_t kLevels = 3;

bool IsPciBridge(hwloc_obj_t obj) {
  return obj != nullptr && obj->type == HWLOC_OBJ_BRIDGE &&
         obj->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_PCI;
}

bool IsHostBridge(hwloc_obj_t obj) {
  return obj != nullptr && obj->type == HWLOC_OBJ_BRIDGE &&
         obj->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST;
}

PciAddress AddressOf(const hwloc_obj_attr_u::hwloc_pcidev_attr_s& pci) {
  return {static_cast<uint16_t>(pci.domain), pci.bus, pci.dev, pci.func};
}

// "pci0000:44", the name sysfs gives the host bridge above `obj`.
std::string RootComplexOf(hwloc_obj_t obj) {
  for (hwloc_obj_t p = obj->parent; p != nullptr; p = p->parent) {
    if (IsHostBridge(p)) {
      return absl::StrFormat("pci%04x:%02x", p->attr->bridge.downstream.pci.domain,
                             p->attr->bridge.downstream.pci.secondary_bus);
    }
  }
  return "";
}

// The topmost PCI bridge above `obj`, followed down through point-to-point
// links (a root port leads to exactly one bridge: the switch's upstream
// port) to the first bridge that fans out or leads to a device. Every
// device whose common ancestor with `obj` is a PCI bridge gets the same
// answer, so it names the switch the two share.
std::optional<PciAddress> SwitchOf(hwloc_obj_t obj) {
  hwloc_obj_t top = nullptr;
  for (hwloc_obj_t p = obj->parent; IsPciBridge(p); p = p->parent) top = p;
  if (top == nullptr) return std::nullopt;
  while (top->io_arity == 1 && IsPciBridge(top->io_first_child)) top = top->io_first_child;
  return AddressOf(top->attr->bridge.upstream.pci);
}

// The NUMA node the device is local to: the only node in the nodeset of its
// first non-I/O ancestor; nullopt when that covers several nodes (g5's
// devices with numa_node -1 hang off the Machine object).
std::optional<int> NumaOf(hwloc_topology_t topology, hwloc_obj_t obj) {
  hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topology, obj);
  if (anc == nullptr || anc->nodeset == nullptr || hwloc_bitmap_weight(anc->nodeset) != 1) {
    return std::nullopt;
  }
  return hwloc_bitmap_first(anc->nodeset);
}

// The closest common ancestor of two objects. hwloc_get_common_ancestor_obj()
// cannot be used on I/O objects: it compares depths, all bridges share one
// virtual depth and all PCI devices another, so for two devices nested at
// different PCIe depths it walks past the root (hwloc 2.9 crashes on the
// simulated p5 for EFA 4f:00.0 and NVSwitch 00:1b.0). Walk the parent chains.
hwloc_obj_t CommonAncestor(hwloc_obj_t a, hwloc_obj_t b) {
  std::vector<hwloc_obj_t> chain;
  for (hwloc_obj_t p = a; p != nullptr; p = p->parent) chain.push_back(p);
  for (hwloc_obj_t q = b; q != nullptr; q = q->parent) {
    if (std::find(chain.begin(), chain.end(), q) != chain.end()) return q;
  }
  return nullptr;
}

// Debian's abseil has its own string_view, which StrCat wants.
absl::string_view AbslView(std::string_view s) { return {s.data(), s.size()}; }

bool SameNuma(const std::optional<int>& a, const std::optional<int>& b) {
  return a.has_value() && b.has_value() && *a == *b;
}

// The distance class by the rule of FACTS.md: the closest common ancestor
// is a PCI bridge (same switch), a host bridge (same root complex) or not an
// I/O object (then the NUMA nodes decide).
Distance DistanceInTree(hwloc_obj_t efa, const EfaPlacement& efa_place, hwloc_obj_t accel,
                        const Accelerator& accel_place) {
  hwloc_obj_t common = CommonAncestor(efa, accel);
  if (IsPciBridge(common)) return Distance::kSameSwitch;
  if (IsHostBridge(common)) return Distance::kSameRootComplex;
  return SameNuma(efa_place.numa_node, accel_place.numa_node) ? Distance::kSameNuma
                                                              : Distance::kOther;
}

// The same classes from the placements alone.
Distance DistanceByPlacement(const EfaPlacement& efa, const Accelerator& accel) {
  if (efa.pcie_switch && efa.pcie_switch == accel.pcie_switch) return Distance::kSameSwitch;
  if (!efa.root_complex.empty() && efa.root_complex == accel.root_complex) {
    return Distance::kSameRootComplex;
  }
  return SameNuma(efa.numa_node, accel.numa_node) ? Distance::kSameNuma : Distance::kOther;
}

void SortNeighbours(std::vector<Neighbour>& neighbours) {
  std::stable_sort(neighbours.begin(), neighbours.end(),
                   [](const Neighbour& a, const Neighbour& b) { return a.distance < b.distance; });
}

std::string NumaText(const std::optional<int>& numa) { return numa ? absl::StrCat(*numa) : "?"; }

std::string SwitchText(const std::optional<PciAddress>& sw) { return sw ? sw->ToString() : "-"; }

}  // namespace

std::string_view AcceleratorKindName(AcceleratorKind kind) {
  return kind == AcceleratorKind::kNeuron ? "neuron" : "gpu";
}

std::optional<AcceleratorKind> ClassifyAccelerator(uint16_t vendor, uint16_t device,
                                                   uint16_t class_id) {
  if (vendor == kNvidiaVendorId && (class_id == 0x0300 || class_id == 0x0302)) {
    return AcceleratorKind::kNvidiaGpu;
  }
  if (vendor == kAmazonVendorId && ((device >= 0x7064 && device <= 0x7067) || device == 0x7164 ||
                                    device == 0x7264 || device == 0x7364)) {
    return AcceleratorKind::kNeuron;
  }
  return std::nullopt;
}

std::string_view DistanceName(Distance distance) {
  switch (distance) {
    case Distance::kSameSwitch:
      return "switch";
    case Distance::kSameRootComplex:
      return "root-complex";
    case Distance::kSameNuma:
      return "numa";
    case Distance::kOther:
      break;
  }
  return "other";
}

std::shared_ptr<const HostModel> HostModel::FromHwloc(const Inventory& inventory,
                                                      hwloc_topology_t topology,
                                                      const HostModelOptions& options) {
  std::vector<std::string> warnings;
  std::map<PciAddress, hwloc_obj_t> pci_objects;
  std::vector<std::pair<Accelerator, hwloc_obj_t>> accels;
  for (hwloc_obj_t obj = hwloc_get_next_pcidev(topology, nullptr); obj != nullptr;
       obj = hwloc_get_next_pcidev(topology, obj)) {
    const hwloc_obj_attr_u::hwloc_pcidev_attr_s& pci = obj->attr->pcidev;
    pci_objects.emplace(AddressOf(pci), obj);
    auto kind = ClassifyAccelerator(pci.vendor_id, pci.device_id, pci.class_id);
    if (!kind) continue;
    Accelerator a;
    a.pci = AddressOf(pci);
    a.kind = *kind;
    a.vendor_id = pci.vendor_id;
    a.device_id = pci.device_id;
    a.numa_node = NumaOf(topology, obj);
    a.root_complex = RootComplexOf(obj);
    a.pcie_switch = SwitchOf(obj);
    accels.emplace_back(std::move(a), obj);
  }
  std::sort(accels.begin(), accels.end(),
            [](const auto& x, const auto& y) { return x.first.pci < y.first.pci; });

  // The inventory is sorted by PCI address, then ID: the model's order.
  std::vector<EfaPlacement> efas;
  std::vector<hwloc_obj_t> efa_objects;
  for (const EfaDevice& dev : inventory.devices) {
    EfaPlacement p{dev.ibdev, dev.pci, dev.numa_node, dev.root_complex, std::nullopt};
    auto it = pci_objects.find(dev.pci);
    hwloc_obj_t obj = it == pci_objects.end() ? nullptr : it->second;
    if (obj == nullptr) {
      warnings.push_back(absl::StrCat(dev.ibdev, " (", dev.pci.ToString(),
                                      "): not in the hwloc topology; placed by sysfs alone"));
    } else {
      p.pcie_switch = SwitchOf(obj);
      std::string root = RootComplexOf(obj);
      if (root != dev.root_complex) {
        warnings.push_back(absl::StrCat(dev.ibdev, " (", dev.pci.ToString(),
                                        "): hwloc puts it under ",
                                        root.empty() ? "no host bridge" : root, ", sysfs under ",
                                        dev.root_complex.empty() ? "none" : dev.root_complex));
        if (!root.empty()) p.root_complex = std::move(root);
      }
    }
    efas.push_back(std::move(p));
    efa_objects.push_back(obj);
  }

  std::vector<Accelerator> accelerators;
  for (auto& [a, obj] : accels) accelerators.push_back(a);
  std::vector<std::vector<Neighbour>> neighbours(efas.size());
  for (size_t e = 0; e < efas.size(); ++e) {
    for (size_t a = 0; a < accels.size(); ++a) {
      Distance d = efa_objects[e] != nullptr
                       ? DistanceInTree(efa_objects[e], efas[e], accels[a].second, accelerators[a])
                       : DistanceByPlacement(efas[e], accelerators[a]);
      neighbours[e].push_back({a, d});
    }
    SortNeighbours(neighbours[e]);
  }

  std::string instance_type = options.instance_type;
  if (instance_type.empty()) {
    const char* dmi = hwloc_obj_get_info_by_name(hwloc_get_root_obj(topology), "DMIProductName");
    if (dmi != nullptr) instance_type = dmi;
  }
  return std::shared_ptr<const HostModel>(
      new HostModel(std::move(instance_type), std::move(efas), std::move(accelerators),
                    std::move(neighbours), std::move(warnings)));
}

std::shared_ptr<const HostModel> HostModel::Create(std::string instance_type,
                                                   std::vector<EfaPlacement> efas,
                                                   std::vector<Accelerator> accelerators) {
  std::stable_sort(efas.begin(), efas.end(), [](const EfaPlacement& a, const EfaPlacement& b) {
    return std::tie(a.pci, a.id) < std::tie(b.pci, b.id);
  });
  std::stable_sort(accelerators.begin(), accelerators.end(),
                   [](const Accelerator& a, const Accelerator& b) { return a.pci < b.pci; });
  std::vector<std::vector<Neighbour>> neighbours(efas.size());
  for (size_t e = 0; e < efas.size(); ++e) {
    neighbours[e].reserve(accelerators.size());
    for (size_t a = 0; a < accelerators.size(); ++a) {
      neighbours[e].push_back({a, DistanceByPlacement(efas[e], accelerators[a])});
    }
    SortNeighbours(neighbours[e]);
  }
  return std::shared_ptr<const HostModel>(new HostModel(std::move(instance_type), std::move(efas),
                                                        std::move(accelerators),
                                                        std::move(neighbours), {}));
}

HostModel::HostModel(std::string instance_type, std::vector<EfaPlacement> efas,
                     std::vector<Accelerator> accelerators,
                     std::vector<std::vector<Neighbour>> neighbours,
                     std::vector<std::string> warnings)
    : instance_type_(std::move(instance_type)),
      efas_(std::move(efas)),
      accelerators_(std::move(accelerators)),
      neighbours_(std::move(neighbours)),
      warnings_(std::move(warnings)) {
  for (size_t i = 0; i < efas_.size(); ++i) efa_by_id_.emplace(efas_[i].id, i);
  IndexGroups();
  BuildPlacementTree();
  MapNeuronTable();
}

void HostModel::IndexGroups() {
  efa_groups_.assign(kLevels, std::vector<int>(efas_.size(), -1));
  accelerator_groups_.assign(kLevels, std::vector<int>(accelerators_.size(), -1));
  group_efas_.assign(kLevels, {});
  std::map<PciAddress, int> switches;
  std::map<std::string, int> roots;
  std::map<int, int> numas;
  // Numbers a key's group on first sight, so that groups come in PCI order.
  auto group_of = [this](auto& ids, const auto& key, GroupLevel level) {
    auto [it, added] = ids.emplace(key, static_cast<int>(ids.size()));
    if (added) group_efas_[static_cast<size_t>(level)].emplace_back();
    return it->second;
  };
  for (size_t e = 0; e < efas_.size(); ++e) {
    const EfaPlacement& p = efas_[e];
    int groups[kLevels] = {-1, -1, -1};
    if (p.pcie_switch) groups[0] = group_of(switches, *p.pcie_switch, GroupLevel::kSwitch);
    if (!p.root_complex.empty()) {
      groups[1] = group_of(roots, p.root_complex, GroupLevel::kRootComplex);
    }
    if (p.numa_node) groups[2] = group_of(numas, *p.numa_node, GroupLevel::kNuma);
    for (size_t level = 0; level < kLevels; ++level) {
      efa_groups_[level][e] = groups[level];
      if (groups[level] >= 0) group_efas_[level][static_cast<size_t>(groups[level])].push_back(e);
    }
  }
  for (size_t a = 0; a < accelerators_.size(); ++a) {
    const Accelerator& acc = accelerators_[a];
    if (acc.pcie_switch) {
      auto it = switches.find(*acc.pcie_switch);
      if (it != switches.end()) accelerator_groups_[0][a] = it->second;
    }
    if (auto it = roots.find(acc.root_complex); it != roots.end()) {
      accelerator_groups_[1][a] = it->second;
    }
    if (acc.numa_node) {
      auto it = numas.find(*acc.numa_node);
      if (it != numas.end()) accelerator_groups_[2][a] = it->second;
    }
  }
}

void HostModel::BuildPlacementTree() {
  tree_.clear();
  if (efas_.empty()) return;
  tree_.emplace_back();  // the root
  auto add_child = [this](int parent) {
    tree_.emplace_back();
    const int node = static_cast<int>(tree_.size() - 1);
    tree_[static_cast<size_t>(parent)].children.push_back(node);
    return node;
  };
  const int switch_count = static_cast<int>(GroupCount(GroupLevel::kSwitch));
  // Keys: NUMA group (-1 unknown); (NUMA node, root group); (root node, leaf
  // key), where a leaf key is a switch group, or switch_count + root group
  // for the EFAs directly on a root complex. EFAs come in PCI order, so
  // children come in the order of their first EFA.
  std::map<int, int> numa_nodes;
  std::map<std::pair<int, int>, int> root_nodes;
  std::map<std::pair<int, int>, int> leaves;
  std::map<int, int> leaf_by_switch;  // first leaf of each switch group
  std::map<int, int> leaf_by_root;    // a root group's direct leaf, else its first leaf
  for (size_t e = 0; e < efas_.size(); ++e) {
    const int numa = EfaGroup(GroupLevel::kNuma, e);
    const int root = EfaGroup(GroupLevel::kRootComplex, e);
    const int sw = EfaGroup(GroupLevel::kSwitch, e);
    auto n = numa_nodes.find(numa);
    if (n == numa_nodes.end()) n = numa_nodes.emplace(numa, add_child(0)).first;
    auto r = root_nodes.find({n->second, root});
    if (r == root_nodes.end())
      r = root_nodes.emplace(std::pair{n->second, root}, add_child(n->second)).first;
    const int leaf_key = sw >= 0 ? sw : (root >= 0 ? switch_count + root : -1);
    auto l = leaves.find({r->second, leaf_key});
    if (l == leaves.end()) {
      l = leaves.emplace(std::pair{r->second, leaf_key}, add_child(r->second)).first;
      if (sw >= 0) leaf_by_switch.emplace(sw, l->second);
      if (root >= 0 && (sw < 0 || !leaf_by_root.contains(root))) leaf_by_root[root] = l->second;
    }
    tree_[static_cast<size_t>(l->second)].efas.push_back(e);
  }
  // An accelerator joins the leaf of its switch, else a leaf of its root
  // complex (the EFAs directly on it when there are some).
  for (size_t a = 0; a < accelerators_.size(); ++a) {
    const int sw = AcceleratorGroup(GroupLevel::kSwitch, a);
    const int root = AcceleratorGroup(GroupLevel::kRootComplex, a);
    int leaf = -1;
    if (auto it = leaf_by_switch.find(sw); sw >= 0 && it != leaf_by_switch.end()) {
      leaf = it->second;
    } else if (auto jt = leaf_by_root.find(root); root >= 0 && jt != leaf_by_root.end()) {
      leaf = jt->second;
    }
    if (leaf >= 0) tree_[static_cast<size_t>(leaf)].accelerators.push_back(a);
  }
}

void HostModel::MapNeuronTable() {
  neuron_table_ = FindNeuronEfaTable(instance_type_);
  if (neuron_table_ == nullptr) return;
  std::map<PciAddress, size_t> by_pci;
  for (size_t e = 0; e < efas_.size(); ++e) by_pci.emplace(efas_[e].pci, e);
  for (size_t n = 0; n < neuron_table_->efas.size(); ++n) {
    std::vector<size_t> present;
    for (const PciAddress& pci : neuron_table_->efas[n]) {
      auto it = by_pci.find(pci);
      if (it != by_pci.end()) {
        present.push_back(it->second);
      } else {
        warnings_.push_back(absl::StrCat("Neuron table ", AbslView(neuron_table_->name),
                                         ": Neuron ", n, " -> ", pci.ToString(),
                                         ", which is not an EFA here"));
      }
    }
    neuron_efas_.push_back(std::move(present));
  }
}

std::optional<size_t> HostModel::FindEfa(std::string_view id) const {
  auto it = efa_by_id_.find(AbslView(id));
  if (it == efa_by_id_.end()) return std::nullopt;
  return it->second;
}

std::optional<size_t> HostModel::FindAccelerator(const PciAddress& pci) const {
  auto it = std::lower_bound(accelerators_.begin(), accelerators_.end(), pci,
                             [](const Accelerator& a, const PciAddress& p) { return a.pci < p; });
  if (it == accelerators_.end() || it->pci != pci) return std::nullopt;
  return static_cast<size_t>(it - accelerators_.begin());
}

std::vector<PciAddress> HostModel::NeuronEfaAddresses(int index) const {
  if (neuron_table_ == nullptr || index < 0 ||
      static_cast<size_t>(index) >= neuron_table_->efas.size()) {
    return {};
  }
  return neuron_table_->efas[static_cast<size_t>(index)];
}

const std::vector<size_t>& HostModel::NeuronEfas(int index) const {
  static const std::vector<size_t> kNone;
  if (index < 0 || static_cast<size_t>(index) >= neuron_efas_.size()) return kNone;
  return neuron_efas_[static_cast<size_t>(index)];
}

std::string HostModel::Describe() const {
  std::string out = absl::StrCat(
      "instance-type ", instance_type_.empty() ? "?" : instance_type_, "\nneuron-table ",
      neuron_table_ == nullptr ? "none" : AbslView(neuron_table_->name), "\n");
  for (const Accelerator& a : accelerators_) {
    absl::StrAppendFormat(&out, "accelerator %s %s %04x:%04x numa=%s root=%s switch=%s\n",
                          a.pci.ToString(), AcceleratorKindName(a.kind), a.vendor_id, a.device_id,
                          NumaText(a.numa_node), a.root_complex, SwitchText(a.pcie_switch));
  }
  for (size_t e = 0; e < efas_.size(); ++e) {
    const EfaPlacement& p = efas_[e];
    absl::StrAppend(&out, "efa ", p.id, " ", p.pci.ToString(), " numa=", NumaText(p.numa_node),
                    " root=", p.root_complex, " switch=", SwitchText(p.pcie_switch), "\n");
    const std::vector<Neighbour>& near = neighbours_[e];
    for (size_t i = 0; i < near.size();) {
      const Distance d = near[i].distance;
      absl::StrAppend(&out, "  ", AbslView(DistanceName(d)), ":");
      for (; i < near.size() && near[i].distance == d; ++i) {
        absl::StrAppend(&out, " ", accelerators_[near[i].accelerator].pci.ToString());
      }
      out += "\n";
    }
  }
  for (size_t n = 0; n < neuron_efas_.size(); ++n) {
    absl::StrAppend(&out, "neuron ", n, " ->");
    for (size_t e : neuron_efas_[n]) absl::StrAppend(&out, " ", efas_[e].id);
    out += "\n";
  }
  for (const std::string& w : warnings_) absl::StrAppend(&out, "warning ", w, "\n");
  return out;
}

}  // namespace efa::topology
