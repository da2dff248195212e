// The daemon's descriptor budget. A neighbour can make the daemon open
// descriptors (connections to the metrics port); the daemon's own work
// (sockets to the kubelet, inotify, sysfs reads, CDI writes) must never be
// the one to find the table full. At start the soft RLIMIT_NOFILE is
// raised to the hard limit, and a reserve is kept: the HTTP side caps what
// it holds at HttpDescriptorAllowance().
//
//   InitDescriptorBudget();                        // main, before any server
//   int cap = std::min(configured_connections, HttpDescriptorAllowance());
#pragma once

#include <cstdint>

#include "plugin/runtime/http_server.h"

namespace efa::plugin {

// Descriptors kept for the daemon's own work after start, beyond those open
// at start: gRPC (its server, the kubelet's connections, the registration
// and pod-resources channels), the owner loop's eventfd, inotify, uevent
// socket and signalfd, and at their peak together the sysfs reads of
// discovery and the counters, hwloc's load, a CDI spec write and the
// guards' reads. The daemon on a simulated p5.48xlarge holds about 40 in
// its steady state; the reserve is several times that.
inline constexpr int kDescriptorReserve = 256;
// The least the HTTP side is given however low the limit: its listeners
// and a few connections, so that the kubelet's probes are answered.
inline constexpr int kMinHttpDescriptors = 8;

struct DescriptorBudget {
  uint64_t soft_at_start = 0;  // the soft RLIMIT_NOFILE found
  uint64_t soft = 0;           // the soft limit now: the hard limit unless raising failed
  uint64_t hard = 0;
  int in_use = 0;          // descriptors open when the budget was made
  int reserve = 0;         // kDescriptorReserve
  int http_allowance = 0;  // what the HTTP side may hold at once
};

// The budget of a process whose soft limit is `soft` with `in_use`
// descriptors open: the HTTP allowance is soft - in_use - reserve, never
// less than kMinHttpDescriptors (nor more than INT_MAX). Pure.
DescriptorBudget ComputeDescriptorBudget(uint64_t soft, uint64_t hard, int in_use);

// Raises the soft RLIMIT_NOFILE to the hard limit (a failure is logged and
// the soft limit kept), counts the descriptors open now, fixes the HTTP
// allowance from them and logs the limits and figures once. Call once, in
// main, before the HTTP servers and gRPC start. Not thread-safe with
// itself; returns the budget.
DescriptorBudget InitDescriptorBudget();

// How many descriptors the HTTP side (every listener and connection of
// plugin/runtime/http_server together) may hold at once: the figure
// InitDescriptorBudget fixed, or, in a process that never called it (a
// test), one computed once from the limit and the descriptors open at the
// first call, without raising anything. Always >= kMinHttpDescriptors.
// Thread-safe.
int HttpDescriptorAllowance();

// `limits` with the two listeners' connection caps lowered, if need be, so
// that they and the two listening sockets fit in `allowance` descriptors:
// the probes keep at most a quarter, each cap at least 1. Pure.
EndpointLimits FitEndpointLimits(EndpointLimits limits, int allowance);

}  // namespace efa::plugin
