// Fuzzes ParseNvidiaGpuInformation, the parser of the NVIDIA driver's
// <proc-root>/driver/nvidia/gpus/<bdf>/information. A file that parses
// gives a GPU that NvidiaDeviceAddress finds by its UUID and by index 0; an
// error names the file.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/strings/match.h"
#include "test/fuzz/fuzz_check.h"
#include "topology/nvidia_gpus.h"

using namespace efa::topology;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto gpu = ParseNvidiaGpuInformation(efa::fuzz::AsText(data, size), "information");
  if (!gpu.ok()) {
    FUZZ_CHECK(gpu.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK_MSG(absl::StartsWith(gpu.status().message(), "information: "),
                   gpu.status().message());
    FUZZ_CHECK_MSG(gpu.status().message().size() < 100, gpu.status().message());
    return 0;
  }
  FUZZ_CHECK(!gpu->uuid.empty());
  const std::vector<NvidiaGpu> gpus = {*gpu};
  FUZZ_CHECK(NvidiaDeviceAddress(gpus, gpu->uuid) == gpu->pci);
  FUZZ_CHECK(NvidiaDeviceAddress(gpus, "0") == gpu->pci);
  FUZZ_CHECK(gpu->uuid == "1" || !NvidiaDeviceAddress(gpus, "1").has_value());
  return 0;
}
