#include "plugin/kubelet/checkpoint_cache.h"

namespace efa::plugin {

std::shared_ptr<const CheckpointCache::Result> CheckpointCache::Get() {
  absl::MutexLock lock(&mu_);
  if (watch_.Changed() || !parsed_) {
    parsed_ = std::make_shared<const Result>(ReadCheckpoint(watch_.file()));
  }
  return parsed_;
}

}  // namespace efa::plugin
