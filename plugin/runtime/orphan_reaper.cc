#include "plugin/runtime/orphan_reaper.h"

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "spdlog/spdlog.h"

namespace efa::plugin {

bool InheritsOrphans() {
  if (::getpid() == 1) return true;
  int subreaper = 0;
  return ::prctl(PR_GET_CHILD_SUBREAPER, &subreaper) == 0 && subreaper != 0;
}

int ReapEndedChildren() {
  int reaped = 0;
  while (true) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == EINTR) continue;
    if (pid <= 0) break;  // none ended (0), or no children at all (ECHILD)
    ++reaped;
    if (WIFSIGNALED(status)) {
      spdlog::debug("reaped process {} (killed by signal {})", pid, WTERMSIG(status));
    } else {
      spdlog::debug("reaped process {} (exit status {})", pid, WEXITSTATUS(status));
    }
  }
  return reaped;
}

}  // namespace efa::plugin
