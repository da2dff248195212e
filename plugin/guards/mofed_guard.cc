#include "plugin/guards/mofed_guard.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "topology/sysfs.h"

namespace efa::plugin {
namespace fs = std::filesystem;
namespace {

// Findings listed per source before "and N more": enough to act on, short
// enough for one log line.
constexpr size_t kMaxFindings = 3;

bool IsNvidiaResource(const std::string& resource) {
  // nvidia.com/gpu, and the renamed or shared ones (nvidia.com/gpu.shared,
  // nvidia.com/mig-1g.10gb): all come from the NVIDIA device plugin.
  return absl::StartsWith(resource, "nvidia.com/");
}

std::string Describe(const NvidiaPluginProcess& p) {
  return absl::StrCat("process ", p.pid, " (", kNvidiaPluginCommand, " ",
                      p.version.empty() ? "version unknown" : p.version, ")");
}

const char* Bool(bool b) { return b ? "true" : "false"; }

std::string EntryKey(const CheckpointEntry& e) {
  return absl::StrCat(e.pod_uid, "\n", e.container_name, "\n", e.resource_name);
}

std::string DescribeEntry(const std::string& path, const CheckpointEntry& entry) {
  return absl::StrCat(path, ": pod ", absl::CHexEscape(entry.pod_uid), " container \"",
                      absl::CHexEscape(entry.container_name), "\" (", entry.resource_name, ")");
}

}  // namespace

std::set<size_t> ListedEntries(const KubeletCheckpoint& checkpoint,
                               const v1::ListPodResourcesResponse& list) {
  // Every listed container's device IDs, by resource.
  std::vector<std::map<std::string, std::set<std::string>>> containers;
  for (const v1::PodResources& pod : list.pod_resources()) {
    for (const v1::ContainerResources& c : pod.containers()) {
      auto& ids = containers.emplace_back();
      for (const v1::ContainerDevices& d : c.devices()) {
        ids[d.resource_name()].insert(d.device_ids().begin(), d.device_ids().end());
      }
    }
  }
  std::set<size_t> listed;
  std::set<std::string> listed_pods;
  for (size_t i = 0; i < checkpoint.entries.size(); ++i) {
    const CheckpointEntry& e = checkpoint.entries[i];
    bool found = e.device_ids.empty();
    for (size_t c = 0; c < containers.size() && !found; ++c) {
      auto it = containers[c].find(e.resource_name);
      found = it != containers[c].end() &&
              std::all_of(e.device_ids.begin(), e.device_ids.end(),
                          [&](const std::string& id) { return it->second.count(id) > 0; });
    }
    if (found) {
      listed.insert(i);
      listed_pods.insert(e.pod_uid);
    }
  }
  for (size_t i = 0; i < checkpoint.entries.size(); ++i) {
    if (listed_pods.count(checkpoint.entries[i].pod_uid)) listed.insert(i);
  }
  return listed;
}

void GoneContainers::Update(const KubeletCheckpoint& checkpoint,
                            const absl::StatusOr<v1::ListPodResourcesResponse>& list,
                            time_point now) {
  if (!list.ok()) {
    unknown_ = std::string(list.status().message());
    return;
  }
  if (list->pod_resources_size() == 0) {
    unknown_ = "pod-resources lists no pod (a kubelet that has just started)";
    return;
  }
  unknown_.clear();
  const std::set<size_t> listed = ListedEntries(checkpoint, *list);
  std::map<std::string, Absence> absent;
  for (size_t i = 0; i < checkpoint.entries.size(); ++i) {
    if (listed.count(i)) continue;
    const std::string key = EntryKey(checkpoint.entries[i]);
    auto it = absent_.find(key);
    absent[key] = {it == absent_.end() ? now : it->second.first, now};
  }
  absent_ = std::move(absent);  // listed again, or out of the checkpoint: forgotten
}

std::optional<std::chrono::milliseconds> GoneContainers::GoneFor(
    const CheckpointEntry& entry) const {
  auto it = absent_.find(EntryKey(entry));
  if (it == absent_.end()) return std::nullopt;
  const auto left_out =
      std::chrono::duration_cast<std::chrono::milliseconds>(it->second.last - it->second.first);
  if (left_out < confirm_) return std::nullopt;
  return left_out;
}

const std::vector<std::pair<MofedPolicy, std::string>>& MofedPolicyNames() {
  static const auto* names = new std::vector<std::pair<MofedPolicy, std::string>>{
      {MofedPolicy::kWarn, "warn"}, {MofedPolicy::kProtect, "protect"}, {MofedPolicy::kOff, "off"}};
  return *names;
}

std::string_view MofedPolicyName(MofedPolicy policy) {
  for (const auto& [value, name] : MofedPolicyNames()) {
    if (value == policy) return name;
  }
  return "?";
}

std::string_view MofedStateName(MofedState state) {
  switch (state) {
    case MofedState::kOff:
      return "off";
    case MofedState::kOn:
      return "on";
    case MofedState::kUnknown:
      return "unknown";
  }
  return "?";
}

std::optional<std::string> MofedInAllocResponse(const v1beta1::ContainerAllocateResponse& resp) {
  if (auto it = resp.envs().find(kNvidiaMofedEnv);
      it != resp.envs().end() && absl::EqualsIgnoreCase(it->second, "enabled")) {
    return absl::StrCat("env ", kNvidiaMofedEnv, "=", it->second);
  }
  for (const v1beta1::CDIDevice& device : resp.cdi_devices()) {
    if (device.name() == kMofedCdiDevice) return absl::StrCat("CDI device ", kMofedCdiDevice);
  }
  // --device-list-strategy=cdi-annotations passes CDI names in annotations
  // (comma-separated) instead.
  for (const auto& [key, value] : resp.annotations()) {
    for (absl::string_view name : absl::StrSplit(value, ',')) {
      if (absl::StripAsciiWhitespace(name) == kMofedCdiDevice) {
        return absl::StrCat("CDI annotation ", key, "=", kMofedCdiDevice);
      }
    }
  }
  return std::nullopt;
}

MofedEvidence MofedFromCheckpoint(const absl::StatusOr<KubeletCheckpoint>& checkpoint,
                                  const fs::path& checkpoint_path, const GoneContainers* gone) {
  MofedEvidence evidence;
  const std::string path = checkpoint_path.string();
  if (!checkpoint.ok()) {
    if (absl::IsNotFound(checkpoint.status())) {
      evidence.findings.push_back(absl::StrCat(path, ": absent"));
      return evidence;
    }
    // Over its size bound, or short of descriptors or memory: not read,
    // so it proves nothing (a corrupt one may hide an on: unknown).
    if (absl::IsResourceExhausted(checkpoint.status()) ||
        topology::IsHostResourceError(topology::ErrnoOf(checkpoint.status()))) {
      evidence.incomplete = std::string(checkpoint.status().message());
    }
    evidence.state = MofedState::kUnknown;
    evidence.findings.emplace_back(checkpoint.status().message());
    return evidence;
  }
  size_t nvidia = 0, with_mofed = 0, gone_with_mofed = 0;
  std::vector<std::string> gone_findings;
  for (const CheckpointEntry& entry : checkpoint->entries) {
    if (!IsNvidiaResource(entry.resource_name)) continue;
    std::optional<std::string> shown = MofedInAllocResponse(entry.alloc_resp);
    const std::optional<std::chrono::milliseconds> gone_for =
        gone ? gone->GoneFor(entry) : std::nullopt;
    if (gone_for) {
      if (shown && ++gone_with_mofed <= kMaxFindings) {
        gone_findings.push_back(absl::StrCat(DescribeEntry(path, entry), " has ", *shown,
                                             ", but pod-resources has not listed it for ",
                                             gone_for->count() / 1000, " s: gone, ignored"));
      }
      continue;
    }
    ++nvidia;
    if (!shown) continue;
    if (++with_mofed <= kMaxFindings) {
      evidence.findings.push_back(absl::StrCat(DescribeEntry(path, entry), " has ", *shown));
    }
  }
  if (with_mofed > kMaxFindings) {
    evidence.findings.push_back(
        absl::StrCat(path, ": and ", with_mofed - kMaxFindings, " more NVIDIA containers so"));
  }
  if (with_mofed > 0 && gone && !gone->unknown().empty()) {
    evidence.findings.push_back(absl::StrCat("cannot tell which of these containers still run (",
                                             gone->unknown(), "): each counts"));
  }
  if (with_mofed > 0) {
    evidence.state = MofedState::kOn;
  } else if (!checkpoint->skipped.empty()) {
    // A skipped entry may be an NVIDIA container's with MOFED.
    evidence.state = MofedState::kUnknown;
    evidence.findings.insert(evidence.findings.end(), checkpoint->skipped.begin(),
                             checkpoint->skipped.end());
  } else if (nvidia == 0) {
    evidence.findings.push_back(absl::StrCat(path, ": no NVIDIA containers"));
  } else {
    evidence.findings.push_back(absl::StrCat(path, ": ", nvidia, " NVIDIA container",
                                             nvidia == 1 ? "" : "s", ", none with ",
                                             kNvidiaMofedEnv, " or the MOFED CDI device"));
  }
  if (with_mofed == 0) {
    evidence.findings.insert(evidence.findings.end(), gone_findings.begin(), gone_findings.end());
    if (gone_with_mofed > kMaxFindings) {
      evidence.findings.push_back(absl::StrCat(path, ": and ", gone_with_mofed - kMaxFindings,
                                               " more gone NVIDIA containers so"));
    }
  }
  return evidence;
}

MofedEvidence MofedFromCdiSpecDirs(const std::vector<fs::path>& dirs) {
  MofedEvidence evidence;
  std::vector<std::string> searched;
  for (const fs::path& dir : dirs) {
    searched.push_back(dir.string());
    for (const char* ext : {".json", ".yaml"}) {
      const fs::path spec = dir / absl::StrCat(kMofedCdiSpecStem, ext);
      struct stat st;
      if (::stat(spec.c_str(), &st) == 0) {
        evidence.hints.push_back(absl::StrCat(
            spec.string(),
            ": the NVIDIA MOFED CDI spec is installed (a hint: the NVIDIA device plugin has or had "
            "MOFED on; no container counted was given it)"));
      } else if (errno != ENOENT && errno != ENOTDIR) {
        evidence.findings.emplace_back(topology::PathError(spec, errno).message());
      }
    }
  }
  if (evidence.hints.empty() && !dirs.empty()) {
    evidence.findings.push_back(
        absl::StrCat("no NVIDIA MOFED CDI spec in ", absl::StrJoin(searched, ", ")));
  }
  return evidence;
}

MofedEvidence MofedFromProcesses(const absl::StatusOr<NvidiaPluginScan>& scan,
                                 const fs::path& proc_root) {
  MofedEvidence evidence;
  if (!scan.ok()) {
    evidence.findings.emplace_back(scan.status().message());
    // Stopped at the time box, or short of descriptors or memory: whatever
    // was not read may be the plugin.
    if (absl::IsDeadlineExceeded(scan.status()) ||
        topology::IsHostResourceError(topology::ErrnoOf(scan.status()))) {
      evidence.incomplete = evidence.findings.back();
    }
    return evidence;
  }
  if (scan->processes.empty()) {
    evidence.findings.push_back(absl::StrCat("no ", kNvidiaPluginCommand,
                                             " process run by root under ", proc_root.string()));
  }
  if (scan->not_root > 0) {
    evidence.findings.push_back(absl::StrCat(scan->not_root, " ", kNvidiaPluginCommand,
                                             " processes not run by root under ",
                                             proc_root.string(), ": ignored"));
  }
  if (!scan->incomplete.empty()) {
    evidence.incomplete = scan->incomplete;
    evidence.findings.push_back(scan->incomplete);
  }
  for (const NvidiaPluginProcess& p : scan->processes) {
    if (p.plugin_socket.empty()) {
      // A name anyone can take: no evidence either way.
      evidence.findings.push_back(
          absl::StrCat(Describe(p), ": not the NVIDIA device plugin (", p.untrusted, "); ignored"));
      continue;
    }
    std::string why;
    if (p.mofed_flag) {
      why = absl::StrCat("command line sets --mofed-enabled=", Bool(*p.mofed_flag));
    } else if (p.mofed_env) {
      why = absl::StrCat("environment sets MOFED_ENABLED=", Bool(*p.mofed_env));
    } else if (auto by_default = MofedDefaultForVersion(p.version)) {
      why = *by_default ? absl::StrCat("MOFED is on by default in ", p.version)
                        : absl::StrCat("MOFED is off by default in ", p.version);
    } else {
      why = absl::StrCat("MOFED not set by flag or environment",
                         p.environ_readable ? "" : " (environment unreadable)");
    }
    if (EffectiveMofed(p).value_or(false)) evidence.state = MofedState::kOn;
    evidence.findings.push_back(absl::StrCat(Describe(p), ": ", why));
  }
  return evidence;
}

MofedReport CombineMofedEvidence(const std::vector<MofedEvidence>& sources) {
  MofedReport report;
  for (const MofedEvidence& s : sources) {
    if (s.state == MofedState::kOn) {
      report.state = MofedState::kOn;
    } else if (s.state == MofedState::kUnknown && report.state == MofedState::kOff) {
      report.state = MofedState::kUnknown;
    }
  }
  for (const MofedEvidence& s : sources) {
    std::vector<std::string>& to = s.state == report.state ? report.evidence : report.other;
    to.insert(to.end(), s.findings.begin(), s.findings.end());
    report.hints.insert(report.hints.end(), s.hints.begin(), s.hints.end());
    if (report.state != MofedState::kOn && report.incomplete.empty()) {
      report.incomplete = s.incomplete;
    }
  }
  return report;
}

MofedGuard::MofedGuard(Options options)
    : options_(std::move(options)),
      pod_resources_(options_.pod_resources_socket.empty()
                         ? nullptr
                         : std::make_unique<PodResourcesClient>(options_.pod_resources_socket,
                                                                PodResourcesClient::Options{})),
      gone_(options_.gone_after) {}

MofedReport MofedGuard::Check(std::chrono::steady_clock::time_point now) {
  // Real time, not the daemon's Clock: the box bounds how long the owner
  // thread is really away, whatever a test's clock says.
  const auto deadline = std::chrono::steady_clock::now() + options_.time_box;
  std::vector<MofedEvidence> sources;
  if (!options_.checkpoint.empty()) {
    const absl::StatusOr<KubeletCheckpoint> checkpoint = ReadCheckpoint(options_.checkpoint);
    // pod-resources is asked only while an entry shows MOFED: on most
    // nodes never.
    if (pod_resources_ && checkpoint.ok() &&
        std::any_of(checkpoint->entries.begin(), checkpoint->entries.end(),
                    [](const CheckpointEntry& e) {
                      return IsNvidiaResource(e.resource_name) &&
                             MofedInAllocResponse(e.alloc_resp).has_value();
                    })) {
      gone_.Update(*checkpoint, pod_resources_->List(), now);
    }
    sources.push_back(
        MofedFromCheckpoint(checkpoint, options_.checkpoint, pod_resources_ ? &gone_ : nullptr));
  }
  if (!options_.cdi_spec_dirs.empty()) {
    sources.push_back(MofedFromCdiSpecDirs(options_.cdi_spec_dirs));
  }
  if (!options_.proc_root.empty()) {
    sources.push_back(
        MofedFromProcesses(FindNvidiaPluginProcesses(options_.proc_root, options_.device_plugin_dir,
                                                     {.deadline = deadline}),
                           options_.proc_root));
  }
  return CombineMofedEvidence(sources);
}

}  // namespace efa::plugin
