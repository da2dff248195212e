// The kubelet checkpoint, parsed once per change of the file: readers on the
// gRPC handler path (GetPreferredAllocation, PreStartContainer) get the
// parsed copy without touching the file system.
#pragma once

#include <filesystem>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "plugin/kubelet/file_change_watch.h"
#include "plugin/kubelet/kubelet_checkpoint.h"

namespace efa::plugin {

class CheckpointCache {
 public:
  using Result = absl::StatusOr<KubeletCheckpoint>;
  // `path`: <kubelet-dir>/device-plugins/kubelet_internal_checkpoint.
  explicit CheckpointCache(std::filesystem::path path) : watch_(std::move(path)) {}

  // The checkpoint as ReadCheckpoint returns it, read again only when
  // inotify reported a change since the previous read (FileChangeWatch).
  // Never null. Thread-safe.
  std::shared_ptr<const Result> Get();

 private:
  FileChangeWatch watch_;
  absl::Mutex mu_;
  std::shared_ptr<const Result> parsed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace efa::plugin
