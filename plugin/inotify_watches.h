// The owner loop's inotify instance and the directories watched on it, and
// the daemon's account of them when the kernel refuses one: no instance
// (EMFILE: uid 0's fs.inotify.max_user_instances, 128 on many
// distributions, is shared by every root container of the node) or no watch
// (ENOSPC: max_user_watches; ENOMEM). inotify only makes the daemon react
// sooner: without it the periodic pass looks at what the events would have
// said (the daemon runs on its timers), and asks again, so the fast path
// comes back once the resource frees up. Each cause is logged once, with
// what the daemon does instead, and so is the recovery.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>

namespace efa::plugin {

// Owner thread only, except unavailable(), which is thread-safe.
class InotifyWatches {
 public:
  struct Options {
    // The periodic pass's interval, for the logs (given by the daemon).
    std::chrono::milliseconds rescan_interval{};
  };
  // What Add() found.
  struct Watch {
    int wd = -1;  // the watch descriptor, when watched
    // Not watched although the directory may be there: no instance, or the
    // kernel refused the watch. The caller looks on its timers and asks
    // again at its next pass. Not refused and no descriptor: the directory
    // is absent (ENOENT, ENOTDIR), nothing to watch yet.
    bool refused = false;
  };

  explicit InotifyWatches(Options options);
  ~InotifyWatches();
  InotifyWatches(const InotifyWatches&) = delete;
  InotifyWatches& operator=(const InotifyWatches&) = delete;

  // Creates the instance when there is none (at start, then at each
  // periodic pass while it fails); returns whether it was created by this
  // call (the caller watches the descriptor).
  bool Open();
  // The instance's descriptor, or -1 while there is none.
  int fd() const { return fd_; }
  // inotify_add_watch(fd(), dir, mask), accounted for.
  Watch Add(const std::filesystem::path& dir, uint32_t mask);
  // The directories asked for that are not watched now because the kernel
  // refused (at their latest Add), every one while there is no instance.
  // Thread-safe.
  int unavailable() const { return unavailable_.load(); }

 private:
  // Logs the first refusal of each cause, and the end of them all.
  void NoteRefused(const std::string& dir, int err);
  void NoteWatched(const std::string& dir);

  const Options options_;
  int fd_ = -1;
  int instance_error_ = 0;              // the errno of the latest failed inotify_init1
  std::map<std::string, int> refused_;  // directory -> errno of its latest Add
  std::set<int> logged_;                // causes logged since everything was last watched
  bool degraded_ = false;               // a cause was logged; the recovery is to be
  std::atomic<int> unavailable_{0};
};

}  // namespace efa::plugin
