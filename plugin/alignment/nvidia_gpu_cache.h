// The NVIDIA GPU list of <proc-root>/driver/nvidia/gpus, read once rather
// than on every GetPreferredAllocation or PreStartContainer: GPUs change
// with the hardware, not between calls.
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "topology/host_model.h"
#include "topology/nvidia_gpus.h"

namespace efa::plugin {

class NvidiaGpuCache {
 public:
  struct List {
    std::vector<topology::NvidiaGpu> gpus;  // as ReadNvidiaGpus returns them
    std::vector<std::string> errors;        // the GPUs it left out, and why
  };
  explicit NvidiaGpuCache(std::filesystem::path proc_root) : proc_root_(std::move(proc_root)) {}

  // The GPU list, read at the first call and again whenever it holds fewer
  // GPUs than `model` has NVIDIA GPUs (the driver loaded after the list was
  // read). Never null. Thread-safe.
  std::shared_ptr<const List> Get(const topology::HostModel& model);

 private:
  const std::filesystem::path proc_root_;
  absl::Mutex mu_;
  std::shared_ptr<const List> list_ ABSL_GUARDED_BY(mu_);
};

}  // namespace efa::plugin
