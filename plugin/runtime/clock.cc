#include "plugin/runtime/clock.h"

namespace efa::plugin {

const Clock& Clock::Steady() {
  class SteadyClock final : public Clock {
   public:
    time_point Now() const override { return std::chrono::steady_clock::now(); }
  };
  static const SteadyClock steady;
  return steady;
}

}  // namespace efa::plugin
