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
// Bounds on what one process can make a scan read. argv[0] is a path
// (PATH_MAX 4096), so a name is told from a command line's first 4 KiB; the
// Uid: line is in the first lines of status (about 1.5 KiB in all). The
// NVIDIA plugin's command line is its flags, a few hundred bytes; a pod's
// environment is a few KiB, tens with a namespace's service links.
// net/unix has about 100 bytes per unix socket of the process's network
// namespace (the host's, for a hostNetwork pod: thousands at most). A
// tenant can make cmdline and environ 2 MiB together (ARG_MAX, a quarter of
// an 8 MiB stack), more with a larger stack limit.
constexpr size_t kNameBytes = 4096;
constexpr size_t kMaxStatusBytes = 4096;
constexpr size_t kMaxCmdlineBytes = size_t{64} << 10;
constexpr size_t kMaxEnvironBytes = size_t{256} << 10;
constexpr size_t kMaxNetUnixBytes = size_t{4} << 20;

// The first `max_bytes` of a file, and whether it holds more.
struct Prefix {
  std::string bytes;
  bool truncated = false;
};

// Reads at most `max_bytes` + 1 bytes of a /proc file (which may come a
// page per read); nullopt when it cannot be opened or read.
std::optional<Prefix> ReadPrefix(const fs::path& path, size_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  Prefix prefix;
  char buf[4096];
  bool ok = true;
  while (prefix.bytes.size() <= max_bytes) {
    const size_t want = std::min(sizeof buf, max_bytes + 1 - prefix.bytes.size());
    const ssize_t n = ::read(fd, buf, want);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ok = n == 0;
      break;
    }
    prefix.bytes.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  if (!ok) return std::nullopt;
  if (prefix.bytes.size() > max_bytes) {
    prefix.bytes.resize(max_bytes);
    prefix.truncated = true;
  }
  return prefix;
}

// The real UID of /proc/<pid>/status's "Uid:" line (real, effective,
// saved, filesystem); nullopt when unreadable or absent.
std::optional<long> RealUid(const fs::path& status) {
  std::optional<Prefix> text = ReadPrefix(status, kMaxStatusBytes);
  if (!text) return std::nullopt;
  for (absl::string_view line : absl::StrSplit(text->bytes, '\n')) {
    if (!absl::ConsumePrefix(&line, "Uid:")) continue;
    std::vector<absl::string_view> ids = absl::StrSplit(line, '\t', absl::SkipEmpty());
    long uid;
    if (ids.empty() || !absl::SimpleAtoi(ids[0], &uid)) return std::nullopt;
    return uid;
  }
  return std::nullopt;
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
                                                   const fs::path& device_plugin_dir,
                                                   std::chrono::steady_clock::time_point deadline) {
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
  absl::StatusOr<std::string> table = topology::ReadFileBounded(net_unix, kMaxNetUnixBytes);
  if (!table.ok()) return table.status();
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
    // A root process may hold a million descriptors.
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(fd_dir.string(), ": not read by the deadline"));
    }
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

namespace {

// Reads the candidate at `pid_dir`, process `pid`, named as the plugin and
// run by root (`cmdline`: its command line's first bytes), into `scan`:
// its process, or why the scan has no verdict. False when the time box
// ran out on the way.
bool ReadCandidate(const fs::path& pid_dir, int pid, Prefix cmdline,
                   const fs::path& device_plugin_dir,
                   std::chrono::steady_clock::time_point deadline, NvidiaPluginScan& scan) {
  auto past_deadline = [&] { return std::chrono::steady_clock::now() >= deadline; };
  const fs::path cmdline_path = pid_dir / "cmdline";
  if (cmdline.truncated) {
    std::optional<Prefix> whole = ReadPrefix(cmdline_path, kMaxCmdlineBytes);
    if (!whole) return true;
    cmdline = *std::move(whole);
  }
  NvidiaPluginProcess process;
  process.pid = pid;
  if (past_deadline()) return false;
  absl::StatusOr<std::string> socket = HeldNvidiaPluginSocket(pid_dir, device_plugin_dir, deadline);
  if (absl::IsDeadlineExceeded(socket.status())) return false;
  if (cmdline.truncated) {
    // The last --mofed-enabled may lie beyond the bound: no verdict from
    // this one, and none from the scan if it is the plugin.
    const std::string too_large(topology::TooLargeError(cmdline_path, kMaxCmdlineBytes).message());
    if (socket.ok()) {
      scan.incomplete = absl::StrCat(too_large, " (process ", pid, " holds ", *socket, ")");
      return true;
    }
    process.untrusted = too_large;
    scan.processes.push_back(std::move(process));
    return true;
  }
  if (socket.ok()) {
    process.plugin_socket = *socket;
  } else {
    process.untrusted = std::string(socket.status().message());
  }
  process.mofed_flag = MofedFlagFromCmdline(cmdline.bytes);
  if (past_deadline()) return false;
  if (std::optional<Prefix> environ = ReadPrefix(pid_dir / "environ", kMaxEnvironBytes)) {
    // Beyond the bound only a mention in the part read counts (Go reads
    // the first); the entry cut at the bound is dropped.
    std::string_view whole = environ->bytes;
    if (environ->truncated) whole = whole.substr(0, whole.rfind('\0') + 1);
    process.mofed_env = MofedEnvFromEnviron(whole);
    process.environ_readable = !environ->truncated || process.mofed_env.has_value();
  }
  if (past_deadline()) return false;
  if (auto info = ReadGoBuildInfo(pid_dir / "exe"); info.ok() && info->main_version != "(devel)") {
    process.version = info->main_version;
  }
  scan.processes.push_back(std::move(process));
  return true;
}

}  // namespace

absl::StatusOr<NvidiaPluginScan> FindNvidiaPluginProcesses(const fs::path& proc_root,
                                                           const fs::path& device_plugin_dir,
                                                           const ProcessScanLimits& limits) {
  std::error_code ec;
  fs::directory_iterator it(proc_root, ec);
  if (ec) return topology::PathError(proc_root, ec.value());
  NvidiaPluginScan scan;
  size_t entries = 0;
  auto past_deadline = [&] { return std::chrono::steady_clock::now() >= limits.deadline; };
  auto stopped = [&] {
    return absl::DeadlineExceededError(absl::StrCat(
        proc_root.string(), ": the scan stopped at its time box after ", entries, " entries"));
  };
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    if (past_deadline()) return stopped();
    ++entries;
    int pid;
    if (!ParseNumber(it->path().filename().native(), &pid)) continue;
    // A process may exit at any point below: whatever is gone is skipped.
    // The name first: it rules out nearly every process for 4 KiB.
    std::optional<Prefix> cmdline = ReadPrefix(it->path() / "cmdline", kNameBytes);
    if (!cmdline || !IsNvidiaPluginCommand(cmdline->bytes) ||
        (cmdline->truncated && cmdline->bytes.find('\0') == std::string::npos)) {
      continue;
    }
    // Anyone can take the name; only root's processes are read further.
    if (RealUid(it->path() / "status") != 0) {
      ++scan.not_root;
      continue;
    }
    if (scan.processes.size() >= limits.max_candidates) {
      ++scan.over_cap;
      continue;
    }
    if (!ReadCandidate(it->path(), pid, *std::move(cmdline), device_plugin_dir, limits.deadline,
                       scan)) {
      return stopped();
    }
  }
  if (ec) return topology::PathError(proc_root, ec.value());
  if (scan.over_cap > 0 && scan.incomplete.empty()) {
    scan.incomplete =
        absl::StrCat(proc_root.string(), ": ", scan.over_cap, " more ", kNvidiaPluginCommand,
                     " processes run by root than the ", limits.max_candidates, " read");
  }
  std::sort(scan.processes.begin(), scan.processes.end(),
            [](const auto& a, const auto& b) { return a.pid < b.pid; });
  return scan;
}

}  // namespace efa::plugin
