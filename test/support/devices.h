// The names and the deadline the tests share, and predicates over the device
// lists a plugin sends the kubelet (ListAndWatch).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "deviceplugin/v1beta1/api.pb.h"

namespace efa::testing {

// The resource the daemon registers (without sharing's rename).
inline constexpr char kEfa[] = "vpc.amazonaws.com/efa";
// The NVIDIA device plugin's resource.
inline constexpr char kGpu[] = "nvidia.com/gpu";
// How long a test waits for what the daemon does in answer to one step
// (a registration, a device list, a guard verdict) before it fails.
inline constexpr std::chrono::seconds kDeadline{10};

// Whether `devices` holds exactly `n` devices, each `health`.
inline bool AllAre(const std::vector<v1beta1::Device>& devices, const std::string& health,
                   size_t n) {
  return devices.size() == n && std::all_of(devices.begin(), devices.end(),
                                            [&](const auto& d) { return d.health() == health; });
}
inline bool AllHealthy(const std::vector<v1beta1::Device>& devices, size_t n) {
  return AllAre(devices, "Healthy", n);
}

// The health `devices` (a device list or a ListAndWatchResponse's devices())
// gives `id`, or "absent".
template <typename Devices>
std::string HealthOf(const Devices& devices, const std::string& id) {
  for (const auto& d : devices) {
    if (d.id() == id) return d.health();
  }
  return "absent";
}

}  // namespace efa::testing
