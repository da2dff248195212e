// The MOFED guard: detects an NVIDIA device plugin that gives every GPU
// container all /dev/infiniband/uverbs* devices (MOFED on), which breaks the
// exclusive EFA allocation this plugin makes.
//
// Three sources of evidence, each optional and read by a function of its
// own so that it can be tested alone:
//   - the kubelet checkpoint: an NVIDIA entry (resource nvidia.com/*) whose
//     AllocResp carries env NVIDIA_MOFED=enabled, or the CDI device
//     k8s.device-plugin.nvidia.com/mofed=all (as a CDI device or in a CDI
//     annotation): proof that containers were given every uverbs device;
//   - the NVIDIA MOFED CDI spec (k8s.device-plugin.nvidia.com-mofed.json or
//     .yaml) in a CDI spec directory;
//   - the nvidia-device-plugin processes under <proc-root> (visible with
//     hostPID) that hold the NVIDIA plugin's socket (a name alone is not
//     trusted): --mofed-enabled, MOFED_ENABLED, or a version that enables it
//     by default (v0.19.0-v0.19.2).
// Any source showing MOFED makes the state On. Otherwise a source that
// stopped at one of its bounds (the time box, the candidate cap, a file's
// size) or for want of descriptors or memory makes the report incomplete: the caller keeps its
// previous verdict. Otherwise a source that exists but cannot be read or parsed (a corrupt
// checkpoint) makes it Unknown: it may hide an On. Otherwise Off.
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "plugin/guards/nvidia_plugin_process.h"
#include "plugin/kubelet/kubelet_checkpoint.h"

namespace efa::plugin {

inline constexpr char kNvidiaMofedEnv[] = "NVIDIA_MOFED";
inline constexpr char kMofedCdiDevice[] = "k8s.device-plugin.nvidia.com/mofed=all";
// The spec file's name without its extension (.json or .yaml).
inline constexpr char kMofedCdiSpecStem[] = "k8s.device-plugin.nvidia.com-mofed";
// What the operator should do, quoted in logs and the README.
inline constexpr char kMofedRemedy[] =
    "set mofedEnabled: false in the NVIDIA device plugin chart (--mofed-enabled=false, "
    "MOFED_ENABLED=false), or run the NVIDIA device plugin v0.19.3 or later";
// How long one Check may take (the /proc scan stops there). It runs on the
// daemon's owner thread, whose liveness limit is 3 rescan intervals plus
// 15 s, and which must answer a kubelet restart within a second.
inline constexpr std::chrono::milliseconds kMofedCheckTimeBox{500};

// What the daemon does about a conflict.
enum class MofedPolicy {
  kWarn,     // log and report it; EFAs stay schedulable (default)
  kProtect,  // also report every EFA Unhealthy until the conflict clears
  kOff,      // do not look
};
// "warn", "protect", "off". Parse errors name the text:
//   "mofed policy \"x\": expected warn, protect or off".
absl::StatusOr<MofedPolicy> ParseMofedPolicy(std::string_view text);
std::string_view MofedPolicyName(MofedPolicy policy);

enum class MofedState { kOff, kOn, kUnknown };
std::string_view MofedStateName(MofedState state);  // "off", "on", "unknown"

// What one source says, with human-readable findings that each name where
// they were seen (a file, a pod and container, a pid).
struct MofedEvidence {
  MofedState state = MofedState::kOff;
  std::vector<std::string> findings;
  // Non-empty when the source stopped at a bound before it saw everything
  // (says which): unless it shows On, it proves nothing.
  std::string incomplete;
};

// The verdict over every source.
struct MofedReport {
  MofedState state = MofedState::kOff;
  // Why the state is what it is: the findings of the sources in that state.
  std::vector<std::string> evidence;
  // The findings of the other sources.
  std::vector<std::string> other;
  // Non-empty when no source shows On and one stopped at a bound (its
  // `incomplete`): the state is not a verdict, keep the previous one.
  std::string incomplete;
};

// From a parsed checkpoint, or the error reading it (`checkpoint_path`
// names the file in findings). NotFound is Off (no checkpoint yet); any
// other error is Unknown with the error as the finding.
MofedEvidence MofedFromCheckpoint(const absl::StatusOr<KubeletCheckpoint>& checkpoint,
                                  const std::filesystem::path& checkpoint_path);

// Whether an Allocate answer turns MOFED on; returns what shows it
// ("env NVIDIA_MOFED=enabled", "CDI device k8s.device-plugin.nvidia.com/mofed=all")
// or nullopt. Pure.
std::optional<std::string> MofedInAllocResponse(const v1beta1::ContainerAllocateResponse& resp);

// From the MOFED CDI spec in any of `dirs`: present is On. A directory that
// does not exist is no evidence; one that cannot be searched is a finding,
// not Unknown (the spec is a hint, the checkpoint is the proof).
MofedEvidence MofedFromCdiSpecDirs(const std::vector<std::filesystem::path>& dirs);

// From the nvidia-device-plugin processes found under `proc_root`, or the
// error listing it (a finding, state Off: without hostPID no host process
// is visible, which is normal). A scan stopped at its deadline, or with
// candidates over its cap, is incomplete.
MofedEvidence MofedFromProcesses(const absl::StatusOr<NvidiaPluginScan>& scan,
                                 const std::filesystem::path& proc_root);

// Combines the sources as described at the top of this file. Pure.
MofedReport CombineMofedEvidence(const std::vector<MofedEvidence>& sources);

// Reads every configured source and combines them. Thread-compatible: one
// Check at a time (it is called from the daemon's owner thread).
class MofedGuard {
 public:
  struct Options {
    // The kubelet checkpoint; empty to skip.
    std::filesystem::path checkpoint;
    // CDI spec directories (on a node /etc/cdi and /var/run/cdi); empty to
    // skip.
    std::vector<std::filesystem::path> cdi_spec_dirs;
    // The host's procfs; empty to skip.
    std::filesystem::path proc_root;
    // The kubelet's device-plugins directory, where the NVIDIA plugin's
    // socket shows which process is the plugin (nvidia_plugin_process.h).
    std::filesystem::path device_plugin_dir;
    // Check stops scanning /proc this long after it starts (incomplete).
    std::chrono::milliseconds time_box = kMofedCheckTimeBox;
  };
  explicit MofedGuard(Options options) : options_(std::move(options)) {}

  MofedReport Check() const;

 private:
  const Options options_;
};

}  // namespace efa::plugin
