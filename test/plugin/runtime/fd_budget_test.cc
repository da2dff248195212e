// The descriptor budget: the HTTP side gets what the limit leaves after the
// descriptors open at start and the daemon's reserve, and the soft limit is
// raised to the hard one.
#include "plugin/runtime/fd_budget.h"

#include <sys/resource.h>

#include <catch2/catch.hpp>
#include <climits>

using namespace efa::plugin;

TEST_CASE("The HTTP side gets the limit less the descriptors open and the reserve",
          "[descriptors]") {
  const DescriptorBudget b = ComputeDescriptorBudget(1024, 4096, 10);
  CHECK(b.soft == 1024);
  CHECK(b.hard == 4096);
  CHECK(b.in_use == 10);
  CHECK(b.reserve == 256);
  CHECK(b.http_allowance == 1024 - 10 - 256);
  // A limit below the reserve still leaves the probes a few.
  CHECK(ComputeDescriptorBudget(200, 200, 10).http_allowance == kMinHttpDescriptors);
  CHECK(ComputeDescriptorBudget(270, 270, 10).http_allowance == kMinHttpDescriptors);
  CHECK(ComputeDescriptorBudget(275, 275, 10).http_allowance == 9);
  CHECK(ComputeDescriptorBudget(uint64_t{1} << 40, uint64_t{1} << 40, 10).http_allowance ==
        INT_MAX);
}

TEST_CASE("The HTTP caps fit in the HTTP side's allowance", "[descriptors]") {
  const efa::plugin::EndpointLimits configured{64, 16, std::chrono::milliseconds(3000)};
  auto fit = efa::plugin::FitEndpointLimits(configured, 1000);
  CHECK(fit.metrics_connections == 64);
  CHECK(fit.probe_connections == 16);
  fit = efa::plugin::FitEndpointLimits(configured, 42);  // 40 connections
  CHECK(fit.probe_connections == 10);
  CHECK(fit.metrics_connections == 30);
  CHECK(fit.request_timeout == configured.request_timeout);
  fit = efa::plugin::FitEndpointLimits(configured, efa::plugin::kMinHttpDescriptors);
  CHECK(fit.metrics_connections + fit.probe_connections + 2 <= efa::plugin::kMinHttpDescriptors);
  CHECK(fit.probe_connections >= 1);
  CHECK(fit.metrics_connections >= 1);
}

TEST_CASE("At start the soft descriptor limit is raised to the hard one", "[descriptors]") {
  rlimit saved{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
  if (saved.rlim_max < 2048) {
    WARN("the hard limit is too low to lower the soft one: " << saved.rlim_max);
    return;
  }
  rlimit low = saved;
  low.rlim_cur = 1024;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  const DescriptorBudget b = InitDescriptorBudget();
  rlimit now{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &now) == 0);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &saved) == 0);
  CHECK(now.rlim_cur == saved.rlim_max);
  CHECK(b.soft_at_start == 1024);
  CHECK(b.soft == saved.rlim_max);
  CHECK(b.hard == saved.rlim_max);
  CHECK(b.in_use >= 3);  // stdin, stdout, stderr at least
  CHECK(b.http_allowance == ComputeDescriptorBudget(b.soft, b.hard, b.in_use).http_allowance);
  CHECK(HttpDescriptorAllowance() == b.http_allowance);
}
