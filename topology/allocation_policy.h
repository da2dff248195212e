// The EFA allocation policy: which of the free EFAs a container should get.
// A pure function of the host model and the request (no I/O, no clock, no
// state), so the kubelet's GetPreferredAllocation can call it on any thread.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "topology/host_model.h"
#include "topology/pci_address.h"

namespace efa::topology {

struct AllocationRequest {
  // The free, healthy EFA IDs on offer. IDs the model does not know are
  // used only when the known ones run out.
  std::vector<std::string> available;
  // IDs that must be in the answer, even beyond `size`.
  std::vector<std::string> must_include;
  // How many EFAs the container gets in all (must-include ones count).
  int size = 0;
  // The container's accelerators when known: GPUs or Neuron devices by PCI
  // address. Addresses that are no accelerator of the model are ignored.
  std::vector<PciAddress> target_accelerators;
  // Neuron devices by index (N of /dev/neuronN), placed through the AWS
  // Neuron-to-EFA table. Ignored without a table, since the index-to-PCI
  // order of Neuron devices is not fixed.
  std::vector<int> target_neuron_indices;
  // Without targets: whether `busy_accelerators` is known (the kubelet's
  // pod-resources answered), and the accelerators already allocated. When
  // known, groups are preferred by their lowest accelerator that is still
  // free; when not, by a guess from how many of the group's EFAs are taken.
  bool busy_known = false;
  std::vector<PciAddress> busy_accelerators;
  // With sharing (docs/alignment.md, "Sharing"): how many containers already use each
  // EFA, by ID; EFAs not listed: none. Among EFAs equally near, the least
  // shared go first; without targets, groups by their least shared free
  // EFA. Empty: nothing is shared (the choice is as without).
  std::map<std::string, int> shared;
};

// Chooses the EFAs for `request`:
//  - every must-include ID, then as many more as it takes to reach `size`,
//    from `available` only (duplicates count once);
//  - with targets, each target in turn (the target with the fewest EFAs so
//    far first, targets on distinct switches before second targets on one)
//    takes its nearest free EFA: the EFAs the Neuron table names for it,
//    then behind its switch, under its root complex, on its NUMA node, then
//    any, each tier in PCI order;
//  - without targets, keeps groups whole: it takes the rest of the request
//    from the smallest group that can hold it (a switch's EFAs, else a root
//    complex's, else a NUMA node's), nearest the must-include EFAs first
//    (inside the deepest group that holds some), else fills whole groups in
//    preference order and splits the last. Preferred are groups holding
//    must-include EFAs, then those whose accelerators the accelerator plugins will hand
//    out next (lowest PCI address first, counting a group's accelerators as
//    taken in proportion to its taken EFAs), then PCI order;
//  - with `shared` uses, the least shared EFAs of each tier first, and
//    without targets groups by their least shared free EFA (after
//    must-include, before the accelerators).
// Never fails: with too few EFAs it returns what there is. Deterministic and
// independent of the order of the request's lists. The result lists known
// EFAs in PCI order, then unknown IDs in lexicographic order. Runs in
// O(n log n) for n EFAs (plus the targets; O(n^2) with `shared` uses).
// Thread-safe.
std::vector<std::string> ChooseEfas(const HostModel& model, const AllocationRequest& request);

}  // namespace efa::topology
