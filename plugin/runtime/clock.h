// The clock the daemon's owner loop and its monitor read. It is injected
// (DaemonOptions::clock) so that tests move time on instead of waiting for
// it: the registration backoff, the periodic pass and its full rescans, the
// alignment-report retry, the DRA re-probe, the counter reads and the
// liveness limit all count on it. gRPC deadlines and RPC latencies stay on
// the real clocks.
#pragma once

#include <chrono>

namespace efa::plugin {

class Clock {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  using duration = std::chrono::steady_clock::duration;
  virtual ~Clock() = default;
  // Never goes back. Thread-safe.
  virtual time_point Now() const = 0;
  // std::chrono::steady_clock, for the whole process.
  static const Clock& Steady();
};

}  // namespace efa::plugin
