// A clock that moves only when a test says so, for the daemon's owner loop
// and monitor (DaemonOptions::clock): a test moves it past a backoff, a
// periodic pass or the liveness limit instead of waiting for it.
#pragma once

#include <atomic>
#include <chrono>
#include <thread>

#include "plugin/daemon.h"

namespace efa::testing {

class FakeClock final : public plugin::Clock {
 public:
  FakeClock() = default;
  explicit FakeClock(duration start) : now_(start.count()) {}
  time_point Now() const override { return time_point(duration(now_.load())); }
  void Advance(duration d) { now_ += d.count(); }

 private:
  std::atomic<duration::rep> now_{duration(std::chrono::hours(1)).count()};
};

// Moves `clock` on by `d`, wakes the daemon and waits, at most `timeout`,
// until its owner loop has seen the new time (its heartbeat). Returns
// whether it did. The pass that acts on the new time may still be running:
// a test repeats this until what it waits for holds, with a bound.
inline bool AdvanceOnePass(FakeClock& clock, plugin::Daemon& daemon, FakeClock::duration d,
                           std::chrono::milliseconds timeout) {
  clock.Advance(d);
  const FakeClock::time_point now = clock.Now();
  daemon.Wake();
  // A pass has no event of its own to wait on: its heartbeat is polled.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (auto beat = daemon.heartbeat(); beat && *beat >= now) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

}  // namespace efa::testing
