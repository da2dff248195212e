// The NVIDIA device plugin as seen in <proc-root>: its command line,
// environment and version, and whether they turn MOFED on.
//
// What is trusted. Any tenant can run a process named nvidia-device-plugin
// with --mofed-enabled (exec -a), so the name only picks candidates: a
// process counts as the NVIDIA device plugin only when it listens on a
// socket whose file is the plugin's socket in the kubelet's device-plugins
// directory, `nvidia-<resource>.sock` (the plugin's
// pluginapi.DevicePluginPath + "nvidia-" + name + ".sock", e.g.
// nvidia-gpu.sock), as this daemon sees that directory. The socket's path
// (from <proc-root>/<pid>/net/unix) is resolved inside the process's own
// root (<proc-root>/<pid>/root, openat2 RESOLVE_IN_ROOT), must be the same
// file (device and inode), and the process must hold that socket
// (<proc-root>/<pid>/fd). Only a process with the host's device-plugins
// directory mounted, i.e. one the cluster admin deployed, can do that. It
// needs CAP_SYS_PTRACE, as reading environ does.
//
// The plugin (urfave/cli) takes `--mofed-enabled`, `--mofed-enabled=BOOL` or
// the env var MOFED_ENABLED=BOOL (the flag wins); without either, MOFED is
// on by default in v0.19.0-v0.19.2 only. The version is the main module
// version of the binary's Go build info, when the binary was built from a
// tagged checkout. A config file (--config-file, flags.mofedEnabled) and the
// GPU Operator's sourced env file before exec are not read here; the env file
// shows in the environment all the same.
//
// What a scan costs is bounded, since any tenant can start processes of
// that name with any command line and environment: only processes whose
// real UID is 0 (the NVIDIA plugin runs as root; a pod's processes run as
// a non-root user or in a user namespace do not) are read beyond their
// command line's first 4 KiB and their status; since a pod running as
// root, without a user namespace, still can, at most ProcessScanLimits's
// candidates are read per scan, each file up to a bound (command line
// 64 KiB, environment 256 KiB, net/unix 4 MiB, the Go build info 64 KiB),
// and the scan stops at its deadline.
//
// The parsers take the raw bytes of /proc/<pid>/cmdline and environ
// (NUL-separated) and are pure: fuzzing entry points. All functions are
// thread-safe (they share no state).
#pragma once

#include <chrono>
#include <cstddef>
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
  // same user) and, when longer than its bound, held MOFED_ENABLED in the
  // part read (Go's os.Getenv takes the first mention).
  bool environ_readable = false;
  // The binary's version, "v0.19.2"; empty when not visible.
  std::string version;
  // The NVIDIA plugin socket it listens on (see the top of this file), or
  // empty: then it is not trusted to be the NVIDIA device plugin, and
  // `untrusted` says why.
  std::string plugin_socket;
  std::string untrusted;
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

// MOFED_ENABLED=BOOL in an environ file: the first one, as Go's os.Getenv
// reads it (syscall/env_unix.go, copyenv: "first mention of key"), so a
// later entry changes nothing; nullopt when absent or when that first value
// is not a bool (the plugin would then refuse to start).
std::optional<bool> MofedEnvFromEnviron(std::string_view environ);

// Whether the plugin at `version` ("v0.19.1", "0.19.1-rc.1") enables MOFED
// without being asked: true for 0.19.0-0.19.2, false for other versions,
// nullopt when the version does not parse.
std::optional<bool> MofedDefaultForVersion(std::string_view version);

// What MOFED is in the process: the flag, else the environment, else the
// version's default; nullopt when none of them is known.
std::optional<bool> EffectiveMofed(const NvidiaPluginProcess& process);

// The NVIDIA plugin socket that process `pid_dir` (<proc-root>/<pid>)
// listens on, among the nvidia-*.sock sockets of `device_plugin_dir`; the
// error says why none (for the findings).
absl::StatusOr<std::string> HeldNvidiaPluginSocket(
    const std::filesystem::path& pid_dir, const std::filesystem::path& device_plugin_dir,
    std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max());

// Bounds on one scan of <proc-root>.
struct ProcessScanLimits {
  // Root processes named nvidia-device-plugin read beyond their name and
  // status. A node runs one NVIDIA device plugin (two for a moment during a
  // rolling update, a few more with one per MIG or sharing config); each
  // candidate may cost about 4.5 MiB of reads (the bounds above), so 8 keep
  // a pass under 40 MiB whatever runs on the node.
  size_t max_candidates = 8;
  // The scan stops here (checked before each entry, each candidate's files
  // and each of its descriptors).
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
};

// What a scan found.
struct NvidiaPluginScan {
  // The candidates read: root processes named nvidia-device-plugin, by
  // ascending pid.
  std::vector<NvidiaPluginProcess> processes;
  // Processes named nvidia-device-plugin whose real UID is not 0 (or whose
  // status could not be read): not read further, no evidence either way.
  size_t not_root = 0;
  // Candidates beyond ProcessScanLimits::max_candidates: not read.
  size_t over_cap = 0;
  // Non-empty when the scan may have missed the plugin's setting (says
  // why): candidates over the cap ("<proc_root>: 3 more nvidia-device-plugin
  // processes run by root than the 8 read"), or the plugin's command line
  // beyond its bound ("<path>: larger than 64 KiB (process 42 holds
  // <socket>)").
  std::string incomplete;
};

// Every nvidia-device-plugin process under `proc_root` (numeric entries
// whose cmdline matches) run by root, by ascending pid, each with whether it
// holds the plugin's socket in `device_plugin_dir`, within `limits`.
// Processes that vanish while being read are skipped; an unreadable environ
// or executable leaves mofed_env or version unset; a command line beyond
// its bound makes the process untrusted ("<path>: larger than 64 KiB").
// Fails naming the path when `proc_root` cannot be listed (whole), and with
// DeadlineExceeded when the deadline passes:
//   "<proc_root>: the scan stopped at its time box after 8123 entries"
absl::StatusOr<NvidiaPluginScan> FindNvidiaPluginProcesses(
    const std::filesystem::path& proc_root, const std::filesystem::path& device_plugin_dir,
    const ProcessScanLimits& limits = {});

}  // namespace efa::plugin
