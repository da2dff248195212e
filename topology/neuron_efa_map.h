// AWS's published tables of which EFA serves each Neuron device on Trainium
// instances. On these instances PCIe-root matching is not optimal, so AWS
// names the EFA for every Neuron device index (N of /dev/neuronN).
#pragma once

#include <string_view>
#include <vector>

#include "topology/pci_address.h"

namespace efa::topology {

struct NeuronEfaTable {
  std::string_view name;  // AWS's table name: "trn1", "trn1n", "trn2", "trn3", "trn3pds"
  // efas[N]: the EFA PCI address(es) for Neuron device N. AWS's tables name
  // one address per device; two devices may share one EFA (trn1).
  std::vector<std::vector<PciAddress>> efas;
};

// The table that applies to an instance type: its family (the part before
// the first '.') mapped through AWS's instance-family mapping, e.g.
// "trn2u.48xlarge" -> "trn2". Returns nullptr for every other family
// (GPU instances, unknown types, ""). The tables live for the whole process.
// Thread-safe.
const NeuronEfaTable* FindNeuronEfaTable(std::string_view instance_type);

// Every embedded table, in name order. Thread-safe.
const std::vector<NeuronEfaTable>& NeuronEfaTables();

}  // namespace efa::topology
