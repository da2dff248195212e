// One EFA as the daemon knows it, and the inventory of a node.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "topology/pci_address.h"

namespace efa::topology {

inline constexpr uint16_t kAmazonVendorId = 0x1d0f;

// EFA generation for an Amazon PCI device ID of the EFA family
// (0xefa0..0xefaf): 0xefa0 -> 1 ... 0xefaf -> 16. Returns nullopt for every
// other device ID (ENA, Neuron, ...).
std::optional<int> EfaGeneration(uint16_t vendor, uint16_t device);

struct EfaDevice {
  std::string ibdev;   // verbs device name, e.g. "rdmap79s0" or "efa_0"; the kubelet device ID
  std::string uverbs;  // "uverbs0"
  std::string
      uverbs_path;     // <dev-root>/infiniband/uverbs0: the node the runtime gives the container
  uint32_t major = 0;  // char device numbers from sysfs ("231:192")
  uint32_t minor = 0;
  PciAddress pci;
  uint16_t device_id = 0;        // 0xefa0 .. 0xefaf, or any ID bound to the efa driver
  int generation = 0;            // 1 .. 16; 0 for an ID outside the family (bound to efa)
  std::optional<int> numa_node;  // nullopt when sysfs says -1
  std::string node_guid;         // "0000:0000:0000:0000" style, as sysfs writes it
  std::string root_complex;      // "pci0000:44": first component of the resolved sysfs path
  // Why the device cannot be used now (uverbs node missing, driver unbound);
  // empty when healthy.
  std::string health_problem;
  // Whether the installed libibverbs lists the device (it has a provider for
  // this EFA generation). Informational: sysfs decides membership.
  bool verbs_provider = false;

  bool healthy() const { return health_problem.empty(); }
};

// A verbs device that discovery passed over, and why.
struct SkippedDevice {
  std::string ibdev;
  std::string reason;
  // True when sysfs is malformed (worth a warning); false for a well-formed
  // device that is simply not an EFA (ENA, mlx5: debug level).
  bool malformed = false;
};

// A listing or read of discovery that failed for a reason that says nothing
// about the devices (IsHostResourceError, or a listing failing otherwise
// than with ENOENT).
struct DiscoveryError {
  std::string operation;  // "list" (a directory) or "read" (a device's file)
  int err = 0;            // its errno
  // "listing /sys/class/infiniband: Too many open files",
  // "reading /sys/class/infiniband/rdmap79s0/device/vendor: Cannot allocate memory"
  std::string message;
};

struct Inventory {
  std::vector<EfaDevice> devices;  // sorted by PCI address, then ibdev
  std::vector<SkippedDevice> skipped;
  // Empty when the answer is complete: every verbs device was listed and
  // each is in `devices` or `skipped`. Else what failed: `listed` false
  // when class/infiniband itself could not be listed (then nothing is
  // known), and `unknown` the verbs devices (ibdev names) whose reads
  // failed so. Absence may be concluded only from a complete inventory.
  std::vector<DiscoveryError> errors;
  bool listed = true;
  std::vector<std::string> unknown;

  bool complete() const { return errors.empty(); }
};

}  // namespace efa::topology
