// The host model: an immutable snapshot of where every EFA and accelerator
// sits in the PCIe tree (switch, root complex, NUMA node) and how far each
// EFA is from each accelerator. Built once per discovery from the EFA
// inventory and an hwloc topology, or from plain data (tests, benchmarks),
// and shared as std::shared_ptr<const HostModel> so that the plugin can swap
// snapshots atomically while readers keep the one they hold.
#pragma once

#include <hwloc.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "topology/efa_device.h"
#include "topology/neuron_efa_map.h"
#include "topology/pci_address.h"

namespace efa::topology {

enum class AcceleratorKind : uint8_t { kNvidiaGpu, kNeuron };

// "gpu" or "neuron".
std::string_view AcceleratorKindName(AcceleratorKind kind);

// Which accelerator a PCI function is, from its IDs and its 16-bit class
// (class << 8 | subclass, as hwloc reports it): NVIDIA GPUs are vendor 0x10de
// with class 0x0300 or 0x0302 (an NVSwitch, 0x0680, is not one); Neuron
// devices are 1d0f:7064-7067, 7164, 7264 and 7364 (the device ID alone tells
// them apart from EFA and ENA). Returns nullopt for everything else.
std::optional<AcceleratorKind> ClassifyAccelerator(uint16_t vendor, uint16_t device,
                                                   uint16_t class_id);

// How close an accelerator is to an EFA, nearest first.
enum class Distance : uint8_t {
  kSameSwitch = 0,       // behind the same PCIe switch
  kSameRootComplex = 1,  // under the same host bridge
  kSameNuma = 2,         // on the same (known) NUMA node
  kOther = 3,
};

// "switch", "root-complex", "numa" or "other".
std::string_view DistanceName(Distance distance);

// Where a device sits. `pcie_switch` is the PCIe switch above it, named by
// its upstream port, or, without a switch, the bridge (root port) that
// leads to it; nullopt when the device is on the root bus. Two devices have
// the same `pcie_switch` exactly when their closest common ancestor in the
// PCI tree is a PCI bridge.
struct Accelerator {
  PciAddress pci;
  AcceleratorKind kind = AcceleratorKind::kNvidiaGpu;
  uint16_t vendor_id = 0;
  uint16_t device_id = 0;
  std::optional<int> numa_node;  // nullopt: not local to a single NUMA node
  std::string root_complex;      // "pci0000:44"; empty when unknown
  std::optional<PciAddress> pcie_switch;
};

struct EfaPlacement {
  std::string id;  // the kubelet device ID (the verbs device name)
  PciAddress pci;
  std::optional<int> numa_node;  // as sysfs says (the value reported to the kubelet)
  std::string root_complex;      // "pci0000:44": the host bridge, as DRA's pcieRoot
  std::optional<PciAddress> pcie_switch;
};

struct Neighbour {
  size_t accelerator = 0;  // index into HostModel::accelerators()
  Distance distance = Distance::kOther;
  bool operator==(const Neighbour&) const = default;
};

// Levels at which EFAs are grouped. Groups are numbered densely per level in
// the order of their first EFA (PCI order).
enum class GroupLevel : uint8_t { kSwitch = 0, kRootComplex = 1, kNuma = 2 };

// A node of the placement tree, the hierarchy that allocations without
// targets keep whole: root -> NUMA nodes -> root complexes -> leaves. A leaf
// holds the EFAs behind one PCIe switch, or those directly on a root
// complex, with the accelerators placed beside them.
struct PlacementNode {
  std::vector<int> children;         // indices into placement_tree(), always greater
  std::vector<size_t> efas;          // leaves only: EFA indices, ascending
  std::vector<size_t> accelerators;  // leaves only: accelerator indices, ascending
};

struct HostModelOptions {
  // The instance type, e.g. from configuration; when empty, the DMI product
  // name that hwloc read (the Machine object's DMIProductName info).
  std::string instance_type;
};

class HostModel {
 public:
  // Builds the model of the EFAs in `inventory` (all of them, healthy or
  // not) and of every accelerator in `topology`, which must have been
  // loaded with PCI devices and bridges kept (LoadTopology does). An EFA's
  // NUMA node is the one sysfs gave (what the kubelet is told); an
  // accelerator's is its hwloc locality. Distances follow from the closest
  // common ancestor in hwloc's PCI tree: a PCI bridge (same switch), a host
  // bridge (same root complex), else the NUMA nodes decide. EFAs hwloc does
  // not know keep the root complex sysfs gave them and get no switch; such
  // mismatches are described in warnings(). Never fails. Reads only
  // `topology` (no I/O).
  static std::shared_ptr<const HostModel> FromHwloc(const Inventory& inventory,
                                                    hwloc_topology_t topology,
                                                    const HostModelOptions& options = {});

  // Builds a model from plain data, without hwloc (tests, benchmarks,
  // synthetic nodes). Devices are sorted by PCI address (EFAs then by ID);
  // distances follow from the placements: same `pcie_switch`, else same
  // `root_complex`, else same known NUMA node (on an hwloc tree, the same
  // classes FromHwloc finds; a test holds them equal on every simulated
  // machine). The Neuron table is chosen by `instance_type` as in
  // FromHwloc.
  static std::shared_ptr<const HostModel> Create(std::string instance_type,
                                                 std::vector<EfaPlacement> efas,
                                                 std::vector<Accelerator> accelerators);

  HostModel(const HostModel&) = delete;
  HostModel& operator=(const HostModel&) = delete;

  // All accessors are const and the model never changes: thread-safe.

  const std::string& instance_type() const { return instance_type_; }
  const std::vector<EfaPlacement>& efas() const { return efas_; }                 // PCI order
  const std::vector<Accelerator>& accelerators() const { return accelerators_; }  // PCI order
  // What did not add up while building (e.g. an EFA hwloc does not know).
  const std::vector<std::string>& warnings() const { return warnings_; }

  // Index of the EFA with this ID, or nullopt.
  std::optional<size_t> FindEfa(std::string_view id) const;
  // Index of the accelerator at this address, or nullopt.
  std::optional<size_t> FindAccelerator(const PciAddress& pci) const;

  // Every accelerator, nearest first (then in PCI order), with its distance
  // from EFA `efa` (< efas().size()).
  const std::vector<Neighbour>& Neighbours(size_t efa) const { return neighbours_[efa]; }

  // The AWS Neuron-to-EFA table for this instance type, or nullptr.
  const NeuronEfaTable* neuron_table() const { return neuron_table_; }
  // The EFA PCI addresses the table names for Neuron device `index`; empty
  // without a table or for an index it does not list.
  std::vector<PciAddress> NeuronEfaAddresses(int index) const;
  // The same EFAs as indices into efas(), leaving out addresses that are
  // not an EFA of this model.
  const std::vector<size_t>& NeuronEfas(int index) const;

  // Group of EFA `efa` at `level`, or -1 (no switch; NUMA node unknown).
  int EfaGroup(GroupLevel level, size_t efa) const {
    return efa_groups_[static_cast<size_t>(level)][efa];
  }
  // Group of the EFAs that share `level` with accelerator `accelerator`, or
  // -1 when no EFA does.
  int AcceleratorGroup(GroupLevel level, size_t accelerator) const {
    return accelerator_groups_[static_cast<size_t>(level)][accelerator];
  }
  // The EFAs of a group (0 <= group < GroupCount(level)), ascending.
  const std::vector<size_t>& GroupEfas(GroupLevel level, int group) const {
    return group_efas_[static_cast<size_t>(level)][static_cast<size_t>(group)];
  }
  size_t GroupCount(GroupLevel level) const {
    return group_efas_[static_cast<size_t>(level)].size();
  }

  // The placement tree; element 0 is the root. Empty when there is no EFA.
  const std::vector<PlacementNode>& placement_tree() const { return tree_; }

  // A canonical multi-line description of the whole model (instance type,
  // table, accelerators, EFAs with their neighbours, warnings): equal
  // models describe equally.
  std::string Describe() const;

 private:
  HostModel(std::string instance_type, std::vector<EfaPlacement> efas,
            std::vector<Accelerator> accelerators, std::vector<std::vector<Neighbour>> neighbours,
            std::vector<std::string> warnings);

  void IndexGroups();
  void BuildPlacementTree();
  void MapNeuronTable();

  std::string instance_type_;
  std::vector<EfaPlacement> efas_;
  std::vector<Accelerator> accelerators_;
  std::vector<std::vector<Neighbour>> neighbours_;
  std::vector<std::string> warnings_;

  absl::flat_hash_map<std::string, size_t> efa_by_id_;
  std::vector<std::vector<int>> efa_groups_;                  // [level][efa]
  std::vector<std::vector<int>> accelerator_groups_;          // [level][accelerator]
  std::vector<std::vector<std::vector<size_t>>> group_efas_;  // [level][group]
  std::vector<PlacementNode> tree_;
  const NeuronEfaTable* neuron_table_ = nullptr;
  std::vector<std::vector<size_t>> neuron_efas_;  // [neuron index]
};

}  // namespace efa::topology
