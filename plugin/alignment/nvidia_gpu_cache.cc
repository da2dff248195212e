#include "plugin/alignment/nvidia_gpu_cache.h"

#include <algorithm>

namespace efa::plugin {

std::shared_ptr<const NvidiaGpuCache::List> NvidiaGpuCache::Get(const topology::HostModel& model) {
  const auto in_model = static_cast<size_t>(
      std::count_if(model.accelerators().begin(), model.accelerators().end(),
                    [](const auto& a) { return a.kind == topology::AcceleratorKind::kNvidiaGpu; }));
  absl::MutexLock lock(&mu_);
  if (!list_ || list_->gpus.size() < in_model) {
    auto list = std::make_shared<List>();
    list->gpus = topology::ReadNvidiaGpus(proc_root_, &list->errors);
    list_ = std::move(list);
  }
  return list_;
}

}  // namespace efa::plugin
