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
#include "absl/strings/str_cat.h"

namespace efa::topology {
namespace fs = std::filesystem;

namespace {
constexpr size_t kMaxAttributeBytes = 64 * 1024;

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

absl::Status PathError(const fs::path& path, int err) {
  return absl::ErrnoToStatus(err, path.string());
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

absl::StatusOr<std::string> ReadFileBounded(const fs::path& path, size_t max_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return PathError(path, errno);
  std::string data;
  char buf[4096];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return PathError(path, err);
    }
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
    if (data.size() > max_bytes) {
      ::close(fd);
      constexpr size_t kMiB = size_t{1} << 20;
      return absl::InvalidArgumentError(absl::StrCat(path.string(), ": larger than ",
                                                     max_bytes % kMiB == 0
                                                         ? absl::StrCat(max_bytes / kMiB, " MiB")
                                                         : absl::StrCat(max_bytes, " bytes")));
    }
  }
  ::close(fd);
  return data;
}

absl::StatusOr<std::string> ReadAttribute(const fs::path& path) {
  absl::StatusOr<std::string> data = ReadFileBounded(path, kMaxAttributeBytes);
  if (!data.ok()) return data;
  while (!data->empty() && absl::ascii_isspace(static_cast<unsigned char>(data->back()))) {
    data->pop_back();
  }
  return data;
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
  for (const auto& entry : it) names.push_back(entry.path().filename().string());
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
