#include "plugin/runtime/probes.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace efa::plugin {
namespace {

std::string Seconds(std::chrono::steady_clock::duration d) {
  const double s = std::chrono::duration<double>(d).count();
  return absl::StrCat(std::round(s * 10) / 10, "s");
}

}  // namespace

ProbeVerdict Liveness(std::optional<std::chrono::steady_clock::time_point> heartbeat,
                      std::chrono::steady_clock::time_point now,
                      std::chrono::milliseconds rescan_interval) {
  if (!heartbeat) return {false, "the owner loop has not started"};
  const auto age = now - *heartbeat;
  const auto limit = 3 * rescan_interval + std::chrono::seconds(15);
  if (age > limit) {
    return {false, absl::StrCat("the owner loop last ran ", Seconds(age), " ago (limit ",
                                Seconds(limit), ")")};
  }
  return {true, absl::StrCat("the owner loop ran ", Seconds(age), " ago")};
}

HttpResponse Probe(const ProbeVerdict& verdict) {
  return {verdict.ok ? 200 : 503, "text/plain; charset=utf-8",
          absl::StrCat(verdict.ok ? "ok: " : "not ok: ", verdict.reason, "\n")};
}

}  // namespace efa::plugin
