#include "test/lifecycle/lifecycle_events.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "test/lifecycle/lifecycle_node.h"

namespace efa::lifecycle {

const EventInfo& Info(Event event) {
  for (const EventInfo& info : kEvents) {
    if (info.event == event) return info;
  }
  std::abort();
}

std::string Encode(const std::vector<Step>& steps) {
  std::vector<std::string> parts;
  for (const Step& s : steps)
    parts.push_back(absl::StrCat(Info(s.event).name, ":", s.pick, ":", s.shape));
  return absl::StrJoin(parts, ",");
}

std::optional<std::vector<Step>> Decode(const std::string& text) {
  std::vector<Step> steps;
  const std::vector<std::string> parts = absl::StrSplit(text, ',', absl::SkipEmpty());
  for (const std::string& part : parts) {
    std::vector<std::string> f = absl::StrSplit(part, ':');
    if (f.size() != 3) return std::nullopt;
    const EventInfo* info = nullptr;
    for (const EventInfo& e : kEvents) info = f[0] == e.name ? &e : info;
    Step s;
    if (info == nullptr || !absl::SimpleAtoi(f[1], &s.pick) || !absl::SimpleAtoi(f[2], &s.shape)) {
      return std::nullopt;
    }
    s.event = info->event;
    steps.push_back(s);
  }
  return steps;
}

Step Generate(std::mt19937& rng, const Node& node, const Config& config) {
  std::vector<std::pair<Event, int>> weights;
  auto add = [&](Event event, int weight) {
    if (weight > 0 && config.excluded.count(Info(event).group) == 0)
      weights.emplace_back(event, weight);
  };
  const bool synced = node.synced();
  add(Event::kAdmit, synced ? 30 : 0);
  add(Event::kAdmitWithInit, synced ? 6 : 0);
  add(Event::kFinishInit, synced && node.any(Container::State::kRunning, true) ? 12 : 0);
  add(Event::kRestartContainer, synced && node.pods() > 0 ? 10 : 0);
  add(Event::kDeletePod, node.pods() > 0 ? 5 + 3 * node.pods() : 0);
  add(Event::kRestartKubelet, 4);
  add(Event::kSyncPods, synced ? 0 : 40);
  // On the base binary the daemon only runs: its restarts' and
  // configuration changes' bugs are known (issue 42); the upgrade step is
  // the first restart.
  add(Event::kRestartDaemon, node.on_base() ? 0 : 2);
  add(Event::kKillDaemon, node.on_base() ? 0 : 2);
  add(Event::kRemoveEfa, 4);
  add(Event::kReturnEfa, node.removed_efas() > 0 ? 6 : 0);
  add(Event::kReturnEfaRenamed, node.removed_efas() > 0 ? 3 : 0);
  add(Event::kFillFds, 2);
  add(Event::kCdiReadOnly, node.daemon_config().late() && !node.read_only() ? 2 : 0);
  add(Event::kCdiWritable, node.read_only() ? 25 : 0);
  add(Event::kReconfigure, node.on_base() ? 0 : 3);
  add(Event::kUpgrade, node.on_base() ? 4 : 0);
  int total = 0;
  for (const auto& [event, weight] : weights) total += weight;
  int r = static_cast<int>(rng() % static_cast<uint32_t>(total));
  Step step{weights.back().first, static_cast<uint32_t>(rng()), static_cast<uint32_t>(rng())};
  for (const auto& [event, weight] : weights) {
    if ((r -= weight) < 0) {
      step.event = event;
      break;
    }
  }
  return step;
}

}  // namespace efa::lifecycle
