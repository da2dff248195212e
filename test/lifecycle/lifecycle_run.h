// efa-lifecycle's runs: one seed's generated steps (or a replayed
// sequence) on a fresh node, checked after each; a failure reported with
// the shortest failing sequence found by dropping steps and replaying.
#pragma once

#include <chrono>
#include <optional>
#include <vector>

#include "test/lifecycle/lifecycle_events.h"
#include "test/lifecycle/lifecycle_node.h"

namespace efa::lifecycle {

// One seed (or one replayed sequence): runs, reports, shrinks. Returns
// whether every invariant held.
bool RunAndReport(const Config& config, std::optional<unsigned> seed,
                  const std::vector<Step>& replay, int steps, std::chrono::seconds shrink_budget);

}  // namespace efa::lifecycle
