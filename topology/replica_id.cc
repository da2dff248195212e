#include "topology/replica_id.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace efa::topology {

std::string ReplicaId(std::string_view ibdev, int replica) {
  return absl::StrCat(std::string(ibdev), kReplicaSeparator, replica);
}

std::optional<ReplicaRef> ParseReplicaId(std::string_view id) {
  const size_t sep = id.rfind(kReplicaSeparator);
  if (sep == std::string_view::npos || sep == 0) return std::nullopt;
  const std::string_view number = id.substr(sep + 2);
  // One spelling per replica, so that an ID maps back to itself.
  if (number.empty() || (number.size() > 1 && number[0] == '0')) return std::nullopt;
  for (char c : number) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  int replica = 0;
  if (!absl::SimpleAtoi(std::string(number), &replica) || replica >= kMaxReplicas) {
    return std::nullopt;
  }
  return ReplicaRef{std::string(id.substr(0, sep)), replica};
}

}  // namespace efa::topology
