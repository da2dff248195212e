// `efa-k8s-device-plugin topology`: which EFA is next to which GPU or
// Neuron device, and are they all there. A matrix of EFAs against
// accelerators with relation codes in the spirit of `nvidia-smi topo -m`,
// each EFA's NUMA node and uverbs device, and the expected-count check;
// as a table, JSON, or a Graphviz DOT drawing of the PCIe tree.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "plugin/runtime/expected_efas.h"
#include "topology/efa_device.h"
#include "topology/host_model.h"
#include "topology/sysfs.h"

namespace efa::plugin {

struct TopologyReportOptions {
  topology::HostRoots roots;
  std::string topology_xml = {};   // empty: hwloc reads the host (or the root above roots.sysfs)
  std::string instance_type = {};  // empty: the DMI product name
  int expected_efa_count = 0;
  int replicas = 1;  // sharing.replicas: device IDs per EFA
  // The resource the EFAs are advertised as (docs/alignment.md, "Sharing"); empty:
  // vpc.amazonaws.com/efa.
  std::string resource_name{};
};

struct TopologyReport {
  std::string instance_type;         // empty when unknown
  std::string instance_type_source;  // "instanceType", "DMI product name", "hwloc"
  topology::Inventory inventory;
  std::shared_ptr<const topology::HostModel> model;  // never null
  std::string topology_error;  // why the PCI tree could not be read (then no accelerators)
  ExpectedEfasCheck count;
  int replicas = 1;
  std::string resource_name;  // never empty
};

// Discovers the EFAs, loads the PCI tree and checks the count. Never fails:
// what cannot be read is reported in the result. Reads the host.
TopologyReport BuildTopologyReport(const TopologyReportOptions& options);

// The relation code of a distance: "SW", "RC", "NUMA" or "X".
std::string_view RelationCode(topology::Distance distance);

// The formats. With replicas > 1 the table has a "Sharing:" line and the
// JSON a "sharing" object (replicas, resource name, device IDs, allocatable =
// replicas x healthy EFAs); with replicas 1 neither says anything about
// sharing.
std::string FormatTopologyTable(const TopologyReport& report);
std::string FormatTopologyJson(const TopologyReport& report);
std::string FormatTopologyDot(const TopologyReport& report);

// By name ("table", "json", "dot"); InvalidArgument for another name.
absl::StatusOr<std::string> FormatTopology(const TopologyReport& report, std::string_view format);

}  // namespace efa::plugin
