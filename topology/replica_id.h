// The device IDs of shared EFAs (docs/alignment.md, "Sharing"). With `sharing.replicas`
// N > 1 each EFA is advertised as N IDs "<ibdev>::<n>", n = 0..N-1 (the
// NVIDIA device plugin's time-slicing format, e.g. "rdmap79s0::2"); with
// N = 1 the ID is the ibdev name alone, as without sharing. The only place
// that builds or parses these IDs.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace efa::topology {

inline constexpr char kReplicaSeparator[] = "::";
// The largest `sharing.replicas`.
inline constexpr int kMaxReplicas = 64;

struct ReplicaRef {
  std::string ibdev;  // the physical EFA
  int replica = 0;    // 0..replicas-1
};

// "<ibdev>::<replica>". Pure.
std::string ReplicaId(std::string_view ibdev, int replica);

// The EFA and replica an ID names, or nullopt when `id` is not
// "<non-empty name>::<decimal 0..kMaxReplicas-1 without leading zeros>".
// Pure.
std::optional<ReplicaRef> ParseReplicaId(std::string_view id);

}  // namespace efa::topology
