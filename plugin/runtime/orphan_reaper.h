// Reaping orphans. As PID 1 of its container the daemon (and the idle
// process, which keeps its PID) is handed every process of the container
// whose parent died: what `kubectl exec` leaves running in the background,
// and its children. The kernel keeps each as a zombie, a PID of the
// container's pids.max and a process-table slot, until its new parent
// waits for it.
//
// Only PID 1 and a child subreaper are handed processes they did not
// start. Any other process only has children it started itself, and a
// waitpid(-1) there would take the exit status away from the code that
// waits for one: so the owner loops reap only when InheritsOrphans(), on
// SIGCHLD (through their signalfd), where the process's own children (the
// idle binary's check, the hwloc export helper) are waited for on that
// same thread, synchronously.
#pragma once

namespace efa::plugin {

// Whether the kernel hands this process orphans: it is PID 1 of its PID
// namespace, or a child subreaper (PR_SET_CHILD_SUBREAPER). Thread-safe.
bool InheritsOrphans();

// Waits for every child that has ended, without blocking; logs each at
// debug level ("reaped process N (exit status S)") and returns how many.
// Call only when InheritsOrphans() (see above).
int ReapEndedChildren();

}  // namespace efa::plugin
