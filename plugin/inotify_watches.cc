#include "plugin/inotify_watches.h"

#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "spdlog/spdlog.h"

namespace efa::plugin {

namespace {

// Where the limit behind `err` is set, for the log.
std::string Hint(int err, bool instance) {
  if (err == EMFILE && instance) {
    return " (fs.inotify.max_user_instances: uid 0's instances are shared by every root "
           "container on the node)";
  }
  if (err == ENOSPC && !instance) {
    return " (fs.inotify.max_user_watches: uid 0's watches are shared by every root container "
           "on the node)";
  }
  if (err == ENFILE) return " (the node's open file limit, fs.file-max)";
  return "";
}

}  // namespace

InotifyWatches::InotifyWatches(Options options) : options_(options) {}

InotifyWatches::~InotifyWatches() {
  if (fd_ >= 0) ::close(fd_);
}

bool InotifyWatches::Open() {
  if (fd_ >= 0) return false;
  fd_ = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (fd_ < 0) {
    instance_error_ = errno;
    // Logged once per cause; the directories asked for meanwhile count as
    // refused (Add).
    if (logged_.insert(-instance_error_).second) {
      degraded_ = true;
      spdlog::warn(
          "cannot create an inotify instance: {}{}; running on timers: every {:g} s the "
          "periodic pass looks for what inotify would report (kubelet.sock created again, the "
          "plugin socket deleted, the kubelet checkpoint, the devices, the guards' "
          "directories), and tries again",
          std::strerror(instance_error_), Hint(instance_error_, /*instance=*/true),
          std::chrono::duration<double>(options_.rescan_interval).count());
    }
    return false;
  }
  if (degraded_) {
    spdlog::info("created an inotify instance (it failed before with: {}); watching again",
                 std::strerror(instance_error_));
  }
  instance_error_ = 0;
  return true;
}

InotifyWatches::Watch InotifyWatches::Add(const std::filesystem::path& dir, uint32_t mask) {
  if (fd_ < 0) {
    NoteRefused(dir.string(), instance_error_);
    return {.wd = -1, .refused = true};
  }
  const int wd = ::inotify_add_watch(fd_, dir.c_str(), mask);
  if (wd >= 0 || errno == ENOENT || errno == ENOTDIR) {
    // Watched, or absent: nothing to look for on timers.
    NoteWatched(dir.string());
    return {.wd = wd, .refused = false};
  }
  // Errors are not absence: ENOSPC, ENOMEM, EACCES leave a directory that
  // may be there and change unseen.
  NoteRefused(dir.string(), errno);
  return {.wd = -1, .refused = true};
}

void InotifyWatches::NoteRefused(const std::string& dir, int err) {
  refused_[dir] = err;
  unavailable_ = static_cast<int>(refused_.size());
  // Without an instance, Open() logged the cause.
  if (fd_ < 0 || !logged_.insert(err).second) return;
  degraded_ = true;
  spdlog::warn(
      "cannot watch {}: {}{}; running on timers: the periodic pass looks at it every {:g} s "
      "instead, and tries again",
      dir, std::strerror(err), Hint(err, /*instance=*/false),
      std::chrono::duration<double>(options_.rescan_interval).count());
}

void InotifyWatches::NoteWatched(const std::string& dir) {
  if (refused_.erase(dir) == 0 || !refused_.empty()) {
    unavailable_ = static_cast<int>(refused_.size());
    return;
  }
  unavailable_ = 0;
  if (!std::exchange(degraded_, false)) return;
  logged_.clear();
  spdlog::info(
      "inotify watches every directory again: the daemon reacts to changes at once again, not "
      "only at its periodic pass");
}

}  // namespace efa::plugin
