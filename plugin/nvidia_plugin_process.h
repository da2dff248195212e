// The NVIDIA device plugin as seen in <proc-root>: its command line,
// environment and version, and whether they turn MOFED on.
//
// The plugin (urfave/cli) takes `--mofed-enabled`, `--mofed-enabled=BOOL` or
// the env var MOFED_ENABLED=BOOL (the flag wins); without either, MOFED is
// on by default in v0.19.0-v0.19.2 only. The version is the main module
// version of the binary's Go build info, when the binary was built from a
// tagged checkout. A config file (--config-file, flags.mofedEnabled) and the
// GPU Operator's sourced env file before exec are not read here; the env file
// shows in the environment all the same.
//
// The parsers take the raw bytes of /proc/<pid>/cmdline and environ
// (NUL-separated) and are pure: fuzzing entry points. All functions are
// thread-safe (they share no state).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace efa::plugin {

// argv[0]'s base name of the NVIDIA device plugin.
inline constexpr char kNvidiaPluginCommand[] = "nvidia-device-plugin";

struct NvidiaPluginProcess {
  int pid = 0;
  // The last --mofed-enabled[=BOOL] on the command line.
  std::optional<bool> mofed_flag;
  // MOFED_ENABLED in the environment (nullopt also when unreadable).
  std::optional<bool> mofed_env;
  // Whether <proc-root>/<pid>/environ could be read (it needs root or the
  // same user).
  bool environ_readable = false;
  // The binary's version, "v0.19.2"; empty when not visible.
  std::string version;
};

// The NUL-separated fields of a cmdline or environ file; a missing final NUL
// is fine, an empty file has no fields.
std::vector<std::string_view> SplitNul(std::string_view bytes);

// Go's strconv.ParseBool: 1 t T TRUE true True / 0 f F FALSE false False.
std::optional<bool> ParseGoBool(std::string_view text);

// Whether the command line's argv[0] is nvidia-device-plugin (any
// directory).
bool IsNvidiaPluginCommand(std::string_view cmdline);

// The last --mofed-enabled (or -mofed-enabled), bare (true) or =BOOL, before
// a "--" terminator. A value that is not a Go bool is skipped, as the
// plugin would not have started with it.
std::optional<bool> MofedFlagFromCmdline(std::string_view cmdline);

// MOFED_ENABLED=BOOL in an environ file; nullopt when absent or not a bool.
std::optional<bool> MofedEnvFromEnviron(std::string_view environ);

// Whether the plugin at `version` ("v0.19.1", "0.19.1-rc.1") enables MOFED
// without being asked: true for 0.19.0-0.19.2, false for other versions,
// nullopt when the version does not parse.
std::optional<bool> MofedDefaultForVersion(std::string_view version);

// What MOFED is in the process: the flag, else the environment, else the
// version's default; nullopt when none of them is known.
std::optional<bool> EffectiveMofed(const NvidiaPluginProcess& process);

// Every nvidia-device-plugin process under `proc_root` (numeric entries
// whose cmdline matches), by ascending pid. Processes that vanish while
// being read are skipped; an unreadable environ or executable leaves
// mofed_env or version unset. Fails (naming the path) only when `proc_root`
// cannot be listed.
absl::StatusOr<std::vector<NvidiaPluginProcess>> FindNvidiaPluginProcesses(
    const std::filesystem::path& proc_root);

}  // namespace efa::plugin
