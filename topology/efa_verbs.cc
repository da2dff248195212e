// The libibverbs side of discovery, for the inventory command alone. The
// library is loaded with dlopen when the command runs: linked, it and libnl
// would be mapped into every daemon (0.7 MiB resident) that never calls it.
#include <dlfcn.h>
#include <infiniband/verbs.h>

#include <cstdlib>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "topology/efa_discovery.h"

namespace efa::topology {

namespace fs = std::filesystem;

void PointLibibverbsAt(const fs::path& sysfs_root) {
  if (sysfs_root != HostRoots{}.sysfs) ::setenv("SYSFS_PATH", sysfs_root.c_str(), /*overwrite=*/1);
}

absl::Status MarkVerbsProviders(Inventory& inventory) {
  void* lib = ::dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return absl::UnavailableError(absl::StrCat("libibverbs: ", ::dlerror()));
  auto get_list =
      reinterpret_cast<decltype(&ibv_get_device_list)>(::dlsym(lib, "ibv_get_device_list"));
  auto get_name =
      reinterpret_cast<decltype(&ibv_get_device_name)>(::dlsym(lib, "ibv_get_device_name"));
  auto free_list =
      reinterpret_cast<decltype(&ibv_free_device_list)>(::dlsym(lib, "ibv_free_device_list"));
  if (get_list == nullptr || get_name == nullptr || free_list == nullptr) {
    return absl::UnavailableError("libibverbs.so.1 lacks ibv_get_device_list");
  }
  int count = 0;
  ibv_device** list = get_list(&count);
  if (list == nullptr) return absl::OkStatus();  // no verbs device at all
  for (int i = 0; i < count; ++i) {
    std::string_view name = get_name(list[i]);
    for (EfaDevice& dev : inventory.devices) {
      if (dev.ibdev == name) dev.verbs_provider = true;
    }
  }
  free_list(list);
  return absl::OkStatus();
}

}  // namespace efa::topology
