// The daemon's log file as the tests and the benchmark read it: the lines
// with a text, a line waited for, the port a "serving" line names.
#pragma once

#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>

#include "test/support/temp_dir.h"

namespace efa::testing {

// Lines of the file at `log` containing `text` (0 when it cannot be read).
inline int LogLines(const std::filesystem::path& log, const std::string& text) {
  std::istringstream in(ReadFile(log));
  int n = 0;
  for (std::string line; std::getline(in, line);) n += line.find(text) != std::string::npos;
  return n;
}

// Whether the file at `log` has a line containing `text` within `timeout`.
// Looks again each time its directory reports a change (inotify); without
// a watch (no descriptor left, no directory yet), every 20 ms.
inline bool WaitForLogLine(const std::filesystem::path& log, const std::string& text,
                           std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  int fd = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (fd >= 0 && ::inotify_add_watch(fd, log.parent_path().c_str(), IN_MODIFY | IN_CREATE) < 0) {
    ::close(fd);  // no directory yet: look every 20 ms
    fd = -1;
  }
  bool found = false;
  while (!(found = LogLines(log, text) > 0)) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) break;
    if (fd < 0) left = std::min(left, std::chrono::milliseconds(20));
    pollfd p{fd, POLLIN, 0};  // a negative fd: poll only waits
    if (::poll(&p, 1, static_cast<int>(left.count())) == 1) {
      char events[4096];
      while (::read(fd, events, sizeof events) > 0) {
      }
    }
  }
  if (fd >= 0) ::close(fd);
  return found;
}

// The port of the listener the log at `log` last says it serves `what` on
// ("serving <what> on ... (port N"); 0 when it names none.
inline int LoggedPort(const std::filesystem::path& log, const std::string& what) {
  const std::string text = ReadFile(log);
  const size_t at = text.rfind("serving " + what + " on ");
  const size_t port = at == std::string::npos ? at : text.find("(port ", at);
  return port == std::string::npos ? 0 : std::atoi(text.c_str() + port + 6);
}

}  // namespace efa::testing
