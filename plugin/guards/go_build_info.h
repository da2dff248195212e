// The build information every Go binary (Go 1.18+) carries in its
// .go.buildinfo ELF section: what `go version -m` prints. The MOFED guard
// uses it to learn the NVIDIA device plugin's version from
// <proc-root>/<pid>/exe without running anything. All functions are
// thread-safe (they share no state).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace efa::plugin {

struct GoBuildInfo {
  std::string go_version;    // "go1.23.4"
  std::string path;          // main package: "github.com/NVIDIA/k8s-device-plugin/cmd/..."
  std::string main_module;   // "github.com/NVIDIA/k8s-device-plugin"
  std::string main_version;  // "v0.19.2"; "(devel)" when built outside a tagged checkout
};

// Parses the contents of a .go.buildinfo section in the inline format of Go
// 1.18 and later. Pure: any bytes are safe to give it (a fuzzing entry
// point). Errors are InvalidArgument without a subject ("no Go build info
// magic", "build info in the pre-1.18 pointer format", "truncated build
// info"): the caller prefixes the file.
absl::StatusOr<GoBuildInfo> ParseGoBuildInfo(std::string_view section);

// Reads the .go.buildinfo section of the ELF64 little-endian executable at
// `path` (only the headers and that section are read, each at most 64 KiB)
// and parses it. Errors name the path: "<path>: not a 64-bit little-endian
// ELF file", "<path>: no .go.buildinfo section", "<path>: .go.buildinfo
// section larger than 64 KiB", "<path>: Permission denied".
absl::StatusOr<GoBuildInfo> ReadGoBuildInfo(const std::filesystem::path& path);

}  // namespace efa::plugin
