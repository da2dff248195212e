#include "plugin/nvidia_plugin_process.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "plugin/go_build_info.h"
#include "topology/sysfs.h"

namespace efa::plugin {
namespace fs = std::filesystem;
namespace {

constexpr std::string_view kMofedFlag = "mofed-enabled";
constexpr std::string_view kMofedEnv = "MOFED_ENABLED=";
// cmdline and environ are limited by ARG_MAX; this is far above what a real
// device plugin has.
constexpr size_t kMaxProcFileBytes = 1 << 20;

// Reads a whole /proc file; nullopt when it cannot be opened or read.
std::optional<std::string> ReadProcFile(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string data;
  char buf[4096];
  while (data.size() < kMaxProcFileBytes) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return std::nullopt;
    }
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return data;
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
  std::optional<bool> result;
  for (std::string_view entry : SplitNul(environ)) {
    if (entry.substr(0, kMofedEnv.size()) == kMofedEnv) {
      result = ParseGoBool(entry.substr(kMofedEnv.size()));
    }
  }
  return result;
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

absl::StatusOr<std::vector<NvidiaPluginProcess>> FindNvidiaPluginProcesses(
    const fs::path& proc_root) {
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
    found.push_back(std::move(process));
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.pid < b.pid; });
  return found;
}

}  // namespace efa::plugin
