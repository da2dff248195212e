#include "plugin/guards/nvidia_plugin_process.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <map>
#include <set>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "plugin/guards/go_build_info.h"
#include "topology/sysfs.h"

namespace efa::plugin {
namespace fs = std::filesystem;
namespace {

constexpr std::string_view kMofedFlag = "mofed-enabled";
constexpr std::string_view kMofedEnv = "MOFED_ENABLED=";
// cmdline and environ are limited by ARG_MAX (a quarter of the stack limit),
// /proc/net/unix by the node's sockets (about 100 bytes each): far below this.
constexpr size_t kMaxProcFileBytes = size_t{16} << 20;

// Reads a whole /proc file; nullopt when it cannot be opened or read.
std::optional<std::string> ReadProcFile(const fs::path& path) {
  absl::StatusOr<std::string> data = topology::ReadFileBounded(path, kMaxProcFileBytes);
  if (!data.ok()) return std::nullopt;
  return *std::move(data);
}

// __SO_ACCEPTCON in /proc/net/unix's Flags: a listening socket.
constexpr uint32_t kSoAcceptCon = 0x10000;

// "nvidia-<resource>.sock", the NVIDIA device plugin's socket names.
bool IsNvidiaSocketName(std::string_view name) {
  return name.size() > 12 && name.starts_with("nvidia-") && name.ends_with(".sock");
}

bool ParseNumber(std::string_view text, int* out) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  // from_chars takes a '-'; no pid or version part has one.
  return !text.empty() && text.front() != '-' && ec == std::errc() &&
         end == text.data() + text.size();
}

}  // namespace

std::vector<std::string_view> SplitNul(std::string_view bytes) {
  std::vector<std::string_view> fields;
  while (!bytes.empty()) {
    const size_t end = bytes.find('\0');
    fields.push_back(bytes.substr(0, end));
    if (end == std::string_view::npos) break;
    bytes.remove_prefix(end + 1);
  }
  return fields;
}

std::optional<bool> ParseGoBool(std::string_view text) {
  for (std::string_view t : {"1", "t", "T", "TRUE", "true", "True"}) {
    if (text == t) return true;
  }
  for (std::string_view f : {"0", "f", "F", "FALSE", "false", "False"}) {
    if (text == f) return false;
  }
  return std::nullopt;
}

bool IsNvidiaPluginCommand(std::string_view cmdline) {
  const std::vector<std::string_view> argv = SplitNul(cmdline);
  if (argv.empty()) return false;
  std::string_view name = argv[0];
  if (size_t slash = name.rfind('/'); slash != std::string_view::npos) {
    name.remove_prefix(slash + 1);
  }
  return name == kNvidiaPluginCommand;
}

std::optional<bool> MofedFlagFromCmdline(std::string_view cmdline) {
  std::optional<bool> result;
  const std::vector<std::string_view> argv = SplitNul(cmdline);
  for (size_t i = 1; i < argv.size(); ++i) {
    std::string_view arg = argv[i];
    if (arg == "--") break;
    // Go's flag syntax: one or two dashes.
    if (arg.substr(0, 2) == "--") {
      arg.remove_prefix(2);
    } else if (arg.substr(0, 1) == "-") {
      arg.remove_prefix(1);
    } else {
      continue;
    }
    if (arg.substr(0, kMofedFlag.size()) != kMofedFlag) continue;
    arg.remove_prefix(kMofedFlag.size());
    if (arg.empty()) {
      result = true;
    } else if (arg.front() == '=') {
      if (auto value = ParseGoBool(arg.substr(1))) result = value;
    }
  }
  return result;
}

std::optional<bool> MofedEnvFromEnviron(std::string_view environ) {
  for (std::string_view entry : SplitNul(environ)) {
    if (entry.substr(0, kMofedEnv.size()) == kMofedEnv) {
      return ParseGoBool(entry.substr(kMofedEnv.size()));
    }
  }
  return std::nullopt;
}

std::optional<bool> MofedDefaultForVersion(std::string_view version) {
  if (!version.empty() && version.front() == 'v') version.remove_prefix(1);
  // MAJOR.MINOR.PATCH, then anything ("-rc.1", "+build").
  int parts[3];
  for (int i = 0; i < 3; ++i) {
    size_t end = i < 2 ? version.find('.') : version.find_first_of("-+");
    if (!ParseNumber(version.substr(0, end), &parts[i])) return std::nullopt;
    version.remove_prefix(end == std::string_view::npos ? version.size() : end + (i < 2));
  }
  return parts[0] == 0 && parts[1] == 19 && parts[2] <= 2;
}

std::optional<bool> EffectiveMofed(const NvidiaPluginProcess& process) {
  if (process.mofed_flag) return process.mofed_flag;
  if (process.mofed_env) return process.mofed_env;
  return MofedDefaultForVersion(process.version);
}

absl::StatusOr<std::string> HeldNvidiaPluginSocket(const fs::path& pid_dir,
                                                   const fs::path& device_plugin_dir) {
  // The plugin's sockets as this daemon sees them: file identity -> path.
  std::map<std::pair<dev_t, ino_t>, fs::path> sockets;
  std::error_code ec;
  for (fs::directory_iterator it(device_plugin_dir, ec), end; !ec && it != end; it.increment(ec)) {
    struct stat st;
    if (IsNvidiaSocketName(it->path().filename().native()) &&
        ::lstat(it->path().c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
      sockets[{st.st_dev, st.st_ino}] = it->path();
    }
  }
  if (sockets.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no nvidia-*.sock socket in ", device_plugin_dir.string()));
  }
  // The listening unix sockets of the process's network namespace whose
  // path names an NVIDIA plugin socket: socket inode -> path as bound.
  const fs::path net_unix = pid_dir / "net/unix";
  std::optional<std::string> table = ReadProcFile(net_unix);
  if (!table) return topology::PathError(net_unix, errno);
  std::map<std::string, std::string> listening;
  for (absl::string_view line : absl::StrSplit(*table, '\n', absl::SkipEmpty())) {
    // "Num: RefCount Protocol Flags Type St Inode Path"
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    uint32_t flags = 0;
    if (f.size() < 8 || !absl::SimpleHexAtoi(f[3], &flags) || !(flags & kSoAcceptCon)) continue;
    if (IsNvidiaSocketName(fs::path(std::string(f[7])).filename().native())) {
      listening[std::string(f[6])] = std::string(f[7]);
    }
  }
  if (listening.empty()) {
    return absl::NotFoundError(
        absl::StrCat(net_unix.string(), ": no listening nvidia-*.sock socket"));
  }
  // Which of those files, resolved inside the process's root (absolute
  // symlinks included), is one of the plugin's sockets here.
  const fs::path root = pid_dir / "root";
  const int root_fd = ::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (root_fd < 0) return topology::PathError(root, errno);
  std::set<std::string> inodes;
  std::string found;
  for (const auto& [inode, path] : listening) {
    open_how how{};
    how.flags = O_PATH | O_CLOEXEC;
    how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
    const std::string relative = fs::path(path).relative_path().string();
    const int fd =
        static_cast<int>(::syscall(SYS_openat2, root_fd, relative.c_str(), &how, sizeof how));
    if (fd < 0) continue;
    struct stat st;
    if (::fstat(fd, &st) == 0 && sockets.count({st.st_dev, st.st_ino})) {
      inodes.insert(inode);
      found = sockets[{st.st_dev, st.st_ino}].string();
    }
    ::close(fd);
  }
  ::close(root_fd);
  if (inodes.empty()) {
    return absl::NotFoundError(
        absl::StrCat("its nvidia-*.sock sockets are not the ones in ", device_plugin_dir.string()));
  }
  // And the process holds one of those sockets (the namespace's table
  // lists every process's).
  const fs::path fd_dir = pid_dir / "fd";
  for (fs::directory_iterator it(fd_dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code link_ec;
    const std::string target = fs::read_symlink(it->path(), link_ec).string();
    if (!link_ec && absl::StartsWith(target, "socket:[") && absl::EndsWith(target, "]") &&
        inodes.count(target.substr(8, target.size() - 9))) {
      return found;
    }
  }
  if (ec) return topology::PathError(fd_dir, ec.value());
  return absl::NotFoundError(absl::StrCat("holds no socket of ", found));
}

absl::StatusOr<std::vector<NvidiaPluginProcess>> FindNvidiaPluginProcesses(
    const fs::path& proc_root, const fs::path& device_plugin_dir) {
  std::error_code ec;
  fs::directory_iterator it(proc_root, ec);
  if (ec) return topology::PathError(proc_root, ec.value());
  std::vector<NvidiaPluginProcess> found;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    int pid;
    if (!ParseNumber(it->path().filename().native(), &pid)) continue;
    // A process may exit at any point below: whatever is gone is skipped.
    std::optional<std::string> cmdline = ReadProcFile(it->path() / "cmdline");
    if (!cmdline || !IsNvidiaPluginCommand(*cmdline)) continue;
    NvidiaPluginProcess process;
    process.pid = pid;
    process.mofed_flag = MofedFlagFromCmdline(*cmdline);
    if (std::optional<std::string> environ = ReadProcFile(it->path() / "environ")) {
      process.environ_readable = true;
      process.mofed_env = MofedEnvFromEnviron(*environ);
    }
    if (auto info = ReadGoBuildInfo(it->path() / "exe");
        info.ok() && info->main_version != "(devel)") {
      process.version = info->main_version;
    }
    if (auto socket = HeldNvidiaPluginSocket(it->path(), device_plugin_dir); socket.ok()) {
      process.plugin_socket = *socket;
    } else {
      process.untrusted = std::string(socket.status().message());
    }
    found.push_back(std::move(process));
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.pid < b.pid; });
  return found;
}

}  // namespace efa::plugin
