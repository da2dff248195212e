// What the end-to-end suite's fake plugins share: SIGTERM and SIGINT are
// taken synchronously (sigwaitinfo, sigtimedwait) by the main loop, never by
// a handler; SIGPIPE is ignored (a kubelet closing a connection).
#pragma once

#include <signal.h>

namespace efa::e2e {

// Blocks SIGTERM and SIGINT in the calling thread (and the threads it starts
// later) and ignores SIGPIPE; returns the set to wait on.
inline sigset_t BlockTermSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return signals;
}

}  // namespace efa::e2e
