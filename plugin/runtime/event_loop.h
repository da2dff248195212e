// The owner loops' wait, shared by the daemon (plugin/daemon.cc) and the
// idle process (plugin/idle_main.cc): one poll() over the descriptors they
// watch, an eventfd other threads write to wake it, the signals of
// signals.h through a signalfd, and timers on the caller's clock.
//
//   EventLoop loop({.clock = ..., .take_signals = true, .on_hangup = ...});
//   if (!loop.Open().ok()) ...
//   loop.Watch(inotify_fd, [&] { HandleInotify(); });
//   loop.AddTimer([&] { return next_pass; }, [&] { Pass(); });
//   while (!loop.stopped()) {
//     ...                                // the pass's own work
//     if (!loop.RunOnce()) break;        // wait, handle, run the due timers
//   }
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "plugin/runtime/clock.h"

namespace efa::plugin {

// Owner thread only (the one that calls RunOnce), except Wake(), Stop()
// and stopped(), which are thread-safe.
class EventLoop {
 public:
  using TimePoint = Clock::time_point;
  struct Options {
    // The time timers are due on (the daemon's Clock, which tests replace:
    // they call Wake() after moving it on). Not owned; outlives the loop.
    const Clock* clock = &Clock::Steady();
    // Take OwnerLoopSignals() (signals.h) through a signalfd; the caller
    // must have blocked them in every thread. SIGTERM and SIGINT stop the
    // loop, SIGHUP calls on_hangup (ignored when there is none), SIGCHLD
    // reaps the orphans when the process InheritsOrphans()
    // (orphan_reaper.h).
    bool take_signals = false;
    std::function<void()> on_hangup;
  };

  explicit EventLoop(Options options);
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Takes the signals (take_signals) and reaps the orphans handed over
  // before. Fails, naming the cause, when the wake-up eventfd could not be
  // created; a signalfd that cannot be opened is logged, and the loop runs
  // without it. Call once, before RunOnce().
  absl::Status Open();
  // RunOnce() calls `on_readable` when `fd` (not owned; open while the loop
  // runs) is readable; the handler reads what came. A negative `fd` is
  // never readable.
  void Watch(int fd, std::function<void()> on_readable);
  // A timer: RunOnce() wakes when now() reaches due() and then calls `run`.
  // due() is asked again before each wait and after it: TimePoint::max()
  // is never, TimePoint::min() at once.
  void AddTimer(std::function<TimePoint()> due, std::function<void()> run);

  // Waits until a watched descriptor is readable, a signal or Wake()
  // comes, or now() reaches `wake_by` or a timer's due(); then calls the
  // handlers of the descriptors that are readable (in the order watched),
  // handles the signals, and runs every timer that is due (in the order
  // added). Returns false (logged) when poll() fails otherwise than with
  // EINTR.
  bool RunOnce(TimePoint wake_by = TimePoint::max());

  // Makes the current or next RunOnce() return now. Thread-safe.
  void Wake();
  // Marks the loop stopped and wakes it. Thread-safe.
  void Stop();
  // Whether Stop() was called or a stop signal came. Thread-safe.
  bool stopped() const { return stopped_.load(); }

 private:
  struct Watched {
    int fd;
    std::function<void()> on_readable;
  };
  struct Timer {
    std::function<TimePoint()> due;
    std::function<void()> run;
  };
  // How long poll() may wait for `wake_by` and the timers, in ms (-1:
  // without end).
  int Timeout(TimePoint wake_by) const;
  void HandleSignals();

  const Options options_;
  const int wake_fd_;
  const int wake_errno_;  // why wake_fd_ could not be created
  int signal_fd_ = -1;
  bool reap_orphans_ = false;
  std::vector<Watched> watched_;
  std::vector<Timer> timers_;
  std::atomic<bool> stopped_{false};
};

}  // namespace efa::plugin
