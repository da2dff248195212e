#include "plugin/ops/topology_report.h"

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "plugin/kubelet/resource_name.h"
#include "topology/efa_discovery.h"
#include "topology/hwloc_loader.h"
#include "topology/replica_id.h"

namespace efa::plugin {
namespace {

using topology::Accelerator;
using topology::AcceleratorKind;
using topology::Distance;
using topology::EfaDevice;
using topology::EfaPlacement;
using topology::HostModel;

// "GPU0", "NRN3": accelerators numbered per kind in PCI order.
std::vector<std::string> AcceleratorNames(const HostModel& model) {
  std::vector<std::string> names;
  int gpus = 0, neurons = 0;
  for (const Accelerator& a : model.accelerators()) {
    names.push_back(a.kind == AcceleratorKind::kNvidiaGpu ? absl::StrCat("GPU", gpus++)
                                                          : absl::StrCat("NRN", neurons++));
  }
  return names;
}

std::string NumaText(const std::optional<int>& numa) {
  return numa ? absl::StrCat(*numa) : std::string("-");
}

int HealthyEfas(const TopologyReport& report) {
  return static_cast<int>(std::count_if(report.inventory.devices.begin(),
                                        report.inventory.devices.end(),
                                        [](const EfaDevice& d) { return d.healthy(); }));
}

const EfaDevice* FindDevice(const TopologyReport& report, const std::string& id) {
  for (const EfaDevice& d : report.inventory.devices) {
    if (d.ibdev == id) return &d;
  }
  return nullptr;
}

// The relation of every EFA (rows) to every accelerator (columns).
std::vector<std::vector<Distance>> Matrix(const HostModel& model) {
  std::vector<std::vector<Distance>> m(model.efas().size(),
                                       std::vector<Distance>(model.accelerators().size()));
  for (size_t e = 0; e < model.efas().size(); ++e) {
    for (const topology::Neighbour& n : model.Neighbours(e)) m[e][n.accelerator] = n.distance;
  }
  return m;
}

// Neuron device indices (the AWS table's, /dev/neuronN) paired with EFA `e`.
std::vector<int> TablePairs(const HostModel& model, size_t e) {
  std::vector<int> out;
  if (model.neuron_table() == nullptr) return out;
  for (size_t n = 0; n < model.neuron_table()->efas.size(); ++n) {
    const auto& efas = model.NeuronEfas(static_cast<int>(n));
    if (std::find(efas.begin(), efas.end(), e) != efas.end()) out.push_back(static_cast<int>(n));
  }
  return out;
}

std::string KindName(const Accelerator& a) {
  return a.kind == AcceleratorKind::kNvidiaGpu ? "NVIDIA GPU" : "Neuron";
}

std::string DotId(std::string_view kind, std::string_view name) {
  return absl::StrCat("\"", std::string(kind), " ", std::string(name), "\"");
}

// The table's first lines: the instance type, the EFA count, the sharing,
// whether the PCI tree could be read; then a blank line.
std::string TableHeading(const TopologyReport& report) {
  std::string out;
  absl::StrAppend(&out, "Instance type: ",
                  report.instance_type.empty()
                      ? std::string("unknown")
                      : absl::StrCat(report.instance_type, " (", report.instance_type_source, ")"),
                  "\n");
  absl::StrAppend(&out, "EFA count: ", report.count.Describe(), "\n");
  if (report.replicas > 1) {
    // What the kubelet will show: allocatable counts the healthy devices.
    const int healthy = HealthyEfas(report);
    const int unhealthy = static_cast<int>(report.inventory.devices.size()) - healthy;
    absl::StrAppend(
        &out, "Sharing: ", report.resource_name, ", ", report.replicas,
        " replicas per EFA (device IDs ", topology::ReplicaId("<ibdev>", 0), " to ",
        topology::ReplicaId("<ibdev>", report.replicas - 1), "): ", report.replicas * healthy,
        " allocatable = ", report.replicas, " x ", healthy,
        unhealthy == 0 ? " EFAs" : absl::StrCat(" healthy EFAs (", unhealthy, " unhealthy)"), "\n");
  }
  if (!report.topology_error.empty()) {
    absl::StrAppend(&out, "PCI tree: unavailable (", report.topology_error,
                    "): accelerators and switches unknown\n");
  }
  out += "\n";
  return out;
}

// One row per EFA under a header: its relation to each accelerator
// (`names`), NUMA node, uverbs device, PCI address, Neuron pairs (with
// AWS's table) and health.
std::string EfaTable(const TopologyReport& report, const std::vector<std::string>& names) {
  const HostModel& model = *report.model;
  size_t id_width = 3;
  for (const EfaPlacement& p : model.efas()) id_width = std::max(id_width, p.id.size());
  size_t cell = 4;
  for (const std::string& n : names) cell = std::max(cell, n.size());
  cell += 2;
  const bool table = model.neuron_table() != nullptr;
  std::string header = absl::StrFormat("%-*s  ", id_width, "EFA");
  for (const std::string& n : names) absl::StrAppendFormat(&header, "%-*s", cell, n);
  absl::StrAppendFormat(&header, "%-6s%-10s%-14s", "NUMA", "UVERBS", "PCI");
  if (table) absl::StrAppendFormat(&header, "%-10s", "NEURON");
  header += "HEALTH";
  std::string out = header + "\n";
  const auto matrix = Matrix(model);
  for (size_t e = 0; e < model.efas().size(); ++e) {
    const EfaPlacement& p = model.efas()[e];
    const EfaDevice* d = FindDevice(report, p.id);
    std::string row = absl::StrFormat("%-*s  ", id_width, p.id);
    for (size_t a = 0; a < names.size(); ++a) {
      absl::StrAppendFormat(&row, "%-*s", cell, std::string(RelationCode(matrix[e][a])));
    }
    absl::StrAppendFormat(&row, "%-6s%-10s%-14s", NumaText(p.numa_node),
                          d ? d->uverbs : std::string("-"), p.pci.ToString());
    if (table) {
      std::vector<std::string> pairs;
      for (int n : TablePairs(model, e)) pairs.push_back(absl::StrCat(n));
      absl::StrAppendFormat(&row, "%-10s", pairs.empty() ? "-" : absl::StrJoin(pairs, ","));
    }
    row += !d ? "-" : d->healthy() ? "Healthy" : absl::StrCat("Unhealthy: ", d->health_problem);
    out += row + "\n";
  }
  return out;
}

// What EfaTable's codes and columns mean.
std::string TableLegend(const HostModel& model) {
  std::string out =
      "\nLegend:\n"
      "  SW    behind the same PCIe switch\n"
      "  RC    under the same root complex (PCIe host bridge), not the same switch\n"
      "  NUMA  on the same NUMA node, not the same root complex\n"
      "  X     on another NUMA node, or the NUMA node is unknown\n";
  if (model.neuron_table() != nullptr) {
    absl::StrAppend(&out, "  NEURON  the Neuron devices (/dev/neuronN) AWS's ",
                    std::string(model.neuron_table()->name),
                    " Neuron-to-EFA table pairs with the EFA\n");
  }
  return out;
}

// The sections below the EFA table, each only when it has lines: the
// accelerators (`names`), the verbs devices that are not EFAs, the
// model's warnings.
std::string TableNotes(const TopologyReport& report, const std::vector<std::string>& names) {
  const HostModel& model = *report.model;
  std::string out;
  if (!model.accelerators().empty()) {
    out += "\nAccelerators (numbered per kind in PCI order):\n";
    for (size_t a = 0; a < names.size(); ++a) {
      const Accelerator& acc = model.accelerators()[a];
      absl::StrAppendFormat(&out, "  %-6s %s  %s %04x:%04x  NUMA %s  %s  switch %s\n", names[a],
                            acc.pci.ToString(), KindName(acc), acc.vendor_id, acc.device_id,
                            NumaText(acc.numa_node),
                            acc.root_complex.empty() ? "-" : acc.root_complex,
                            acc.pcie_switch ? acc.pcie_switch->ToString() : "-");
    }
  }
  if (!report.inventory.skipped.empty()) {
    out += "\nVerbs devices that are not EFAs:\n";
    for (const auto& s : report.inventory.skipped) {
      absl::StrAppend(&out, "  ", s.ibdev, ": ", s.reason, "\n");
    }
  }
  if (!model.warnings().empty()) {
    out += "\nWarnings:\n";
    for (const std::string& w : model.warnings()) absl::StrAppend(&out, "  ", w, "\n");
  }
  return out;
}

// The DOT graph's tree: root complex -> switch (optional) -> devices.
struct DotLeaf {
  topology::PciAddress pci;
  std::string id;  // DOT node id
  std::string decl;
  std::optional<int> numa;
};
struct DotSwitch {
  std::vector<DotLeaf> leaves;
};
struct DotRoot {
  std::map<topology::PciAddress, DotSwitch> switches;  // by upstream port
  std::vector<DotLeaf> direct;                         // on the root bus
  std::set<std::string> numa;                          // NUMA nodes of its devices ("-": unknown)
};
using DotRoots = std::map<std::string, DotRoot>;  // by root complex ("" = unknown)

void AddDotLeaf(DotRoots& roots, const std::string& root_complex,
                const std::optional<topology::PciAddress>& sw, DotLeaf leaf) {
  DotRoot& r = roots[root_complex];
  r.numa.insert(NumaText(leaf.numa));
  if (sw) {
    r.switches[*sw].leaves.push_back(std::move(leaf));
  } else {
    r.direct.push_back(std::move(leaf));
  }
}

// Every EFA and accelerator of the report, placed in the tree.
DotRoots DotTree(const TopologyReport& report) {
  const HostModel& model = *report.model;
  const std::vector<std::string> names = AcceleratorNames(model);
  DotRoots roots;
  for (const EfaPlacement& p : model.efas()) {
    const EfaDevice* d = FindDevice(report, p.id);
    const bool healthy = d && d->healthy();
    std::string label = absl::StrCat("EFA ", p.id, "\\n", d ? d->uverbs : std::string("-"), "\\n",
                                     p.pci.ToString(), healthy ? "" : "\\nUnhealthy");
    std::string id = DotId("efa", p.id);
    AddDotLeaf(roots, p.root_complex, p.pcie_switch,
               {p.pci, id,
                absl::StrCat(id, " [shape=box, style=filled, fillcolor=\"",
                             healthy ? "#cfe2ff" : "#f8d7da", "\", label=\"", label, "\"];"),
                p.numa_node});
  }
  for (size_t a = 0; a < names.size(); ++a) {
    const Accelerator& acc = model.accelerators()[a];
    std::string id =
        DotId(acc.kind == AcceleratorKind::kNvidiaGpu ? "gpu" : "neuron", acc.pci.ToString());
    AddDotLeaf(roots, acc.root_complex, acc.pcie_switch,
               {acc.pci, id,
                absl::StrCat(id, " [shape=box, style=filled, fillcolor=\"",
                             acc.kind == AcceleratorKind::kNvidiaGpu ? "#d1e7dd" : "#fff3cd",
                             "\", label=\"", names[a], "\\n", acc.pci.ToString(), "\"];"),
                acc.numa_node});
  }
  return roots;
}

// "p5.48xlarge: 32 EFAs, 8 GPUs".
std::string DotTitle(const TopologyReport& report) {
  const HostModel& model = *report.model;
  size_t gpus = 0, neurons = 0;
  for (const Accelerator& a : model.accelerators()) {
    (a.kind == AcceleratorKind::kNvidiaGpu ? gpus : neurons)++;
  }
  std::string title = absl::StrCat(
      report.instance_type.empty() ? std::string("unknown instance type") : report.instance_type,
      ": ", model.efas().size(), " EFAs");
  if (gpus) absl::StrAppend(&title, ", ", gpus, " GPUs");
  if (neurons) absl::StrAppend(&title, ", ", neurons, " Neuron devices");
  return title;
}

std::vector<DotLeaf> ByPci(std::vector<DotLeaf> leaves) {
  std::sort(leaves.begin(), leaves.end(),
            [](const DotLeaf& a, const DotLeaf& b) { return a.pci < b.pci; });
  return leaves;
}

// Declares root complex `rc`, its switches and their devices in `out`,
// each line after `indent`, and adds their edges to `edges`.
void AppendDotRoot(const std::string& rc, const DotRoot& r, const std::string& indent,
                   std::string& out, std::string& edges) {
  const std::string rc_id = DotId("root", rc.empty() ? "unknown" : rc);
  absl::StrAppend(&out, indent, rc_id,
                  " [shape=box, style=\"rounded,bold\", label=\"root complex\\n",
                  rc.empty() ? "unknown" : rc, "\"];\n");
  for (const DotLeaf& leaf : ByPci(r.direct)) {
    absl::StrAppend(&out, indent, leaf.decl, "\n");
    absl::StrAppend(&edges, "  ", rc_id, " -> ", leaf.id, ";\n");
  }
  for (const auto& [sw, s] : r.switches) {
    const std::string sw_id = DotId("switch", sw.ToString());
    absl::StrAppend(&out, indent, sw_id, " [shape=ellipse, label=\"PCIe switch\\n", sw.ToString(),
                    "\"];\n");
    absl::StrAppend(&edges, "  ", rc_id, " -> ", sw_id, ";\n");
    for (const DotLeaf& leaf : ByPci(s.leaves)) {
      absl::StrAppend(&out, indent, leaf.decl, "\n");
      absl::StrAppend(&edges, "  ", sw_id, " -> ", leaf.id, ";\n");
    }
  }
}

}  // namespace

std::string_view RelationCode(Distance distance) {
  switch (distance) {
    case Distance::kSameSwitch:
      return "SW";
    case Distance::kSameRootComplex:
      return "RC";
    case Distance::kSameNuma:
      return "NUMA";
    case Distance::kOther:
      return "X";
  }
  return "X";
}

TopologyReport BuildTopologyReport(const TopologyReportOptions& options) {
  TopologyReport report;
  report.inventory = topology::DiscoverEfaDevices(options.roots);
  const topology::TopologySource source =
      topology::SourceFor(options.roots.sysfs, options.topology_xml);
  report.instance_type = ResolveInstanceType(options.instance_type, options.roots.sysfs);
  report.instance_type_source = options.instance_type.empty() ? "DMI product name" : "instanceType";
  auto tree = topology::LoadTopology(source);
  if (tree.ok()) {
    report.model = HostModel::FromHwloc(report.inventory, tree->get(), {report.instance_type});
    if (report.instance_type.empty() && !report.model->instance_type().empty()) {
      report.instance_type = report.model->instance_type();
      report.instance_type_source = "hwloc";
    }
  } else {
    report.topology_error = std::string(tree.status().message());
    std::vector<EfaPlacement> efas;
    for (const EfaDevice& d : report.inventory.devices) {
      efas.push_back({d.ibdev, d.pci, d.numa_node, d.root_complex, std::nullopt});
    }
    report.model = HostModel::Create(report.instance_type, std::move(efas), {});
  }
  if (report.instance_type.empty()) report.instance_type_source.clear();
  report.replicas = options.replicas;
  report.resource_name = options.resource_name.empty() ? kResourceName : options.resource_name;
  report.count = CheckExpectedEfas(report.instance_type, options.expected_efa_count,
                                   static_cast<int>(report.inventory.devices.size()));
  return report;
}

std::string FormatTopologyTable(const TopologyReport& report) {
  const HostModel& model = *report.model;
  const std::vector<std::string> names = AcceleratorNames(model);
  std::string out = TableHeading(report);
  if (model.efas().empty()) {
    out += "No EFA on this node.\n";
  } else {
    out += EfaTable(report, names);
    out += TableLegend(model);
  }
  out += TableNotes(report, names);
  return out;
}

std::string FormatTopologyJson(const TopologyReport& report) {
  using Json = nlohmann::ordered_json;
  const HostModel& model = *report.model;
  const std::vector<std::string> names = AcceleratorNames(model);
  Json j;
  j["instanceType"] = report.instance_type.empty() ? Json() : Json(report.instance_type);
  j["instanceTypeSource"] =
      report.instance_type_source.empty() ? Json() : Json(report.instance_type_source);
  j["efaCount"] = {{"found", report.count.found},
                   {"expected", report.count.expected ? Json(*report.count.expected) : Json()},
                   {"expectedFrom", !report.count.expected    ? Json()
                                    : report.count.configured ? Json("expectedEfaCount")
                                                              : Json("instanceType")},
                   {"ok", !report.count.short_of_expected()},
                   {"message", report.count.Describe()}};
  if (report.replicas > 1) {
    j["sharing"] = {{"replicas", report.replicas},
                    {"resourceName", report.resource_name},
                    {"deviceIds", report.replicas * report.count.found},
                    {"allocatable", report.replicas * HealthyEfas(report)}};
  }
  j["topologyError"] = report.topology_error.empty() ? Json() : Json(report.topology_error);
  j["neuronTable"] = model.neuron_table() ? Json(std::string(model.neuron_table()->name)) : Json();
  Json accelerators = Json::array();
  for (size_t a = 0; a < names.size(); ++a) {
    const Accelerator& acc = model.accelerators()[a];
    accelerators.push_back(
        {{"name", names[a]},
         {"kind", std::string(topology::AcceleratorKindName(acc.kind))},
         {"pci", acc.pci.ToString()},
         {"vendorId", absl::StrFormat("%04x", acc.vendor_id)},
         {"deviceId", absl::StrFormat("%04x", acc.device_id)},
         {"numaNode", acc.numa_node ? Json(*acc.numa_node) : Json()},
         {"rootComplex", acc.root_complex.empty() ? Json() : Json(acc.root_complex)},
         {"pcieSwitch", acc.pcie_switch ? Json(acc.pcie_switch->ToString()) : Json()}});
  }
  j["accelerators"] = std::move(accelerators);
  Json efas = Json::array();
  const auto matrix = Matrix(model);
  for (size_t e = 0; e < model.efas().size(); ++e) {
    const EfaPlacement& p = model.efas()[e];
    const EfaDevice* d = FindDevice(report, p.id);
    Json relations = Json::object();
    for (size_t a = 0; a < names.size(); ++a) {
      relations[names[a]] = std::string(RelationCode(matrix[e][a]));
    }
    Json efa = {{"id", p.id},
                {"uverbs", d ? Json(d->uverbs) : Json()},
                {"pci", p.pci.ToString()},
                {"numaNode", p.numa_node ? Json(*p.numa_node) : Json()},
                {"rootComplex", p.root_complex.empty() ? Json() : Json(p.root_complex)},
                {"pcieSwitch", p.pcie_switch ? Json(p.pcie_switch->ToString()) : Json()},
                {"health", d && d->healthy() ? "Healthy" : "Unhealthy"},
                {"healthProblem", d && !d->healthy() ? Json(d->health_problem) : Json()},
                {"relations", std::move(relations)}};
    if (model.neuron_table()) efa["neuronTablePairs"] = TablePairs(model, e);
    efas.push_back(std::move(efa));
  }
  j["efas"] = std::move(efas);
  j["warnings"] = model.warnings();
  return j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

std::string FormatTopologyDot(const TopologyReport& report) {
  const DotRoots roots = DotTree(report);
  std::string out = "// Render with: dot -Tpng -o topology.png\n";
  absl::StrAppend(&out, "digraph topology {\n  fontname=\"Helvetica\";\n  label=\"",
                  DotTitle(report),
                  "\";\n  labelloc=t;\n  node [fontname=\"Helvetica\", fontsize=10];\n"
                  "  edge [arrowhead=none];\n");
  // Root complexes whose devices share one known NUMA node are drawn in
  // that node's box.
  std::map<std::string, std::vector<std::string>> by_numa;  // "" = outside any box
  for (const auto& [rc, r] : roots) {
    const std::string numa =
        r.numa.size() == 1 && *r.numa.begin() != "-" ? *r.numa.begin() : std::string();
    by_numa[numa].push_back(rc);
  }
  std::string edges;
  for (const auto& [numa, rcs] : by_numa) {
    std::string indent = "  ";
    if (!numa.empty()) {
      absl::StrAppend(&out, "  subgraph cluster_numa", numa, " {\n    label=\"NUMA node ", numa,
                      "\";\n    style=rounded;\n");
      indent = "    ";
    }
    for (const std::string& rc : rcs) AppendDotRoot(rc, roots.at(rc), indent, out, edges);
    if (!numa.empty()) out += "  }\n";
  }
  out += edges;
  out += "}\n";
  return out;
}

absl::StatusOr<std::string> FormatTopology(const TopologyReport& report, std::string_view format) {
  if (format == "table") return FormatTopologyTable(report);
  if (format == "json") return FormatTopologyJson(report);
  if (format == "dot") return FormatTopologyDot(report);
  return absl::InvalidArgumentError(absl::StrCat(
      "--format: expected one of table, json, dot, got \"", std::string(format), "\""));
}

}  // namespace efa::plugin
