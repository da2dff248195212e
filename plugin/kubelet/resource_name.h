// The extended resource names the plugin serves: pods ask for
// `resources.limits: vpc.amazonaws.com/efa: N`; with sharing's
// renameByDefault the replicas go by the second name (docs/alignment.md, "Sharing").
#pragma once

namespace efa::plugin {

inline constexpr char kResourceName[] = "vpc.amazonaws.com/efa";
inline constexpr char kSharedResourceName[] = "vpc.amazonaws.com/efa.shared";

}  // namespace efa::plugin
