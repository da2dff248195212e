// Simulated AWS instances: one spec per instance type with the real PCI
// layout (bus numbers, PCIe switches, NUMA), from ../shared/reference/ and
// FACTS.md. WriteMachine() turns a spec into a fake host root.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "topology/pci_address.h"

namespace efa::sim {

using topology::PciAddress;

enum class Kind { kEfa, kEna, kGpu, kNvSwitch, kNeuron, kMlx5 };

struct Endpoint {
  PciAddress addr;
  Kind kind;
  uint16_t device_id;  // PCI device ID; the vendor follows from the kind
};

// Endpoints under one root complex (host bridge pci0000:<root_bus>). When
// `switched`, a root port leads to a PCIe switch whose downstream ports each
// hold one endpoint; otherwise the endpoints sit on the root bus.
struct PcieGroup {
  uint8_t root_bus;
  int numa;  // -1: numa_node -1 in sysfs, local to every CPU
  bool switched;
  std::vector<Endpoint> endpoints;
};

struct MachineSpec {
  std::string instance_type;  // DMI product name, e.g. "p5.48xlarge"
  int numa_nodes = 2;
  int cpus_per_numa = 2;
  std::vector<PcieGroup> groups;
  // Set on an arm64 machine: the Arm "CPU part" of its cores (0xd40
  // Neoverse-V1, 0xd4f Neoverse-V2), written to /proc/cpuinfo as an arm64
  // kernel does; no x86-only sysfs attributes (die_id, die_cpus) then. Unset:
  // an x86_64 machine.
  std::optional<uint16_t> arm64_cpu_part = std::nullopt;
  // The PCIe root ports' vendor and device (in front of each switch).
  uint16_t root_port_vendor = 0x1022;  // AMD EPYC root port
  uint16_t root_port_device = 0x14ab;
  // The efa driver's network counters (retrans_bytes, retrans_pkts,
  // retrans_timeout_events, unresponsive_remote_events,
  // impaired_remote_conn_events), which came with AWS's efa driver r2.17.0.
  // False: an older driver, whose port counters lack them (no files).
  bool efa_network_counters = true;
};

// The built-in machines: p4d.24xlarge, p5.48xlarge, p5en.48xlarge,
// p6-b200.48xlarge, p6-b300.48xlarge, trn1.32xlarge, trn1n.32xlarge,
// trn2.48xlarge, g5.48xlarge (with an efa driver older than r2.17.0: no
// network counters), the arm64 p6e-gb200.36xlarge, hpc7g.16xlarge and
// c8gn.48xlarge, and no-efa (an m5.8xlarge with ENA only).
const std::vector<MachineSpec>& BuiltinMachines();
// Looks a machine up by name; the error lists the known names.
absl::StatusOr<MachineSpec> FindMachine(const std::string& name);

// How verbs devices are named: as udev renames them on AWS AMIs
// ("rdmap79s0", "ibp48s0") or as the kernel names them ("efa_0", "mlx5_0").
enum class Naming { kUdev, kKernel };

// Writes the machine under `root`: root/sys (for --sysfs-root, SYSFS_PATH
// and, through root, HWLOC_FSROOT), root/dev/infiniband/uverbsN (character
// devices with the numbers sysfs gives them, as on a node: mknod needs root)
// and root/hwloc.xml (the same
// machine exported by hwloc), and for each NVIDIA GPU the driver's
// ROOT/proc/driver/nvidia/gpus/<bdf>/information. `root` must not exist or
// be empty.
absl::Status WriteMachine(const MachineSpec& spec, const std::string& root,
                          Naming naming = Naming::kUdev);

// Makes a character device node at `path` (its directory created); the
// error names the path.
absl::Status MakeCharDevice(const std::filesystem::path& path, unsigned major, unsigned minor);

// Puts root/dev/infiniband/uverbsN back as the character device that
// root/sys/class/infiniband_verbs/uverbsN/dev names (after a test removed
// it, as a device going away does).
absl::Status RestoreUverbsNode(const std::string& root, int uverbs);

// Counts one more uevent in root/sys/kernel/uevent_seqnum, as the kernel
// does for every device it adds, removes, binds, unbinds or renames (and
// RestoreUverbsNode for the device it brings back).
absl::Status CountUevent(const std::string& root);

// Sets the efa counter `name` of verbs device `ibdev` (in
// root/sys/class/infiniband/<ibdev>/hw_counters or ports/1/hw_counters,
// wherever the simulated driver has it) to `value`, atomically. NotFound
// when the device has no such counter.
absl::Status SetEfaCounter(const std::string& root, const std::string& ibdev,
                           const std::string& name, uint64_t value);

// The UUID the simulated NVIDIA driver gives the GPU at `addr` (listed in
// ROOT/proc/driver/nvidia/gpus/<bdf>/information, as on a real node).
std::string SimGpuUuid(const PciAddress& addr);

// The name a verbs device gets for `addr` under `naming`; `index` is its
// rank among the verbs devices of the same driver (kernel names only).
std::string VerbsName(Kind kind, const PciAddress& addr, int index, Naming naming);

}  // namespace efa::sim
