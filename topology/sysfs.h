// Reading sysfs-style attribute files and links. Every function names the
// path in its error message, e.g.
//   "/sys/class/infiniband/rdmap79s0/device/numa_node: No such file or directory".
// The parsers are split from the reads so that they can be fuzzed alone.
// All functions are thread-safe (they share no state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace efa::topology {

// The roots under which the daemon finds the host. On a node these are the
// defaults; tests and the demo point them at a simulated machine.
struct HostRoots {
  std::filesystem::path sysfs = "/sys";
  std::filesystem::path dev = "/dev";
  std::filesystem::path proc = "/proc";
};

// Parses "0x1d0f" or "1d0f" (surrounding white space allowed) into a value of
// at most 32 bits.
absl::StatusOr<uint32_t> ParseHex(std::string_view text);
// Parses a decimal integer such as "-1" or "0\n".
absl::StatusOr<int64_t> ParseInt(std::string_view text);
// Parses a char device number "231:192".
absl::StatusOr<std::pair<uint32_t, uint32_t>> ParseDevNumbers(std::string_view text);

// Reads a whole file of at most `max_bytes`. Errors name the path: those of
// open and read keep errno ("<path>: Permission denied", with the status
// code that fits it, as PathError); a longer file is ResourceExhausted
// ("<path>: larger than 64 KiB"). A directory is an error (EISDIR).
absl::StatusOr<std::string> ReadFileBounded(const std::filesystem::path& path, size_t max_bytes);

// Reads a whole attribute file (at most 64 KiB) with trailing white space
// removed.
absl::StatusOr<std::string> ReadAttribute(const std::filesystem::path& path);
absl::StatusOr<uint32_t> ReadHexAttribute(const std::filesystem::path& path);
absl::StatusOr<int64_t> ReadIntAttribute(const std::filesystem::path& path);

// Whether the RDMA subsystem shares its devices among network namespaces,
// from ib_core's module/ib_core/parameters/netns_mode under `sysfs_root`
// ("Y" shared, the default; "N" exclusive: a device is usable, and seen in
// sysfs, only in the one namespace it is in). `rdma system set netns`
// changes the same variable (Linux drivers/infiniband/core/device.c,
// ib_devices_shared_netns). nullopt when there is no such file (no
// ib_core); an error naming the file when it cannot be read or says
// neither.
absl::StatusOr<std::optional<bool>> ReadRdmaNetnsShared(const std::filesystem::path& sysfs_root);

// Names in a directory, sorted. A missing directory is NotFound; every
// error (of opendir or of a later readdir) carries its errno (ErrnoOf).
absl::StatusOr<std::vector<std::string>> ListDirectory(const std::filesystem::path& dir);

// Resolves every link in `path`; a dangling or looping link is an error that
// names `path`.
absl::StatusOr<std::filesystem::path> ResolvePath(const std::filesystem::path& path);

// "64 MiB", "64 KiB" or "100 bytes": the largest unit that is exact.
std::string SizeText(size_t bytes);

// "<path>: larger than 64 KiB" (ResourceExhausted): what a read that stops
// at its bound says. `max_bytes` is shown in the largest exact unit.
absl::Status TooLargeError(const std::filesystem::path& path, size_t max_bytes);

// "<path>: <strerror(err)>" with the status code that fits errno; the
// errno itself is kept in the status (ErrnoOf), since a status code lumps
// errnos together (EIO and EAGAIN are both Unavailable).
absl::Status PathError(const std::filesystem::path& path, int err);

// The errno behind a status from PathError (every failed open, read or
// listing here), or 0 (a parse error, a file too large, OK).
int ErrnoOf(const absl::Status& status);

// Whether ReadFileBounded's error came from read() after the file opened:
// the answer of whatever serves the file (in sysfs, the driver's show()),
// not of the path.
bool FailedOnRead(const absl::Status& status);

// Whether `err` tells of the calling process or the host, not of the file:
// out of descriptors (EMFILE, ENFILE) or memory (ENOMEM, ENOBUFS), or a call
// cut short (EAGAIN, EINTR). Such an error says nothing about whether a
// device is there: what it hid keeps its last known state.
bool IsHostResourceError(int err);

}  // namespace efa::topology
