// The node's own directories, as a node has them: the defaults of the
// options that move them (docs/configuration.md), written here once.
// topology::HostRoots holds /sys, /dev and /proc.
#pragma once

namespace efa::plugin {

// The kubelet's root directory (--root-dir).
inline constexpr char kDefaultKubeletDir[] = "/var/lib/kubelet";
// The container runtime's CDI spec directories: the static one, and the
// dynamic one, where late binding writes its specs.
inline constexpr char kStaticCdiDir[] = "/etc/cdi";
inline constexpr char kRuntimeCdiDir[] = "/var/run/cdi";

}  // namespace efa::plugin
