// The daemon's side of the guards: when they run, what they change in what
// the kubelet is told, and what is logged. Detection is in
// plugin/guards/mofed_guard.h and plugin/guards/dra_guard.h.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "plugin/guards/dra_guard.h"
#include "plugin/guards/mofed_guard.h"
#include "plugin/inotify_watches.h"
#include "plugin/kubelet/pod_resources_client.h"
#include "plugin/runtime/clock.h"
#include "plugin/runtime/host_paths.h"
#include "topology/efa_device.h"

namespace efa::plugin {

// What the guards found at their latest check, for logs, metrics and
// readiness.
struct GuardStatus {
  MofedPolicy mofed_policy = MofedPolicy::kWarn;
  // Off with no findings while the policy is off.
  MofedReport mofed;
  // Policy protect and MOFED on: every EFA is reported Unhealthy.
  bool efas_held_unhealthy = false;
  DraPolicy dra_policy = DraPolicy::kYield;
  DraReport dra;
  // Policy yield and the DRA driver present, or policy monitor: the
  // resource is withdrawn (an empty device list, no registration).
  bool withdrawn = false;
  // Checks done so far (at start, on changes, periodically).
  int checks = 0;
  // MOFED checks that stopped at a bound (MofedReport::incomplete) and kept
  // the previous verdict.
  int mofed_incomplete = 0;
  // DRA guard checks that could not look whole (dra.error) and kept the
  // last answer.
  int dra_incomplete = 0;
};

// What a check asks of the daemon. The runner changes nothing outside
// itself: the daemon rescans, publishes and registers.
struct GuardVerdict {
  // The EFAs are now held Unhealthy or withdrawn, or no longer are: the
  // devices to advertise changed (the daemon rescans and publishes).
  bool devices_changed = false;
  // The resource was withdrawn and no longer is: register again now.
  bool register_again = false;
};

// What the configuration sets of the guards (docs/guards.md), with its
// defaults: DaemonOptions holds one.
struct GuardSettings {
  // What to do when the NVIDIA device plugin has MOFED on, and while the
  // EFA DRA driver serves the node.
  MofedPolicy mofed_policy = MofedPolicy::kWarn;
  // How long one MOFED check may scan /proc (MofedGuard::Options).
  std::chrono::milliseconds mofed_time_box = kMofedCheckTimeBox;
  DraPolicy dra_policy = DraPolicy::kYield;
  // The DRA drivers that hand out EFAs, by the name they register under.
  std::vector<std::string> dra_drivers = {kDraDriverName};
  // Where the NVIDIA MOFED CDI spec may be (host paths, like the roots).
  std::vector<std::filesystem::path> cdi_spec_dirs = {kStaticCdiDir, kRuntimeCdiDir};
};

// Runs the MOFED and DRA guards for the owner loop. Owner thread only,
// except status() and WaitForStatusForTest().
class GuardRunner {
 public:
  // The settings, and what the daemon gives every part (no defaults here).
  struct Options : GuardSettings {
    std::filesystem::path kubelet_dir;
    std::filesystem::path proc_root;
    // The periodic pass's interval: the longest delay of a DRA re-probe.
    std::chrono::milliseconds rescan_interval{};
    std::string resource_name;  // for the logs
    const Clock* clock = &Clock::Steady();
    // The owner loop's inotify instance (not owned, may be null): the
    // guards' directories are watched on it; those it cannot watch are
    // looked at by the periodic check only.
    InotifyWatches* watches = nullptr;
  };

  explicit GuardRunner(Options options);
  // How many rescans a DRA driver must stay gone before the resource is
  // offered again (HoldWithdrawal).
  static constexpr int kDraHoldDownRescans = 3;

  // Runs the guards, logs what changed and publishes status(). A node
  // without EFA (`have_devices` false) has nothing to guard: nothing runs.
  // `registered`: whether the resource is registered now (for the logs).
  GuardVerdict Check(bool have_devices, bool registered);
  // The devices as the guards let them be advertised.
  std::vector<topology::EfaDevice> Apply(std::vector<topology::EfaDevice> devices) const;
  // Whether the resource is withdrawn (the DRA driver serves the node): no
  // device is advertised and no registration made.
  bool withdrawn() const { return dra_yield_; }
  // When a check is due sooner than the periodic pass (a DRA registration
  // socket to probe again), else time_point::max().
  Clock::time_point next_check() const { return next_check_; }
  // Whether inotify watch `wd` is one of the guards' (forgotten once the
  // kernel dropped it, `mask` having IN_IGNORED).
  bool TakeWatchEvent(int wd, uint32_t mask);
  // A registration socket may have appeared: probe at once and, should it
  // refuse, again soon.
  void ProbeDraSoon() { dra_reprobe_ = std::chrono::milliseconds(0); }

  // The latest findings. Thread-safe.
  GuardStatus status() const;
  // Blocks until `pred` holds for status() or `timeout` passes; returns
  // whether it held. `pred` runs under an internal lock. Thread-safe.
  bool WaitForStatusForTest(const std::function<bool(const GuardStatus&)>& pred,
                            std::chrono::milliseconds timeout) const;

 private:
  void WatchDirs();
  // The MOFED guard's findings into `status`, logging what changed.
  void CheckMofed(GuardStatus& status);
  // An incomplete MOFED check's report: the previous verdict, Unknown
  // before the first.
  MofedReport KeepLastVerdict(const MofedReport& incomplete);
  void LogMofedChange(const MofedReport& report);
  // The DRA guard's findings into `status`, logging what changed.
  void CheckDra(GuardStatus& status, bool registered);
  // Under yield, a driver that was present and looks gone keeps the
  // resource withdrawn (status.dra.present) until, for kDraHoldDownRescans
  // rescans, it has stayed gone and pod-resources has listed no container
  // holding EFAs through a DRA claim: a driver's restart (its socket deleted and made again) and
  // the DRA pods still running never see an EFA offered twice.
  void HoldWithdrawal(GuardStatus& status);
  // Containers that pod-resources lists holding a claim of draDrivers, or
  // a claim without devices (DRANET's, whose driver it does not name).
  absl::StatusOr<int> DraClaimHolders();
  // What the findings ask of the daemon; records them as the runner's
  // state and publishes `status`.
  GuardVerdict Decide(GuardStatus status);

  const Options options_;
  std::unique_ptr<MofedGuard> mofed_guard_;  // from the first check on
  std::optional<MofedState> mofed_state_;
  std::vector<std::string> mofed_hints_;  // as last logged
  bool mofed_incomplete_logged_ = false;  // since the last complete check
  std::optional<bool> dra_present_;
  std::optional<Clock::time_point> dra_absent_since_;  // while withdrawal is held
  std::string dra_hold_logged_;                        // why it is held, as logged
  std::unique_ptr<PodResourcesClient> pod_resources_;  // from the first hold on
  bool dra_incomplete_logged_ = false;                 // since the last complete look
  bool dra_yield_ = false;      // withdrawn: the DRA driver present, or policy monitor
  bool mofed_protect_ = false;  // every EFA held Unhealthy
  std::string mofed_problem_;   // their health problem meanwhile
  // A check sooner than the periodic one (a DRA socket to probe again).
  Clock::time_point next_check_ = Clock::time_point::max();
  // While a DRA registration socket refuses connections: the delay of the
  // next probe (doubling from 100 ms), since a driver binds its socket
  // before it listens and nothing signals the listen().
  std::chrono::milliseconds dra_reprobe_{0};
  std::map<int, std::string> watches_;  // inotify wd -> plugins_registry, CDI dirs
  mutable absl::Mutex mu_;
  GuardStatus status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace efa::plugin
