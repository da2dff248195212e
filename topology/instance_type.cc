#include "topology/instance_type.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "topology/sysfs.h"

namespace efa::topology {

absl::StatusOr<std::string> ReadInstanceType(const std::filesystem::path& sysfs_root) {
  const std::filesystem::path path = sysfs_root / "devices/virtual/dmi/id/product_name";
  auto name = ReadAttribute(path);
  if (!name.ok()) return name.status();
  if (name->empty()) return absl::NotFoundError(absl::StrCat(path.string(), ": empty"));
  return name;
}

std::string_view InstanceFamily(std::string_view instance_type) {
  return instance_type.substr(0, instance_type.find('.'));
}

}  // namespace efa::topology
