#include "plugin/runtime/fd_budget.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>

#include "spdlog/spdlog.h"
#include "topology/sysfs.h"

namespace efa::plugin {
namespace {

std::atomic<int> http_allowance{0};  // 0: not fixed yet

// Descriptors open now, or 0 when /proc/self/fd cannot be listed (its own
// listing's descriptor is not counted).
int DescriptorsInUse() {
  auto names = topology::ListDirectory("/proc/self/fd");
  return names.ok() && !names->empty() ? static_cast<int>(names->size()) - 1 : 0;
}

}  // namespace

DescriptorBudget ComputeDescriptorBudget(uint64_t soft, uint64_t hard, int in_use) {
  DescriptorBudget b;
  b.soft_at_start = soft;
  b.soft = soft;
  b.hard = hard;
  b.in_use = in_use;
  b.reserve = kDescriptorReserve;
  const uint64_t taken = static_cast<uint64_t>(std::max(in_use, 0)) + kDescriptorReserve;
  const uint64_t left = soft > taken ? soft - taken : 0;
  b.http_allowance = static_cast<int>(
      std::clamp<uint64_t>(left, kMinHttpDescriptors, static_cast<uint64_t>(INT_MAX)));
  return b;
}

DescriptorBudget InitDescriptorBudget() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    spdlog::warn("descriptors: cannot read RLIMIT_NOFILE: {}", std::strerror(errno));
    limit.rlim_cur = limit.rlim_max = 1024;
  }
  const uint64_t soft_at_start = limit.rlim_cur;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) {
      limit = raised;
    } else {
      spdlog::warn("descriptors: cannot raise the soft limit from {} to the hard limit {}: {}",
                   limit.rlim_cur, limit.rlim_max, std::strerror(errno));
    }
  }
  DescriptorBudget b = ComputeDescriptorBudget(limit.rlim_cur, limit.rlim_max, DescriptorsInUse());
  b.soft_at_start = soft_at_start;
  http_allowance = b.http_allowance;
  spdlog::info(
      "descriptors: soft limit {} (was {}), hard limit {}; {} open at start, {} kept for the "
      "daemon's own work; the HTTP side may hold {}",
      b.soft, b.soft_at_start, b.hard, b.in_use, b.reserve, b.http_allowance);
  return b;
}

int HttpDescriptorAllowance() {
  int allowance = http_allowance.load();
  if (allowance > 0) return allowance;
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) limit.rlim_cur = limit.rlim_max = 1024;
  allowance =
      ComputeDescriptorBudget(limit.rlim_cur, limit.rlim_max, DescriptorsInUse()).http_allowance;
  int expected = 0;
  // The first figure stays: callers may size things by it.
  return http_allowance.compare_exchange_strong(expected, allowance) ? allowance : expected;
}

EndpointLimits FitEndpointLimits(EndpointLimits limits, int allowance) {
  const int connections = std::max(2, allowance - 2);  // less the listening sockets
  if (limits.metrics_connections + limits.probe_connections <= connections) return limits;
  limits.probe_connections = std::clamp(connections / 4, 1, limits.probe_connections);
  limits.metrics_connections =
      std::clamp(connections - limits.probe_connections, 1, limits.metrics_connections);
  return limits;
}

}  // namespace efa::plugin
