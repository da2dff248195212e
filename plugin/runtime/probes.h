// The liveness verdict and a probe's HTTP answer, shared by the daemon's
// monitor and the idle process (efa-k8s-device-plugin-idle).
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "plugin/runtime/http_server.h"

namespace efa::plugin {

// A probe's answer: OK or not, and why, in words.
struct ProbeVerdict {
  bool ok = false;
  std::string reason;
};

// Readiness on a node without EFA: its steady state, nothing to register.
inline constexpr char kNoEfaReadiness[] = "no EFA on this node, nothing to register";

// Alive while the owner loop's last pass is younger than 3 rescan intervals
// plus 15 s (the loop waits up to one interval between passes, and a
// registration may take 10 s). Pure.
ProbeVerdict Liveness(std::optional<std::chrono::steady_clock::time_point> heartbeat,
                      std::chrono::steady_clock::time_point now,
                      std::chrono::milliseconds rescan_interval);

// 200 "ok: <reason>" or 503 "not ok: <reason>", as text.
HttpResponse Probe(const ProbeVerdict& verdict);

}  // namespace efa::plugin
