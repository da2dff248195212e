// The kernel's kobject uevents, which announce RDMA devices and PCI
// functions as they come and go on a real node (sysfs itself sends no
// inotify events).
#pragma once

namespace efa::topology {

// A non-blocking, close-on-exec socket that receives the kernel's uevents;
// -1 where the network namespace does not get them (a periodic rescan must
// cover then).
int OpenUeventSocket();

// Reads every uevent waiting on `fd`; true when one touches RDMA devices
// (infiniband, infiniband_verbs) or PCI functions.
bool DrainUevents(int fd);

}  // namespace efa::topology
