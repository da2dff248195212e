#include "plugin/alignment/aligner.h"

#include <algorithm>

#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"

namespace efa::plugin {
namespace {

// Where the accelerator plugins will put the next accelerators, beside
// which the EFAs go: by the lowest accelerator none of `containers` holds.
Targets Predict(const std::vector<ContainerDevices>& containers,
                const AcceleratorResources& resources, const std::vector<topology::NvidiaGpu>& gpus,
                const topology::HostModel& model) {
  std::vector<std::pair<std::string, std::string>> held;
  for (const ContainerDevices& c : containers) {
    held.insert(held.end(), c.accelerators.begin(), c.accelerators.end());
  }
  Targets busy = ResolveTargets(held, resources, gpus, model);
  Targets prediction;
  prediction.busy_known = busy.unresolved.empty() && busy.neuron_indices.empty();
  prediction.busy = std::move(busy.pci);
  if (model.neuron_table() != nullptr) {
    // With the AWS table: the EFAs of the lowest Neuron device nobody
    // holds, the one the Neuron plugin hands out next.
    for (int n = 0;; ++n) {
      if (model.NeuronEfas(n).empty()) break;
      if (std::find(busy.neuron_indices.begin(), busy.neuron_indices.end(), n) ==
          busy.neuron_indices.end()) {
        prediction.neuron_indices = {n};
        break;
      }
    }
  }
  return prediction;
}

}  // namespace

AlignmentStats::Counts AlignmentStats::Get() const {
  absl::MutexLock lock(&mu_);
  return counts_;
}

void AlignmentStats::Add(int Counts::*field) {
  absl::MutexLock lock(&mu_);
  ++(counts_.*field);
}

bool AlignmentStats::WaitForJudgedForTest(int n, std::chrono::milliseconds timeout) const {
  struct Arg {
    const Counts* counts;
    int n;
  };
  absl::MutexLock lock(&mu_);
  Arg arg{&counts_, n};
  return mu_.AwaitWithTimeout(
      absl::Condition(
          +[](Arg* a) { return a->counts->aligned + a->counts->unaligned >= a->n; }, &arg),
      absl::FromChrono(timeout));
}

Aligner::Aligner(AlignerOptions options)
    : options_(std::move(options)),
      pod_resources_(options_.kubelet_dir / "pod-resources/kubelet.sock", options_.pod_resources),
      checkpoint_(options_.kubelet_dir / "device-plugins" / kCheckpointFile),
      gpus_(options_.proc_root) {}

Targets Aligner::ForAdmission(const topology::HostModel& model) {
  const AcceleratorResources& r = options_.resources;
  if (r.gpu.empty() && r.neuron.empty() && r.neuroncore.empty()) {
    // Nothing to align with: nothing to ask.
    stats_.Add(&AlignmentStats::Counts::predicted);
    return {};
  }
  // Admissions are serialized by the kubelet: not subject to our own limit.
  auto list = pod_resources_.List(/*rate_limited=*/false);
  LogPodResourcesChange(list.status());
  if (!list.ok()) {
    stats_.Add(&AlignmentStats::Counts::degraded);
    if (spdlog::should_log(spdlog::level::debug)) {
      spdlog::debug("GetPreferredAllocation: degraded ({})", std::string(list.status().message()));
    }
    return {};
  }
  auto checkpointed = Checkpointed();
  int candidates = 0;
  auto containers = ContainersWithDevices(*list, options_.resources);
  std::optional<ContainerDevices> admitted;
  {
    absl::MutexLock lock(&names_mu_);
    admitted = FindAdmittedContainer(containers, checkpointed ? &*checkpointed : nullptr,
                                     pod_names_, &candidates);
  }
  const auto gpu_list = gpus_.Get(model);
  const std::vector<topology::NvidiaGpu>& gpus = gpu_list->gpus;
  const std::vector<std::string>& errors = gpu_list->errors;
  if (!admitted) {
    Targets prediction = Predict(containers, options_.resources, gpus, model);
    stats_.Add(&AlignmentStats::Counts::predicted);
    if (spdlog::should_log(spdlog::level::debug)) {  // (the arguments cost allocations)
      spdlog::debug(
          "GetPreferredAllocation: {}; placing EFAs where the accelerators will likely go",
          candidates == 0
              ? "no container with accelerators is being admitted"
              : std::to_string(candidates) + " containers could be the one being admitted");
    }
    return prediction;
  }
  Targets targets = ResolveTargets(admitted->accelerators, options_.resources, gpus, model);
  if (targets.empty()) {
    stats_.Add(&AlignmentStats::Counts::predicted);
    spdlog::warn("GetPreferredAllocation: cannot place the accelerators of {} ({}{}); predicting",
                 admitted->Name(), absl::StrJoin(targets.unresolved, ", "),
                 errors.empty() ? "" : "; " + absl::StrJoin(errors, "; "));
    return targets;
  }
  stats_.Add(&AlignmentStats::Counts::targeted);
  if (spdlog::should_log(spdlog::level::debug)) {
    spdlog::debug("GetPreferredAllocation: aligning with the accelerators of {} ({})",
                  admitted->Name(), DescribeTargets(targets));
  }
  return targets;
}

void Aligner::LogPodResourcesChange(const absl::Status& status) {
  // Once per cause, not per call: an absent pod-resources socket would
  // otherwise log at every admission.
  absl::MutexLock lock(&failure_mu_);
  const std::string failure = status.ok() ? "" : std::string(status.message());
  if (failure == last_failure_) return;
  if (!status.ok()) {
    spdlog::warn(
        "cannot learn the admitted container's accelerators ({}); placing EFAs by prediction "
        "until pod-resources answers",
        failure);
  } else {
    spdlog::info("pod-resources answers again: aligning EFAs with admitted containers");
  }
  last_failure_ = failure;
}

std::optional<std::vector<ContainerDevices>> Aligner::Checkpointed() {
  const auto checkpoint = checkpoint_.Get();
  if (!checkpoint->ok()) return std::nullopt;
  return CheckpointedContainers(**checkpoint, options_.resources);
}

Aligner::ReportOutcome Aligner::Report(const topology::HostModel& model) {
  auto list = pod_resources_.List();
  if (PodResourcesClient::IsOwnRateLimit(list.status())) return ReportOutcome::kDeferred;
  if (!list.ok()) {
    stats_.Add(&AlignmentStats::Counts::report_failed);
    return ReportOutcome::kFailed;
  }
  const auto containers = ContainersWithDevices(*list, options_.resources);
  if (auto checkpointed = Checkpointed()) {
    absl::MutexLock lock(&names_mu_);
    LearnPodNames(containers, *checkpointed, pod_names_);
  }
  std::set<std::string> present;
  for (const ContainerDevices& c : containers) {
    if (c.efas.empty() || c.accelerators.empty()) continue;
    std::vector<std::string> efas = c.efas;
    if (options_.bound_efas) {
      // Judge the EFAs the container really got; one not started yet is
      // judged once it is bound.
      auto bound = options_.bound_efas(c.efas);
      if (!bound) continue;
      efas = *std::move(bound);
    }
    const std::string key = c.Name() + "\n" + absl::StrJoin(efas, ",");
    present.insert(key);
    if (reported_.count(key)) continue;
    Targets targets =
        ResolveTargets(c.accelerators, options_.resources, gpus_.Get(model)->gpus, model);
    const bool aligned = !targets.empty() && IsAligned(model, efas, targets);
    stats_.Add(aligned ? &AlignmentStats::Counts::aligned : &AlignmentStats::Counts::unaligned);
    spdlog::info("alignment: {} {}: EFAs {} with {}", c.Name(), aligned ? "aligned" : "NOT aligned",
                 absl::StrJoin(efas, ","), DescribeTargets(targets));
  }
  // Forget containers that are gone, so the set does not grow.
  std::erase_if(reported_, [&](const std::string& k) { return !present.count(k); });
  reported_.insert(present.begin(), present.end());
  return ReportOutcome::kJudged;
}

}  // namespace efa::plugin
