// The signals the owner loops (the daemon's and the idle process's) take
// through a signalfd rather than by handlers: SIGTERM and SIGINT (stop),
// SIGHUP (rescan and register again; the idle process ignores it) and
// SIGCHLD (reap orphans as PID 1: orphan_reaper.h).
#pragma once

#include <signal.h>

namespace efa::plugin {

// SIGTERM, SIGINT, SIGHUP and SIGCHLD.
sigset_t OwnerLoopSignals();
// Blocks OwnerLoopSignals() in the calling thread, and so in every thread
// it starts after (call it before any other thread exists), and ignores
// SIGPIPE (a peer gone is an error of the write, not a death).
void BlockOwnerLoopSignals();
// A signalfd (non-blocking, close-on-exec) that reads OwnerLoopSignals(),
// or -1 with errno set. They must be blocked in every thread.
int OpenOwnerLoopSignalFd();

}  // namespace efa::plugin
