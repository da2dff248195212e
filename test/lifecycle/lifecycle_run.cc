#include "test/lifecycle/lifecycle_run.h"

namespace efa::lifecycle {

namespace {

struct Outcome {
  std::optional<Violation> violation;
  size_t failed_at = 0;  // the step (0-based) after which it broke
  std::vector<Step> steps;
  std::vector<std::string> actions;
  std::string log_tail;  // the daemon's last log lines when it broke
  double seconds = 0;
  std::map<std::string, int> counts;
};

// Whether a run starts on the base commit's binary: when there is one, and
// the steps upgrade (generated steps may, unless upgrades are excluded).
bool StartsOnBase(const Config& config, const std::vector<Step>& steps, bool generated) {
  if (config.base_binary.empty()) return false;
  if (generated) return config.excluded.count(Info(Event::kUpgrade).group) == 0;
  return std::any_of(steps.begin(), steps.end(),
                     [](const Step& s) { return s.event == Event::kUpgrade; });
}

// Runs `steps` (or, when `generate` is set, that many generated ones) on a
// fresh node, checking after each; stops at the first violation.
Outcome Run(const Config& config, std::vector<Step> steps, std::optional<unsigned> generate_seed,
            int generate_count, bool print = false) {
  Outcome out;
  const auto start = Clock::now();
  std::optional<Node> node;
  try {
    node.emplace(config, StartsOnBase(config, steps, generate_seed.has_value())
                             ? config.base_binary
                             : std::string(efa::testing::kPluginBinary));
  } catch (const std::exception& e) {
    out.violation = Violation{"harness", e.what()};
    return out;
  }
  std::mt19937 rng(generate_seed.value_or(0));
  const size_t n = generate_seed ? static_cast<size_t>(generate_count) : steps.size();
  for (size_t i = 0; i < n; ++i) {
    const Step step = generate_seed ? Generate(rng, *node, config) : steps[i];
    out.steps.push_back(step);
    std::optional<Violation> v = node->Apply(step, i + 1);
    out.actions.push_back(node->last_action());
    if (print) {
      std::printf("  %4zu. %s\n", i + 1, node->last_action().c_str());
    }
    if (!v) v = node->Check();
    if (v) {
      out.violation = v;
      out.failed_at = i;
      const std::string log = efa::testing::ReadFile(node->log());
      std::vector<std::string> lines = absl::StrSplit(log, '\n', absl::SkipEmpty());
      // EFA_LIFECYCLE_LOG_LINES: more of it, to debug a replay.
      const char* keep = std::getenv("EFA_LIFECYCLE_LOG_LINES");
      const size_t tail = keep != nullptr ? std::strtoul(keep, nullptr, 10) : 40;
      if (lines.size() > tail) lines.erase(lines.begin(), lines.end() - static_cast<long>(tail));
      out.log_tail = absl::StrJoin(lines, "\n");
      break;
    }
  }
  out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  out.counts = node->counts;
  return out;
}

// The shortest sequence found that still breaks `invariant`: chunks of
// steps dropped, halving the chunk down to single steps, each candidate
// replayed on a fresh node; stops when `budget` is spent.
std::vector<Step> Shrink(const Config& config, std::vector<Step> steps,
                         const std::string& invariant, std::chrono::seconds budget, int* replays) {
  const auto until = Clock::now() + budget;
  for (size_t chunk = std::max<size_t>(1, steps.size() / 2); chunk >= 1 && Clock::now() < until;
       chunk /= 2) {
    for (size_t at = 0; at < steps.size() && steps.size() > 1 && Clock::now() < until;) {
      std::vector<Step> candidate(steps.begin(), steps.begin() + static_cast<std::ptrdiff_t>(at));
      candidate.insert(
          candidate.end(),
          steps.begin() + static_cast<std::ptrdiff_t>(std::min(steps.size(), at + chunk)),
          steps.end());
      ++*replays;
      Outcome o = Run(config, candidate, std::nullopt, 0);
      if (o.violation && o.violation->invariant == invariant) {
        candidate.resize(o.failed_at + 1);
        steps = candidate;
      } else {
        at += chunk;
      }
    }
    if (chunk == 1) break;
  }
  return steps;
}

std::string ModeName(const Config& config, bool on_base) {
  return absl::StrCat(config.late_binding ? "late-binding" : "best-effort",
                      config.kubelet_1_20 ? ", kubelet 1.20" : "",
                      on_base ? ", upgrading from " + config.base_commit : "");
}

}  // namespace

bool RunAndReport(const Config& config, std::optional<unsigned> seed,
                  const std::vector<Step>& replay, int steps, std::chrono::seconds shrink_budget) {
  const bool on_base = StartsOnBase(config, replay, seed.has_value());
  const std::string what = seed ? absl::StrCat("seed ", *seed, " (", ModeName(config, on_base),
                                               ", ", config.machine, ", ", steps, " steps)")
                                : absl::StrCat("replay (", ModeName(config, on_base), ", ",
                                               config.machine, ", ", replay.size(), " steps)");
  Outcome o = Run(config, replay, seed, steps, config.verbose);
  if (!o.violation) {
    std::vector<std::string> counts;
    for (const auto& [name, n] : o.counts) counts.push_back(absl::StrCat(name, " ", n));
    std::printf("lifecycle: %s held: %zu steps in %.1f s (%.1f steps/s): %s\n", what.c_str(),
                o.steps.size(), o.seconds,
                static_cast<double>(o.steps.size()) / std::max(o.seconds, 1e-3),
                absl::StrJoin(counts, ", ").c_str());
    return true;
  }
  const Violation& v = *o.violation;
  std::printf("lifecycle: %s FAILED at step %zu: %s: %s\n", what.c_str(), o.failed_at + 1,
              v.invariant.c_str(), v.detail.c_str());
  std::printf("lifecycle: the steps up to it:\n");
  const size_t first = o.failed_at >= 40 ? o.failed_at - 39 : 0;
  if (first > 0) std::printf("  ... (%zu earlier steps)\n", first);
  for (size_t i = first; i <= o.failed_at && i < o.actions.size(); ++i) {
    std::printf("  %4zu. %s\n", i + 1, o.actions[i].c_str());
  }
  std::printf("lifecycle: the daemon's last log lines:\n%s\n", o.log_tail.c_str());
  if (v.invariant == "harness") return false;
  std::vector<Step> failing(o.steps.begin(),
                            o.steps.begin() + static_cast<std::ptrdiff_t>(o.failed_at + 1));
  int replays = 0;
  const auto started = Clock::now();
  std::vector<Step> shortest = Shrink(config, failing, v.invariant, shrink_budget, &replays);
  Outcome again = Run(config, shortest, std::nullopt, 0);
  std::printf(
      "lifecycle: shortest failing sequence found: %zu of %zu steps (%d replays, %.0f s)%s:\n",
      shortest.size(), failing.size(), replays,
      std::chrono::duration<double>(Clock::now() - started).count(),
      again.violation ? "" : " (its last replay held: a race)");
  for (size_t i = 0; i < again.actions.size(); ++i)
    std::printf("  %4zu. %s\n", i + 1, again.actions[i].c_str());
  if (again.violation) {
    std::printf("  -> %s: %s\n", again.violation->invariant.c_str(),
                again.violation->detail.c_str());
  }
  std::printf("lifecycle: replay: efa-lifecycle --mode %s --machine %s%s --replay '%s'\n",
              config.late_binding ? "late-binding" : "best-effort", config.machine.c_str(),
              config.kubelet_1_20 ? " --kubelet-1-20" : "", Encode(shortest).c_str());
  return false;
}

}  // namespace efa::lifecycle
