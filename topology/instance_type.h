// The EC2 instance type of the node ("p5.48xlarge") and its family ("p5").
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace efa::topology {

// Reads the DMI product name, `sysfs_root`/devices/virtual/dmi/id/product_name,
// which EC2 sets to the instance type. Fails with the path in the message
// when the file is missing or empty (not an EC2 instance, or no DMI).
// Thread-safe.
absl::StatusOr<std::string> ReadInstanceType(const std::filesystem::path& sysfs_root);

// The part of an instance type before the first '.', e.g. "trn2u" for
// "trn2u.48xlarge"; the whole text when it has no '.'.
std::string_view InstanceFamily(std::string_view instance_type);

}  // namespace efa::topology
