// The expected-EFA-count check: a node launched with fewer EFA interfaces
// than its instance type supports (a launch template or Karpenter
// EC2NodeClass whose network interfaces lack interfaceType efa or efa-only)
// looks healthy and simply offers fewer vpc.amazonaws.com/efa. The check
// compares the EFAs found with the instance type's EFA count.
#pragma once

#include <prometheus/metric_family.h>

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace efa::plugin {

// The node's instance type: `configured` when not empty, else the DMI
// product name under `sysfs_root`, else empty (unknown). Reads the host.
std::string ResolveInstanceType(const std::string& configured,
                                const std::filesystem::path& sysfs_root);

struct ExpectedEfasCheck {
  std::string instance_type;    // empty when unknown
  std::optional<int> expected;  // nullopt: nothing to compare with
  // `expected` is expectedEfaCount, not the instance-type table's
  // (topology::SupportedEfaCount).
  bool configured = false;
  int found = 0;

  bool short_of_expected() const { return expected && found < *expected; }
  bool as_expected() const { return expected && found == *expected; }
  // One line saying what was found against what was expected, and for a
  // shortfall the likely cause, e.g. "found 31 EFAs, but a p5.48xlarge
  // supports 32: ...".
  std::string Describe() const;
};

// `expected_efa_count` > 0 wins over the table.
ExpectedEfasCheck CheckExpectedEfas(const std::string& instance_type, int expected_efa_count,
                                    int found);

// The check across the daemon's rescans: logs when the outcome changes
// (never once per rescan) and keeps the latest for metrics. Thread-safe.
class ExpectedEfasMonitor {
 public:
  ExpectedEfasMonitor(std::string instance_type, int expected_efa_count);
  // A rescan found `found` EFAs.
  void Observe(int found);
  // The latest check, or nullopt before the first Observe().
  std::optional<ExpectedEfasCheck> latest() const;

 private:
  const std::string instance_type_;
  const int expected_efa_count_;
  mutable absl::Mutex mu_;
  std::optional<ExpectedEfasCheck> latest_ ABSL_GUARDED_BY(mu_);
};

// The families efas_found and efas_expected of `check` (nullopt: before
// the first scan) appended to `out`.
void CollectExpectedEfas(const std::optional<ExpectedEfasCheck>& check,
                         std::vector<prometheus::MetricFamily>& out);

}  // namespace efa::plugin
