// The kernel's kobject uevents, which announce RDMA devices and PCI
// functions as they come and go on a real node (sysfs itself sends no
// inotify events).
#pragma once

#include <filesystem>
#include <string>

namespace efa::topology {

// A non-blocking, close-on-exec socket that receives the kernel's uevents;
// -1 where the network namespace does not get them (a periodic rescan must
// cover then).
int OpenUeventSocket();

// Reads every uevent waiting on `fd`; true when one touches RDMA devices
// (infiniband, infiniband_verbs) or PCI functions.
bool DrainUevents(int fd);

// The kernel's count of the uevents it has sent, in any network namespace
// (<sysfs>/kernel/uevent_seqnum): while it stands, no device came, went, was
// bound, unbound or renamed. Empty when it cannot be read.
std::string UeventSeqnum(const std::filesystem::path& sysfs_root);

}  // namespace efa::topology
