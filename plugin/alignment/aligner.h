// The I/O side of EFA alignment for the daemon: at admission it asks the
// kubelet's pod-resources API and checkpoint which accelerators the
// container being admitted holds; after the fact it reports, for every
// container holding EFAs and accelerators, whether they are aligned.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "plugin/alignment/alignment.h"
#include "plugin/alignment/nvidia_gpu_cache.h"
#include "plugin/kubelet/checkpoint_cache.h"
#include "plugin/kubelet/pod_resources_client.h"
#include "plugin/kubelet/resource_name.h"

namespace efa::plugin {

struct AlignerOptions {
  // Given by the daemon (DaemonOptions holds their defaults).
  std::filesystem::path kubelet_dir;
  std::filesystem::path proc_root;
  AcceleratorResources resources;
  PodResourcesClient::Options pod_resources;
  // Late binding: the physical EFAs bound for a container's kubelet device
  // IDs, nullopt while not bound yet. Null: the IDs are the EFAs.
  std::function<std::optional<std::vector<std::string>>(const std::vector<std::string>&)>
      bound_efas;
};

// Counters since start. Thread-safe.
class AlignmentStats {
 public:
  struct Counts {
    // GetPreferredAllocation decisions.
    int targeted = 0;   // the admitted container's accelerators were known
    int predicted = 0;  // none known yet (EFAs first, or no accelerators)
    int degraded = 0;   // pod-resources failed: predicted as well
    // After the fact, containers holding EFAs and accelerators.
    int aligned = 0;
    int unaligned = 0;
    // Judgment passes that pod-resources failed (retried with backoff).
    int report_failed = 0;
  };
  Counts Get() const;
  void Add(int Counts::*field);
  // Blocks until aligned + unaligned >= n or `timeout` passes.
  bool WaitForJudgedForTest(int n, std::chrono::milliseconds timeout) const;

 private:
  mutable absl::Mutex mu_;
  Counts counts_ ABSL_GUARDED_BY(mu_);
};

class Aligner {
 public:
  explicit Aligner(AlignerOptions options);

  // The accelerators of the container being admitted, or empty targets
  // (then the policy predicts). Never fails and never waits longer than
  // the pod-resources timeout; asks nothing when no accelerator resource
  // is configured, and does no file I/O (the checkpoint and the GPU list
  // are read when they change). Logs at debug level (the decision is
  // counted in stats()), a failure to ask pod-resources once per cause.
  // Thread-safe.
  Targets ForAdmission(const topology::HostModel& model);

  // The kubelet checkpoint as of now (read once per change). Thread-safe.
  std::shared_ptr<const CheckpointCache::Result> Checkpoint() { return checkpoint_.Get(); }

  // Judges every container that holds EFAs and accelerators and was not
  // judged before: one log line each and a counter. kFailed when
  // pod-resources did not answer (counted; try again later, less often while
  // it keeps failing), kDeferred when our own rate limit had no token (not a
  // failure: a burst of admissions spent them; one is due within 1/max_qps).
  // Call from one thread.
  enum class ReportOutcome { kJudged, kDeferred, kFailed };
  ReportOutcome Report(const topology::HostModel& model);

  const AlignmentStats& stats() const { return stats_; }

 private:
  // The checkpoint's containers; nullopt when it cannot be read.
  std::optional<std::vector<ContainerDevices>> Checkpointed();
  // Logs when pod-resources starts failing, fails for another cause or
  // answers again after a failure (`status` is the latest call's).
  void LogPodResourcesChange(const absl::Status& status);

  const AlignerOptions options_;
  PodResourcesClient pod_resources_;
  CheckpointCache checkpoint_;
  NvidiaGpuCache gpus_;
  absl::Mutex failure_mu_;
  std::string last_failure_ ABSL_GUARDED_BY(failure_mu_);  // logged once
  AlignmentStats stats_;
  absl::Mutex names_mu_;
  PodNames pod_names_ ABSL_GUARDED_BY(names_mu_);  // learned by Report()
  std::set<std::string> reported_;                 // Report() only
};

}  // namespace efa::plugin
