// EFA discovery from sysfs, cross-checked with libibverbs.
#pragma once

#include <sys/inotify.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "topology/efa_device.h"
#include "topology/sysfs.h"

namespace efa::topology {

// Finds every EFA (a PCI function 1d0f:efa0-efaf, or any bound to the efa
// driver; never ENA or mlx5) among the verbs devices under
// `roots.sysfs`/class/infiniband. Never fails: a node without verbs devices
// (no such directory) yields an empty inventory, and a device whose sysfs
// entries are missing or garbage is skipped with a reason that names the
// path. A listing or read that fails for a reason that says nothing about
// the devices (IsHostResourceError, or a listing failing otherwise than
// with ENOENT) makes the inventory incomplete (Inventory::errors), the
// devices it hid unknown, never absent. Each device's uverbs node is looked
// up under `roots.dev`. Thread-safe.
Inventory DiscoverEfaDevices(const HostRoots& roots);

// `now` completed from `before` (an earlier discovery) where it is
// incomplete: each device of `before` that `now` neither found (by PCI
// function) nor skipped for a reason of its own keeps its entry from
// `before`, health and reason included, since an incomplete answer cannot
// tell that it is gone. A complete `now` is returned as it is. Pure.
Inventory KeepLastKnown(Inventory now, const Inventory& before);

// A summary of everything DiscoverEfaDevices reads that can change while a
// node runs: the verbs devices' names and sysfs links, their uverbs
// entries (ibdev and dev attributes), their driver bindings and the uverbs
// nodes' type and numbers. While it stays equal a rescan would find the
// same devices in the same health (the other attributes change only with
// the device, and so with its links). It costs a few system calls per
// device, a tenth of a discovery: for the periodic fallback rescan.
// Thread-safe.
std::string DiscoveryFingerprint(const HostRoots& roots);

// The directories whose entries DiscoverEfaDevices lists: inotify on them
// (kDiscoveryDirEvents) reports device nodes coming and going under
// devtmpfs and every change of a simulated sysfs (real sysfs sends none;
// uevents cover it).
std::vector<std::filesystem::path> DiscoveryDirs(const HostRoots& roots);
inline constexpr uint32_t kDiscoveryDirEvents =
    IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM | IN_ATTRIB | IN_DELETE_SELF | IN_ONLYDIR;

// Sets `verbs_provider` on each device that libibverbs lists. libibverbs
// reads SYSFS_PATH once per process, so call PointLibibverbsAt() before the
// first use. Not thread-safe with other libibverbs users.
// libibverbs is loaded (dlopen) by the first call; fails when it cannot be.
absl::Status MarkVerbsProviders(Inventory& inventory);

// Points libibverbs at `sysfs_root` (SYSFS_PATH) unless it is "/sys". Call
// once, before any other libibverbs use in the process.
void PointLibibverbsAt(const std::filesystem::path& sysfs_root);

}  // namespace efa::topology
