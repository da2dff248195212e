// Measure 2: the allocation policy's CPU time per decision on synthetic
// nodes of 32 to 1024 EFAs, against sorting the same free IDs.
#include <time.h>

#include <algorithm>
#include <random>

#include "absl/strings/str_format.h"
#include "test/bench/bench.h"
#include "test/bench/policy_scenarios.h"
#include "topology/allocation_policy.h"

namespace efa::bench {

namespace {

// Times `fn` (which returns something to keep it from being optimized
// away) on this thread's CPU clock, so that other load on the machine stays
// out: batches of at least `min_batch` seconds; the median time per call.
volatile size_t sink;
template <typename F>
double TimePerCall(F&& fn, double min_batch, int batches) {
  auto cpu_now = [] {
    timespec t{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
  };
  size_t kept = 0;
  auto run = [&](long n) {
    const double start = cpu_now();
    for (long i = 0; i < n; ++i) kept += fn();
    return cpu_now() - start;
  };
  long n = 1;
  while (run(n) < min_batch) n *= 2;
  std::vector<double> per_call;
  for (int b = 0; b < batches; ++b) per_call.push_back(run(n) / static_cast<double>(n));
  sink = sink + kept;
  return Median(per_call);
}

}  // namespace

// 2. ChooseEfas on synthetic nodes, against sorting the same free IDs.
void MeasurePolicy(Bench& bench) {
  const double min_batch = bench.settings.quick ? 0.002 : 0.02;
  const int batches = bench.settings.quick ? 3 : 7;
  for (const auto& scenario : PolicyScenarios()) {
    std::vector<double> policy, sort;
    size_t free_ids = 0;
    for (int n : kPolicySizes) {
      const auto model = PolicyHost(n);
      const auto request = scenario.request(*model);
      policy.push_back(TimePerCall(
          [&] { return efa::topology::ChooseEfas(*model, request).size(); }, min_batch, batches));
      std::vector<std::string> shuffled = request.available;
      std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(7));
      sort.push_back(TimePerCall(
          [&] {
            auto ids = shuffled;
            std::sort(ids.begin(), ids.end());
            return ids.size();
          },
          min_batch, batches));
      free_ids = request.available.size();
    }
    bench.policy_curve.emplace_back(scenario.name, policy);
    const std::string name = absl::StrFormat("policy %s (%s)", scenario.name, scenario.description);
    bench.rows.push_back({2, name + ": 1024 EFAs, 128 GPUs", Us(policy.back()),
                          absl::StrFormat("sort the %d free IDs: %s", free_ids, Us(sort.back())),
                          policy.back() / sort.back(), "≤ 1 ms", policy.back() <= 1e-3});
    const double growth = policy.back() / policy.front();
    const double sort_growth = sort.back() / sort.front();
    bench.rows.push_back({2, name + ": growth 32 → 1024 EFAs", absl::StrFormat("%.1f×", growth),
                          absl::StrFormat("sort: %.1f×", sort_growth), growth / sort_growth,
                          "≤ 64× (n log n)", growth <= 64});
  }
}
}  // namespace efa::bench
