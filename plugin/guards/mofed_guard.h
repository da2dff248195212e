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
//     Only entries of containers the kubelet still runs count: it drops a
//     deleted pod's entries from the file only at its next write (an
//     admission, or a plugin's device list changing: kubelet
//     pkg/kubelet/cm/devicemanager/manager.go, writeCheckpoint's callers),
//     and under policy protect nothing of this plugin's may cause one. An
//     entry stops counting once pod-resources' successful answers have left
//     its container out for GoneContainers' confirmation time;
//   - the NVIDIA MOFED CDI spec (k8s.device-plugin.nvidia.com-mofed.json or
//     .yaml) in a CDI spec directory: a hint only, reported but never On by
//     itself (the NVIDIA plugin leaves it behind when MOFED is turned off,
//     and /var/run/cdi keeps it until the node reboots);
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
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "plugin/guards/nvidia_plugin_process.h"
#include "plugin/kubelet/kubelet_checkpoint.h"
#include "plugin/kubelet/pod_resources_client.h"

namespace efa::plugin {

inline constexpr char kNvidiaMofedEnv[] = "NVIDIA_MOFED";
inline constexpr char kMofedCdiDevice[] = "k8s.device-plugin.nvidia.com/mofed=all";
// The spec file's name without its extension (.json or .yaml).
inline constexpr char kMofedCdiSpecStem[] = "k8s.device-plugin.nvidia.com-mofed";
// What the operator should do, quoted in logs and docs/guards.md.
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
// Each policy and its name ("warn", "protect", "off"), in declaration order:
// the configuration reads and writes them from here.
const std::vector<std::pair<MofedPolicy, std::string>>& MofedPolicyNames();
std::string_view MofedPolicyName(MofedPolicy policy);

enum class MofedState { kOff, kOn, kUnknown };
std::string_view MofedStateName(MofedState state);  // "off", "on", "unknown"

// What one source says, with human-readable findings that each name where
// they were seen (a file, a pod and container, a pid).
struct MofedEvidence {
  MofedState state = MofedState::kOff;
  std::vector<std::string> findings;
  // What suggests MOFED without showing it (the MOFED CDI spec installed).
  std::vector<std::string> hints = {};
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
  // Every source's hints, whatever the state.
  std::vector<std::string> hints = {};
  // Non-empty when no source shows On and one stopped at a bound (its
  // `incomplete`): the state is not a verdict, keep the previous one.
  std::string incomplete;
};

// How long pod-resources must leave a checkpointed container out before
// its entry stops counting: longer than a restarted kubelet takes to list
// its pods again (it answers List from its pod manager, which fills as the
// API server's pods are added back: kubelet
// pkg/kubelet/apis/podresources/server_v1.go, List), while a MOFED pod that
// is gone keeps the EFAs held under protect only this much longer.
inline constexpr std::chrono::milliseconds kMofedGoneAfter{30000};

// The indexes in `checkpoint.entries` of the entries pod-resources lists.
// The kubelet answers each listed container's devices from the record it
// checkpoints (server_v1.go, List: devicesProvider.GetDevices(pod UID,
// container)), but by pod name, not UID: an entry is listed when one listed
// container holds every device ID of the entry's resource, or when another
// entry of the same pod is (List leaves out init containers, which the
// checkpoint keeps). An entry without device IDs cannot be matched and
// counts as listed. Pure.
std::set<size_t> ListedEntries(const KubeletCheckpoint& checkpoint,
                               const v1::ListPodResourcesResponse& list);

// Which checkpoint entries belong to containers the kubelet no longer runs,
// from pod-resources answers over time. An entry is gone once two
// successful answers at least `confirm` apart left it out, with none
// listing it in between. A failed List, or one listing no pod at all (a
// kubelet that has just restarted, before its pods are added back; a synced
// kubelet lists at least this daemon's own pod), changes nothing: the
// entries count as before. Thread-compatible.
class GoneContainers {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  explicit GoneContainers(std::chrono::milliseconds confirm) : confirm_(confirm) {}

  // Takes in one answer about `checkpoint`, read at `now`.
  void Update(const KubeletCheckpoint& checkpoint,
              const absl::StatusOr<v1::ListPodResourcesResponse>& list, time_point now);
  // How long the entry's container has been left out, once that is
  // confirmed; else nullopt.
  std::optional<std::chrono::milliseconds> GoneFor(const CheckpointEntry& entry) const;
  // Why the latest answer told nothing (the List error, or "no pod
  // listed"); empty after a useful one.
  const std::string& unknown() const { return unknown_; }

 private:
  struct Absence {
    time_point first, last;  // the first and the latest answers leaving it out
  };
  const std::chrono::milliseconds confirm_;
  std::map<std::string, Absence> absent_;  // by pod UID, container, resource
  std::string unknown_;
};

// From a parsed checkpoint, or the error reading it (`checkpoint_path`
// names the file in findings). NotFound is Off (no checkpoint yet); any
// other error is Unknown with the error as the finding. Entries `gone`
// knows to be gone do not count (a finding names them); null: all count.
MofedEvidence MofedFromCheckpoint(const absl::StatusOr<KubeletCheckpoint>& checkpoint,
                                  const std::filesystem::path& checkpoint_path,
                                  const GoneContainers* gone = nullptr);

// Whether an Allocate answer turns MOFED on; returns what shows it
// ("env NVIDIA_MOFED=enabled", "CDI device k8s.device-plugin.nvidia.com/mofed=all")
// or nullopt. Pure.
std::optional<std::string> MofedInAllocResponse(const v1beta1::ContainerAllocateResponse& resp);

// From the MOFED CDI spec in any of `dirs`: present is a hint, never On by
// itself. A directory that does not exist is no evidence; one that cannot
// be searched is a finding, not Unknown (the spec is a hint, the checkpoint
// is the proof).
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
    // The kubelet's pod-resources socket, asked which checkpointed
    // containers still run (only while an entry shows MOFED); empty: every
    // entry counts.
    std::filesystem::path pod_resources_socket = {};
    std::chrono::milliseconds gone_after = kMofedGoneAfter;
    // Check stops scanning /proc this long after it starts (incomplete).
    std::chrono::milliseconds time_box = kMofedCheckTimeBox;
  };
  explicit MofedGuard(Options options);

  // `now` dates the pod-resources answer (GoneContainers).
  MofedReport Check(std::chrono::steady_clock::time_point now);

 private:
  const Options options_;
  std::unique_ptr<PodResourcesClient> pod_resources_;  // null without a socket
  GoneContainers gone_;
};

}  // namespace efa::plugin
