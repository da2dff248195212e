#include "plugin/kubelet/file_change_watch.h"

#include <sys/inotify.h>
#include <unistd.h>

#include <string>
#include <utility>

namespace efa::plugin {

FileChangeWatch::FileChangeWatch(std::filesystem::path file)
    : file_(std::move(file)), name_(file_.filename().string()) {}

FileChangeWatch::~FileChangeWatch() {
  absl::MutexLock lock(&mu_);
  if (fd_ >= 0) ::close(fd_);
}

bool FileChangeWatch::Changed() {
  absl::MutexLock lock(&mu_);
  // Created at the first call: an object never asked costs no descriptor.
  // While the kernel gives none (EMFILE: uid 0's max_user_instances),
  // every call is true and asks again.
  if (fd_ < 0) fd_ = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (fd_ < 0) return true;
  bool changed = std::exchange(first_, false);
  bool look = wd_ < 0 && ancestor_wd_ < 0;  // nothing watched yet
  alignas(inotify_event) char buf[4096];
  while (true) {
    const ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n <= 0) break;
    for (char* p = buf; p < buf + n;) {
      const auto* ev = reinterpret_cast<const inotify_event*>(p);
      p += sizeof(inotify_event) + ev->len;
      if (ev->mask & IN_Q_OVERFLOW) {
        changed = true;
        look = wd_ < 0;
      } else if (ev->wd == ancestor_wd_) {
        look = true;  // something appeared on the way to the directory
      } else if (ev->wd == wd_ && (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED))) {
        // The directory went: watch it again once it is back.
        changed = true;
        look = true;
        if (ev->mask & IN_MOVE_SELF) ::inotify_rm_watch(fd_, wd_);
        wd_ = -1;
      } else if (ev->wd == wd_ && ev->len > 0 && name_ == ev->name) {
        changed = true;
      }
    }
  }
  if (wd_ >= 0 || !look) return changed;
  // The watch comes before the caller reads the file, so a change after the
  // read is never missed. While the directory is absent, its nearest
  // existing ancestor is watched instead (first, so that the directory
  // appearing meanwhile is seen): until something is created there, the
  // file cannot have appeared and no call looks at the file system.
  if (ancestor_wd_ >= 0) ::inotify_rm_watch(fd_, ancestor_wd_);
  ancestor_wd_ = -1;
  const std::filesystem::path dir = file_.parent_path();
  for (std::filesystem::path p = dir.parent_path();; p = p.parent_path()) {
    ancestor_wd_ = ::inotify_add_watch(
        fd_, p.c_str(), IN_CREATE | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR);
    if (ancestor_wd_ >= 0 || p == p.parent_path() || p.empty()) break;
  }
  wd_ = ::inotify_add_watch(fd_, dir.c_str(),
                            IN_CREATE | IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE |
                                IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR);
  if (wd_ >= 0) {
    ::inotify_rm_watch(fd_, ancestor_wd_);
    ancestor_wd_ = -1;
    return true;
  }
  return changed || ancestor_wd_ < 0;  // nothing watchable: every call is true
}

}  // namespace efa::plugin
