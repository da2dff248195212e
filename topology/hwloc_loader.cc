#include "topology/hwloc_loader.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace efa::topology {
namespace {
std::mutex load_mutex;  // HWLOC_FSROOT is read from the environment at load
}  // namespace

absl::StatusOr<HwlocTopology> LoadTopology(const TopologySource& source) {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) return absl::InternalError("hwloc_topology_init failed");
  HwlocTopology topology(raw);
  hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_ALL);
  // Not the libpciaccess plugin: Linux's own sysfs discovery gives the same
  // PCI tree (hwloc-ls --of xml is identical with HWLOC_COMPONENTS=-pci) and
  // honours HWLOC_FSROOT, which libpciaccess ignores; it also leaks its state
  // at every load (LeakSanitizer, scripts/sanitizers.sh).
  hwloc_topology_set_components(raw, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "pci");

  const bool fake_root = !source.fsroot.empty() && source.fsroot != "/";
  std::string what;
  if (!source.xml_path.empty()) {
    what = source.xml_path;
    if (hwloc_topology_set_xml(raw, source.xml_path.c_str()) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": cannot read as hwloc XML: ", std::strerror(errno)));
    }
  } else if (fake_root) {
    what = source.fsroot;
    hwloc_topology_set_components(raw, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "x86");
  } else {
    what = "the live system";
  }

  std::lock_guard<std::mutex> lock(load_mutex);
  std::string saved;
  const char* old = std::getenv("HWLOC_FSROOT");
  if (old != nullptr) saved = old;
  if (fake_root && source.xml_path.empty()) {
    ::setenv("HWLOC_FSROOT", source.fsroot.c_str(), 1);
  } else {
    ::unsetenv("HWLOC_FSROOT");
  }
  int rc = hwloc_topology_load(raw);
  int err = errno;
  if (old != nullptr) {
    ::setenv("HWLOC_FSROOT", saved.c_str(), 1);
  } else {
    ::unsetenv("HWLOC_FSROOT");
  }
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": hwloc cannot load the topology: ", std::strerror(err)));
  }
  return topology;
}

absl::Status ExportTopologyXml(hwloc_topology* topology, const std::string& path) {
  if (hwloc_topology_export_xml(topology, path.c_str(), 0) != 0) {
    return absl::ErrnoToStatus(errno, path);
  }
  return absl::OkStatus();
}

}  // namespace efa::topology
