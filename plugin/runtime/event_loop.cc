#include "plugin/runtime/event_loop.h"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "plugin/runtime/orphan_reaper.h"
#include "plugin/runtime/signals.h"
#include "spdlog/spdlog.h"

namespace efa::plugin {

// The eventfd is made here, not in Open(): Wake() and Stop() may come from
// other threads at any time, and must find it.
EventLoop::EventLoop(Options options)
    : options_(std::move(options)),
      wake_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      wake_errno_(wake_fd_ < 0 ? errno : 0) {}

EventLoop::~EventLoop() {
  if (wake_fd_ >= 0) ::close(wake_fd_);
  if (signal_fd_ >= 0) ::close(signal_fd_);
}

absl::Status EventLoop::Open() {
  if (wake_fd_ < 0) {
    return absl::InternalError(
        absl::StrCat("cannot create an eventfd: ", std::strerror(wake_errno_)));
  }
  if (!options_.take_signals) return absl::OkStatus();
  signal_fd_ = OpenOwnerLoopSignalFd();
  if (signal_fd_ < 0) {
    spdlog::error("cannot take signals through a signalfd: {}; stop signals will go unanswered",
                  std::strerror(errno));
  }
  // As PID 1 of its container the process is handed the container's
  // orphans (orphan_reaper.h): reaped on SIGCHLD, and once now for any
  // handed over before this loop (or to the process it was exec'ed from).
  reap_orphans_ = InheritsOrphans();
  if (reap_orphans_) ReapEndedChildren();
  return absl::OkStatus();
}

void EventLoop::Watch(int fd, std::function<void()> on_readable) {
  watched_.push_back({fd, std::move(on_readable)});
}

void EventLoop::AddTimer(std::function<TimePoint()> due, std::function<void()> run) {
  timers_.push_back({std::move(due), std::move(run)});
}

int EventLoop::Timeout(TimePoint wake_by) const {
  TimePoint earliest = wake_by;
  for (const Timer& t : timers_) earliest = std::min(earliest, t.due());
  if (earliest == TimePoint::max()) return -1;
  const TimePoint now = options_.clock->Now();
  if (earliest <= now) return 0;
  // Rounded up: rounded down, a deadline 0.9 ms away became a zero timeout
  // and the loop spun until it passed.
  const auto wait = std::chrono::ceil<std::chrono::milliseconds>(earliest - now);
  return static_cast<int>(std::min<int64_t>(wait.count(), std::numeric_limits<int>::max()));
}

bool EventLoop::RunOnce(TimePoint wake_by) {
  std::vector<pollfd> fds = {{wake_fd_, POLLIN, 0}};
  for (const Watched& w : watched_) fds.push_back({w.fd, POLLIN, 0});
  fds.push_back({signal_fd_, POLLIN, 0});  // poll() skips it when negative
  if (::poll(fds.data(), fds.size(), Timeout(wake_by)) < 0 && errno != EINTR) {
    spdlog::error("poll: {}", std::strerror(errno));
    return false;
  }
  if (fds.front().revents & POLLIN) {
    uint64_t v;
    [[maybe_unused]] ssize_t r = ::read(wake_fd_, &v, sizeof v);
  }
  for (size_t i = 0; i < watched_.size(); ++i) {
    if (fds[i + 1].revents & POLLIN) watched_[i].on_readable();
  }
  if (fds.back().revents & POLLIN) HandleSignals();
  for (const Timer& t : timers_) {
    if (options_.clock->Now() >= t.due()) t.run();
  }
  return true;
}

void EventLoop::HandleSignals() {
  signalfd_siginfo info;
  while (::read(signal_fd_, &info, sizeof info) == sizeof info) {
    if (info.ssi_signo == SIGCHLD) {
      if (reap_orphans_) ReapEndedChildren();
    } else if (info.ssi_signo == SIGHUP) {
      if (options_.on_hangup) options_.on_hangup();
    } else {
      spdlog::info("signal {}: stopping", info.ssi_signo);
      stopped_ = true;
    }
  }
}

void EventLoop::Wake() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof one);
}

void EventLoop::Stop() {
  stopped_ = true;
  Wake();
}

}  // namespace efa::plugin
