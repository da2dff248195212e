// The extended resource names the plugin serves: pods ask for
// `resources.limits: vpc.amazonaws.com/efa: N`; with sharing's
// renameByDefault the replicas go by the second name (docs/alignment.md, "Sharing").
#pragma once

#include <string_view>

namespace efa::plugin {

inline constexpr char kResourceName[] = "vpc.amazonaws.com/efa";
inline constexpr char kSharedResourceName[] = "vpc.amazonaws.com/efa.shared";

// Whether `resource` is either name: a container holds EFAs under the name
// the daemon served when it was admitted, whatever the daemon serves now.
inline bool IsEfaResource(std::string_view resource) {
  return resource == kResourceName || resource == kSharedResourceName;
}

}  // namespace efa::plugin
