// Fuzzes ParseCheckpoint, the parser of the kubelet's device-manager
// checkpoint (JSON with base64 protobuf inside), and the MOFED guard's
// reading of what it parsed. Any bytes give a checkpoint or an
// InvalidArgument that names the file, never an exception.
#include <cstddef>
#include <cstdint>

#include "absl/strings/match.h"
#include "plugin/guards/mofed_guard.h"
#include "plugin/kubelet/kubelet_checkpoint.h"
#include "test/fuzz/fuzz_check.h"

using namespace efa::plugin;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto checkpoint = ParseCheckpoint(efa::fuzz::AsText(data, size), "checkpoint");
  if (!checkpoint.ok()) {
    FUZZ_CHECK(checkpoint.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK_MSG(absl::StartsWith(checkpoint.status().message(), "checkpoint:"),
                   checkpoint.status().message());
  } else {
    for (const std::string& skipped : checkpoint->skipped) {
      FUZZ_CHECK_MSG(absl::StartsWith(skipped, "checkpoint: Data."), skipped);
    }
    for (const CheckpointEntry& entry : checkpoint->entries) {
      if (entry.device_ids_by_numa.empty()) continue;
      size_t total = 0;
      for (const auto& [numa, ids] : entry.device_ids_by_numa) total += ids.size();
      FUZZ_CHECK(total == entry.device_ids.size());
    }
  }
  const MofedEvidence evidence = MofedFromCheckpoint(checkpoint, "checkpoint");
  // What cannot be read may hide MOFED: never Off.
  FUZZ_CHECK(evidence.state != MofedState::kOff ||
             (checkpoint.ok() && checkpoint->skipped.empty()));
  return 0;
}
