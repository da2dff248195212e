#include "plugin/guards/go_build_info.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "topology/sysfs.h"

namespace efa::plugin {
namespace {

// Layout of the section, from Go's debug/buildinfo: a 32-byte header (magic,
// pointer size, flags), then with flagsVersionInl two length-prefixed
// strings, the Go version and the module info.
constexpr std::string_view kMagic("\xff Go buildinf:", 14);
constexpr size_t kHeaderSize = 32;
constexpr uint8_t kFlagsVersionInline = 0x2;
// The module info is framed by two 16-byte sentinels.
constexpr size_t kSentinel = 16;
// Bounds on what is read from a binary, which may be any process's: the
// section headers (64 bytes each; a Go binary has 14 to 40 sections), their
// names (a few hundred bytes) and the build info (the module list: 22 KiB
// for terraform's 250 modules, about 100 bytes a module).
constexpr uint64_t kMaxTableBytes = 64 << 10;
constexpr uint64_t kMaxSectionBytes = 64 << 10;

// Reads a uvarint-prefixed string at the front of `data` and drops it.
bool TakeString(std::string_view& data, std::string_view* out) {
  uint64_t length = 0;
  for (int shift = 0;; shift += 7) {
    if (data.empty() || shift > 63) return false;
    const auto byte = static_cast<uint8_t>(data.front());
    data.remove_prefix(1);
    length |= uint64_t{byte & 0x7fu} << shift;
    if ((byte & 0x80) == 0) break;
  }
  if (length > data.size()) return false;
  *out = data.substr(0, length);
  data.remove_prefix(length);
  return true;
}

std::vector<std::string_view> Split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  while (true) {
    const size_t end = text.find(separator);
    parts.push_back(text.substr(0, end));
    if (end == std::string_view::npos) return parts;
    text.remove_prefix(end + 1);
  }
}

uint64_t Le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// pread of exactly `size` bytes at `offset`; false on a short read.
bool ReadAt(int fd, uint64_t offset, uint64_t size, std::string* out) {
  out->resize(size);
  uint64_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd, out->data() + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<uint64_t>(n);
  }
  return true;
}

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

absl::StatusOr<GoBuildInfo> ParseGoBuildInfo(std::string_view section) {
  if (section.substr(0, kMagic.size()) != kMagic) {
    return absl::InvalidArgumentError("no Go build info magic");
  }
  if (section.size() < kHeaderSize) return absl::InvalidArgumentError("truncated build info");
  if ((static_cast<uint8_t>(section[15]) & kFlagsVersionInline) == 0) {
    return absl::InvalidArgumentError("build info in the pre-1.18 pointer format");
  }
  std::string_view rest = section.substr(kHeaderSize);
  std::string_view version, modinfo;
  if (!TakeString(rest, &version) || !TakeString(rest, &modinfo)) {
    return absl::InvalidArgumentError("truncated build info");
  }
  GoBuildInfo info;
  info.go_version = std::string(version);
  // As debug/buildinfo: without both sentinels there is no module info.
  if (modinfo.size() < 2 * kSentinel + 1 || modinfo[modinfo.size() - kSentinel - 1] != '\n') {
    return info;
  }
  modinfo = modinfo.substr(kSentinel, modinfo.size() - 2 * kSentinel);
  for (std::string_view line : Split(modinfo, '\n')) {
    std::vector<std::string_view> fields = Split(line, '\t');
    if (fields.size() >= 2 && fields[0] == "path") info.path = std::string(fields[1]);
    if (fields.size() >= 3 && fields[0] == "mod") {
      info.main_module = std::string(fields[1]);
      info.main_version = std::string(fields[2]);
    }
  }
  return info;
}

absl::StatusOr<GoBuildInfo> ReadGoBuildInfo(const std::filesystem::path& path) {
  Fd file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) return topology::PathError(path, errno);
  auto fail = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": ", what));
  };
  std::string header;
  if (!ReadAt(file.fd, 0, 64, &header) ||
      header.compare(0, 4,
                     "\x7f"
                     "ELF") != 0 ||
      header[4] != 2 || header[5] != 1) {
    return fail("not a 64-bit little-endian ELF file");
  }
  const auto* h = reinterpret_cast<const unsigned char*>(header.data());
  const uint64_t shoff = Le(h + 0x28, 8);
  const uint64_t shentsize = Le(h + 0x3a, 2);
  const uint64_t shnum = Le(h + 0x3c, 2);
  const uint64_t shstrndx = Le(h + 0x3e, 2);
  std::string table;
  if (shentsize < 64 || shnum == 0 || shstrndx >= shnum || shnum * shentsize > kMaxTableBytes ||
      !ReadAt(file.fd, shoff, shnum * shentsize, &table)) {
    return fail("unreadable ELF section headers");
  }
  auto section = [&](uint64_t i) {
    return reinterpret_cast<const unsigned char*>(table.data()) + i * shentsize;
  };
  // sh_name at 0, sh_offset at 24, sh_size at 32.
  const unsigned char* strtab = section(shstrndx);
  std::string names;
  if (Le(strtab + 32, 8) > kMaxTableBytes ||
      !ReadAt(file.fd, Le(strtab + 24, 8), Le(strtab + 32, 8), &names)) {
    return fail("unreadable ELF section names");
  }
  for (uint64_t i = 0; i < shnum; ++i) {
    const uint64_t name = Le(section(i), 4);
    if (name >= names.size() || std::strcmp(names.c_str() + name, ".go.buildinfo") != 0) continue;
    std::string data;
    const uint64_t size = Le(section(i) + 32, 8);
    if (size > kMaxSectionBytes) {
      return fail(
          absl::StrCat(".go.buildinfo section larger than ", topology::SizeText(kMaxSectionBytes)));
    }
    if (!ReadAt(file.fd, Le(section(i) + 24, 8), size, &data)) {
      return fail("unreadable .go.buildinfo section");
    }
    auto info = ParseGoBuildInfo(data);
    if (!info.ok()) return fail(info.status().message());
    return info;
  }
  return fail("no .go.buildinfo section");
}

}  // namespace efa::plugin
