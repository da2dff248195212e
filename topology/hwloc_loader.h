// Loading an hwloc topology with every PCI device, bridge and OS device
// kept, from the live system, a fake host root or an XML file.
#pragma once

#include <hwloc.h>

#include <filesystem>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace efa::topology {

struct HwlocDeleter {
  void operator()(hwloc_topology* t) const { hwloc_topology_destroy(t); }
};
using HwlocTopology = std::unique_ptr<hwloc_topology, HwlocDeleter>;

// Where the PCI tree comes from. `xml_path` wins when set; otherwise
// `fsroot` ("/" or empty: the live system) is the directory that holds the
// host's sys/ and proc/, e.g. the parent of --sysfs-root.
struct TopologySource {
  std::string fsroot;
  std::string xml_path;
};
// The source for a sysfs root: the live system when it is the host's own
// (HostRoots' default), else the directory that holds the simulated sys/.
TopologySource SourceFor(const std::filesystem::path& sysfs_root, std::string xml_path);

// Loads the topology. With a fake fsroot the x86 CPUID backend is turned off
// so that the build host's CPUs do not leak into the simulated machine.
// hwloc reads a root other than the one HWLOC_FSROOT names (unset: "/")
// through a helper, a copy of this program started with HWLOC_FSROOT set
// (see the .cc): the environment is never changed. Errors name the source.
// Thread-safe.
absl::StatusOr<HwlocTopology> LoadTopology(const TopologySource& source);

// Writes `topology` as hwloc XML to `path`.
absl::Status ExportTopologyXml(hwloc_topology* topology, const std::string& path);

}  // namespace efa::topology
