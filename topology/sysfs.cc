#include "topology/sysfs.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace efa::topology {
namespace fs = std::filesystem;

namespace {
constexpr size_t kMaxAttributeBytes = size_t{64} * 1024;

std::string Quote(std::string_view text) {
  std::string out = "\"";
  for (char c : text.substr(0, 40)) {
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += c;
    } else {
      absl::StrAppend(&out, "\\x", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
    }
  }
  if (text.size() > 40) out += "...";
  return out + "\"";
}

std::string_view Trim(std::string_view t) {
  while (!t.empty() && absl::ascii_isspace(static_cast<unsigned char>(t.front())))
    t.remove_prefix(1);
  while (!t.empty() && absl::ascii_isspace(static_cast<unsigned char>(t.back())))
    t.remove_suffix(1);
  return t;
}

absl::Status WithPath(const fs::path& path, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(path.string(), ": ", status.message()));
}
}  // namespace

std::string SizeText(size_t bytes) {
  if (bytes > 0 && bytes % (size_t{1} << 20) == 0) return absl::StrCat(bytes >> 20, " MiB");
  if (bytes > 0 && bytes % 1024 == 0) return absl::StrCat(bytes >> 10, " KiB");
  return absl::StrCat(bytes, " bytes");
}

namespace {
// Payloads of PathError's statuses: the errno, and whether read() gave it.
constexpr char kErrnoPayload[] = "efa.errno";
constexpr char kOnReadPayload[] = "efa.on_read";
}  // namespace

absl::Status PathError(const fs::path& path, int err) {
  absl::Status status = absl::ErrnoToStatus(err, path.string());
  status.SetPayload(kErrnoPayload, absl::Cord(std::to_string(err)));
  return status;
}

int ErrnoOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kErrnoPayload);
  int err = 0;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &err)) return 0;
  return err;
}

bool FailedOnRead(const absl::Status& status) {
  return status.GetPayload(kOnReadPayload).has_value();
}

bool IsHostResourceError(int err) {
  switch (err) {
    case EMFILE:
    case ENFILE:
    case ENOMEM:
    case ENOBUFS:
    case EAGAIN:
    case EINTR:
      return true;
    default:
      return false;
  }
}

absl::StatusOr<uint32_t> ParseHex(std::string_view text) {
  std::string_view t = Trim(text);
  if (t.size() > 2 && t[0] == '0' && (t[1] == 'x' || t[1] == 'X')) t.remove_prefix(2);
  uint32_t value = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), value, 16);
  if (t.empty() || ec != std::errc() || end != t.data() + t.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a hexadecimal number, got ", Quote(text)));
  }
  return value;
}

absl::StatusOr<int64_t> ParseInt(std::string_view text) {
  std::string_view t = Trim(text);
  int64_t value = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), value, 10);
  if (t.empty() || ec != std::errc() || end != t.data() + t.size()) {
    return absl::InvalidArgumentError(absl::StrCat("expected an integer, got ", Quote(text)));
  }
  return value;
}

absl::StatusOr<std::pair<uint32_t, uint32_t>> ParseDevNumbers(std::string_view text) {
  std::string_view t = Trim(text);
  size_t colon = t.find(':');
  uint32_t major = 0, minor = 0;
  if (colon != std::string_view::npos) {
    auto a = std::from_chars(t.data(), t.data() + colon, major);
    auto b = std::from_chars(t.data() + colon + 1, t.data() + t.size(), minor);
    if (colon > 0 && a.ec == std::errc() && a.ptr == t.data() + colon && colon + 1 < t.size() &&
        b.ec == std::errc() && b.ptr == t.data() + t.size()) {
      return std::make_pair(major, minor);
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("expected a device number like \"231:192\", got ", Quote(text)));
}

absl::Status TooLargeError(const fs::path& path, size_t max_bytes) {
  return absl::ResourceExhaustedError(
      absl::StrCat(path.string(), ": larger than ", SizeText(max_bytes)));
}

absl::StatusOr<std::string> ReadFileBounded(const fs::path& path, size_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return PathError(path, errno);
  std::string data;
  char buf[16384];
  absl::Status status;
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = PathError(path, errno);
      status.SetPayload(kOnReadPayload, absl::Cord());
      break;
    }
    if (n == 0) break;
    if (static_cast<size_t>(n) > max_bytes - data.size()) {
      status = TooLargeError(path, max_bytes);
      break;
    }
    data.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  if (!status.ok()) return status;
  return data;
}

absl::StatusOr<std::string> ReadAttribute(const fs::path& path) {
  absl::StatusOr<std::string> read = ReadFileBounded(path, kMaxAttributeBytes);
  if (!read.ok()) return read.status();
  std::string data = *std::move(read);
  while (!data.empty() && absl::ascii_isspace(static_cast<unsigned char>(data.back()))) {
    data.pop_back();
  }
  return data;
}

absl::StatusOr<std::optional<bool>> ReadRdmaNetnsShared(const fs::path& sysfs_root) {
  const fs::path path = sysfs_root / "module/ib_core/parameters/netns_mode";
  const auto mode = ReadAttribute(path);
  if (absl::IsNotFound(mode.status())) return std::nullopt;
  if (!mode.ok()) return mode.status();
  if (*mode == "Y" || *mode == "1") return true;
  if (*mode == "N" || *mode == "0") return false;
  return WithPath(path,
                  absl::InvalidArgumentError(absl::StrCat("expected Y or N, got \"", *mode, "\"")));
}

absl::StatusOr<uint32_t> ReadHexAttribute(const fs::path& path) {
  auto text = ReadAttribute(path);
  if (!text.ok()) return text.status();
  auto value = ParseHex(*text);
  if (!value.ok()) return WithPath(path, value.status());
  return value;
}

absl::StatusOr<int64_t> ReadIntAttribute(const fs::path& path) {
  auto text = ReadAttribute(path);
  if (!text.ok()) return text.status();
  auto value = ParseInt(*text);
  if (!value.ok()) return WithPath(path, value.status());
  return value;
}

absl::StatusOr<std::vector<std::string>> ListDirectory(const fs::path& dir) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return PathError(dir, ec.value());
  std::vector<std::string> names;
  // increment(ec), not ++: a failing readdir is an error here, not an
  // exception on the owner thread.
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  if (ec) return PathError(dir, ec.value());
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<fs::path> ResolvePath(const fs::path& path) {
  std::error_code ec;
  fs::path resolved = fs::canonical(path, ec);
  if (ec) {
    // canonical() reports ENOENT for a dangling link; say which it is.
    if (ec.value() == ENOENT && fs::is_symlink(fs::symlink_status(path))) {
      return absl::NotFoundError(
          absl::StrCat(path.string(), ": dangling link to ", fs::read_symlink(path, ec).string()));
    }
    return PathError(path, ec.value());
  }
  return resolved;
}

}  // namespace efa::topology
