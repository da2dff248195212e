// Fuzzes the reading of the NVIDIA device plugin binary's Go build info:
// ParseGoBuildInfo is given the input as a .go.buildinfo section, and
// ReadGoBuildInfo the input as a whole executable (an in-memory file, so no
// disk is touched). Errors are InvalidArgument; the file's name the path.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "plugin/guards/go_build_info.h"
#include "test/fuzz/fuzz_check.h"

using namespace efa::plugin;

namespace {

// One in-memory file reused for every input.
int MemFd() {
  static const int fd = ::memfd_create("go-binary", MFD_CLOEXEC);
  FUZZ_CHECK(fd >= 0);
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes = efa::fuzz::AsText(data, size);
  if (auto info = ParseGoBuildInfo(bytes); !info.ok()) {
    FUZZ_CHECK(info.status().code() == absl::StatusCode::kInvalidArgument);
  }

  const int fd = MemFd();
  FUZZ_CHECK(::ftruncate(fd, 0) == 0);
  FUZZ_CHECK(::pwrite(fd, data, size, 0) == static_cast<ssize_t>(size));
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (auto info = ReadGoBuildInfo(path); !info.ok()) {
    FUZZ_CHECK(info.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK_MSG(absl::StartsWith(info.status().message(), path + ": "), info.status().message());
  }
  return 0;
}
