// The devices being served: an immutable snapshot of the discovered EFAs,
// indexed by ibdev name, with the host model the allocation policy places
// them by and the device IDs they are advertised as.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "topology/efa_device.h"
#include "topology/host_model.h"

namespace efa::topology {

// Each EFA is advertised as `replicas` device IDs (topology/replica_id.h):
// its ibdev name when 1. Immutable once built; shared between the daemon's
// owner thread and gRPC threads.
struct DeviceTable {
  std::vector<EfaDevice> devices;                  // sorted by PCI address
  absl::flat_hash_map<std::string, size_t> by_id;  // by ibdev name
  std::shared_ptr<const HostModel> model;          // never null
  int replicas = 1;
  // The host model is being loaded: `model` is the fallback until a newer
  // table brings it.
  bool model_pending = false;

  // A null `model` is replaced by one built from the devices alone (no
  // accelerators: the policy then keeps groups whole by root complex and
  // NUMA node).
  DeviceTable(std::vector<EfaDevice> devs, std::shared_ptr<const HostModel> host_model,
              int replica_count = 1);
  // The EFA a device ID names (with replicas > 1 a replica ID, else an
  // ibdev name), or null when it names none.
  const EfaDevice* Find(const std::string& id) const;
  // The EFA called `ibdev`, or null.
  const EfaDevice* FindPhysical(const std::string& ibdev) const;
  // The device IDs advertised for `device`, replica 0 first.
  std::vector<std::string> Ids(const EfaDevice& device) const;
  // The ibdev names of the EFAs that `ids` name, each once, in the order
  // first named; IDs naming no EFA are left out.
  std::vector<std::string> PhysicalEfas(const std::vector<std::string>& ids) const;
};

}  // namespace efa::topology
