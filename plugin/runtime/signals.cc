#include "plugin/runtime/signals.h"

#include <pthread.h>
#include <sys/signalfd.h>

#include <initializer_list>

namespace efa::plugin {

sigset_t OwnerLoopSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGTERM, SIGINT, SIGHUP, SIGCHLD}) sigaddset(&set, s);
  return set;
}

void BlockOwnerLoopSignals() {
  const sigset_t set = OwnerLoopSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

int OpenOwnerLoopSignalFd() {
  const sigset_t set = OwnerLoopSignals();
  return ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
}

}  // namespace efa::plugin
