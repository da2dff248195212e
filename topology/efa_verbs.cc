// The libibverbs side of discovery, apart from the sysfs side so that a
// binary that only discovers (efa-k8s-device-plugin-idle) does not load
// libibverbs.
#include <infiniband/verbs.h>

#include <cstdlib>
#include <string_view>

#include "topology/efa_discovery.h"

namespace efa::topology {

namespace fs = std::filesystem;

void PointLibibverbsAt(const fs::path& sysfs_root) {
  if (sysfs_root != "/sys") ::setenv("SYSFS_PATH", sysfs_root.c_str(), /*overwrite=*/1);
}

void MarkVerbsProviders(Inventory& inventory) {
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (list == nullptr) return;
  for (int i = 0; i < count; ++i) {
    std::string_view name = ibv_get_device_name(list[i]);
    for (EfaDevice& dev : inventory.devices) {
      if (dev.ibdev == name) dev.verbs_provider = true;
    }
  }
  ibv_free_device_list(list);
}

}  // namespace efa::topology
