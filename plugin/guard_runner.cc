// Withdrawing from the kubelet. The device-plugin API has no way to
// unregister a resource, so while the EFA DRA driver is present (policy
// yield) the daemon
//   - advertises an empty device list on the open ListAndWatch stream: the
//     kubelet sets capacity and allocatable to 0 at once, so no new pod is
//     given an EFA by this plugin, while pods already running keep theirs
//     (the kubelet never takes allocated devices back);
//   - keeps that stream open rather than ending it: an ended stream only
//     marks the devices unhealthy and leaves the capacity standing for the
//     kubelet's 5-minute grace period, and the kubelet logs it as a failure;
//   - does not register again (kubelet restart, stream ended, SIGHUP) until
//     the driver goes; after a kubelet restart the resource is gone from the
//     node altogether;
//   - registers again when it goes, which sends the full list on a fresh
//     stream.
// Policy protect (MOFED) keeps the resource registered and reports every EFA
// Unhealthy instead: allocatable drops to 0, capacity stays visible, and
// Allocate refuses the devices naming the conflict.
#include "plugin/guard_runner.h"

#include <sys/inotify.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"

namespace efa::plugin {
namespace fs = std::filesystem;
namespace {

std::string Evidence(const MofedReport& report) { return absl::StrJoin(report.evidence, "; "); }

}  // namespace

GuardRunner::GuardRunner(Options options) : options_(std::move(options)) {}

GuardVerdict GuardRunner::Check(bool have_devices, bool registered) {
  // The periodic pass (Daemon::PeriodicCheck) calls again; a DRA socket
  // that refuses is probed sooner (CheckDra).
  next_check_ = Clock::time_point::max();
  // A node without EFA has nothing to guard: no /proc scan, no watches. The
  // first EFA brings the first check, before serving.
  if (!have_devices) return {};
  WatchDirs();
  GuardStatus status;
  status.mofed_policy = options_.mofed_policy;
  status.dra_policy = options_.dra_policy;
  if (options_.mofed_policy != MofedPolicy::kOff) CheckMofed(status);
  CheckDra(status, registered);
  return Decide(std::move(status));
}

void GuardRunner::CheckMofed(GuardStatus& status) {
  if (!mofed_guard_) {
    // Kept: it remembers since when pod-resources leaves a container out.
    MofedGuard::Options mofed{options_.kubelet_dir / "device-plugins" / kCheckpointFile,
                              options_.cdi_spec_dirs, options_.proc_root,
                              options_.kubelet_dir / "device-plugins",
                              options_.kubelet_dir / "pod-resources/kubelet.sock"};
    mofed.time_box = options_.mofed_time_box;
    mofed_guard_ = std::make_unique<MofedGuard>(std::move(mofed));
  }
  status.mofed = mofed_guard_->Check(options_.clock->Now());
  if (!status.mofed.incomplete.empty()) {
    status.mofed = KeepLastVerdict(status.mofed);
  } else {
    mofed_incomplete_logged_ = false;
  }
  if (status.mofed.hints != mofed_hints_) {
    if (!status.mofed.hints.empty() && status.mofed.state != MofedState::kOn) {
      spdlog::warn(
          "{}. Not acted on: only a running container given MOFED (the kubelet checkpoint) "
          "or the NVIDIA plugin's process shows MOFED on",
          absl::StrJoin(status.mofed.hints, "; "));
    }
    mofed_hints_ = status.mofed.hints;
  }
  if (mofed_state_ != status.mofed.state) {
    LogMofedChange(status.mofed);
    mofed_state_ = status.mofed.state;
  }
}

MofedReport GuardRunner::KeepLastVerdict(const MofedReport& incomplete) {
  // A source stopped at a bound (time box, candidate cap, a file's size)
  // and showed nothing: the last verdict stands, Unknown before the first.
  MofedReport kept;
  {
    absl::MutexLock lock(&mu_);
    kept = status_.mofed;
  }
  if (!mofed_state_) {
    kept = incomplete;
    kept.state = MofedState::kUnknown;
  }
  kept.incomplete = incomplete.incomplete;
  if (!mofed_incomplete_logged_) {
    spdlog::warn("MOFED guard: {}; {}", kept.incomplete,
                 mofed_state_ ? fmt::format("the previous verdict ({}) stands",
                                            MofedStateName(*mofed_state_))
                              : std::string("no verdict yet (unknown)"));
    mofed_incomplete_logged_ = true;
  }
  return kept;
}

void GuardRunner::LogMofedChange(const MofedReport& report) {
  const bool protect = options_.mofed_policy == MofedPolicy::kProtect;
  if (report.state == MofedState::kOn) {
    spdlog::warn(
        "MOFED conflict: the NVIDIA device plugin gives every GPU container all "
        "/dev/infiniband/uverbs* devices, including EFAs allocated to other pods ({}). "
        "Remedy: {}. Policy {}: {}",
        Evidence(report), kMofedRemedy, MofedPolicyName(options_.mofed_policy),
        protect ? "every EFA is reported Unhealthy until the conflict clears"
                : "EFAs stay schedulable (--mofed-policy=protect stops offering them)");
  } else if (report.state == MofedState::kUnknown) {
    spdlog::warn(
        "cannot tell whether the NVIDIA device plugin has MOFED enabled ({}); EFAs stay "
        "schedulable",
        Evidence(report));
  } else if (mofed_state_ == MofedState::kOn) {
    spdlog::info("MOFED conflict cleared ({}){}", Evidence(report),
                 mofed_protect_ ? "; EFAs are offered again" : "");
  } else {
    spdlog::info("MOFED guard (policy {}): no conflict ({})",
                 MofedPolicyName(options_.mofed_policy), Evidence(report));
  }
}

void GuardRunner::CheckDra(GuardStatus& status, bool registered) {
  status.dra = DetectDraDrivers(options_.kubelet_dir / kPluginsRegistryDir, options_.dra_drivers);
  if (!status.dra.error.empty()) {
    // Not a complete look: the last answer stands. Before any, the driver
    // is taken as present, so that no EFA is given out twice.
    const bool present = dra_present_.value_or(true);
    if (!dra_incomplete_logged_) {
      spdlog::warn("DRA guard: {}; {} (counted in efa_device_plugin_dra_checks_incomplete_total)",
                   status.dra.error,
                   dra_present_ ? absl::StrCat("the last answer (driver ",
                                               present ? "present" : "absent", ") stands")
                                : std::string("no answer yet: taken as present"));
      dra_incomplete_logged_ = true;
    }
    status.dra.present = present;
    status.dra.evidence = status.dra.error;
    if (present) {
      absl::MutexLock lock(&mu_);
      status.dra.driver = status_.dra.driver.empty() ? absl::StrJoin(options_.dra_drivers, " or ")
                                                     : status_.dra.driver;
    }
  } else {
    if (dra_incomplete_logged_) {
      spdlog::info("DRA guard: {} can be read whole again",
                   (options_.kubelet_dir / kPluginsRegistryDir).string());
      dra_incomplete_logged_ = false;
    }
    HoldWithdrawal(status);
  }
  if (!status.dra.present && status.dra.refusing > 0) {
    // A driver binds its registration socket before it listens: the probe
    // at the bind is refused. Probe again soon, less often as it stays so.
    dra_reprobe_ = std::clamp(2 * dra_reprobe_, std::chrono::milliseconds(100),
                              std::max(options_.rescan_interval, std::chrono::milliseconds(100)));
    next_check_ = options_.clock->Now() + dra_reprobe_;
  } else {
    dra_reprobe_ = std::chrono::milliseconds(0);
  }
  if (dra_present_ == status.dra.present) return;
  if (options_.dra_policy == DraPolicy::kMonitor) {
    if (status.dra.present) {
      spdlog::info(
          "the EFA DRA driver ({}) serves this node's EFAs ({}); the DRA policy is monitor: {} is "
          "never registered here, the EFAs' health and traffic are exported",
          status.dra.driver, status.dra.evidence, options_.resource_name);
    } else {
      spdlog::warn(
          "the DRA policy is monitor but no EFA DRA driver serves this node's EFAs ({}): no pod "
          "can be given them until one registers ({} is never registered here)",
          status.dra.evidence, options_.resource_name);
    }
  } else if (status.dra.present && options_.dra_policy == DraPolicy::kYield) {
    spdlog::warn(
        "the EFA DRA driver ({}) serves this node's EFAs ({}): {} until it goes, so that no EFA "
        "is given out twice (--dra-policy=ignore serves anyway)",
        status.dra.driver, status.dra.evidence,
        registered
            ? absl::StrCat("withdrawing ", options_.resource_name, " (advertising no devices)")
            : absl::StrCat("not registering ", options_.resource_name));
  } else if (status.dra.present) {
    spdlog::warn(
        "the EFA DRA driver ({}) serves this node's EFAs ({}), and the DRA policy is ignore: "
        "still serving {}; the same EFA may be given to a DRA claim and to a pod",
        status.dra.driver, status.dra.evidence, options_.resource_name);
  } else if (dra_present_) {
    spdlog::info(
        "the EFA DRA driver is gone ({}){}", status.dra.evidence,
        dra_yield_ ? absl::StrCat("; registering ", options_.resource_name, " again") : "");
  } else {
    spdlog::debug("no EFA DRA driver: {}", status.dra.evidence);
  }
  dra_present_ = status.dra.present;
}

void GuardRunner::HoldWithdrawal(GuardStatus& status) {
  if (status.dra.present || !dra_yield_ || options_.dra_policy != DraPolicy::kYield) {
    dra_absent_since_.reset();
    dra_hold_logged_.clear();
    return;
  }
  // Both confirmed over the hold-down: the driver gone, and no claim held
  // (a kubelet just restarted may answer before it knows its pods). A
  // failed answer or a held claim starts the hold-down again.
  const Clock::time_point now = options_.clock->Now();
  const auto hold_down = kDraHoldDownRescans * options_.rescan_interval;
  std::string until;
  std::string why;  // the kind, logged once
  if (absl::StatusOr<int> held = DraClaimHolders(); !held.ok()) {
    why = "pod-resources";
    until = absl::StrCat("pod-resources answers (", held.status().message(), ")");
    dra_absent_since_ = now;
  } else if (*held > 0) {
    why = "claims";
    until = absl::StrCat("no container holds EFAs through a DRA claim (", *held, " do)");
    dra_absent_since_ = now;
  } else {
    if (!dra_absent_since_) dra_absent_since_ = now;
    if (now - *dra_absent_since_ < hold_down) {
      why = "hold-down";
      until = absl::StrCat("it has stayed gone for ",
                           absl::FormatDuration(absl::FromChrono(hold_down)));
      next_check_ = std::min(next_check_, *dra_absent_since_ + hold_down);
    }
  }
  if (until.empty()) {
    dra_absent_since_.reset();
    dra_hold_logged_.clear();
    return;
  }
  status.dra.present = true;
  status.dra.evidence = absl::StrCat(status.dra.evidence, "; ", options_.resource_name,
                                     " stays withdrawn until ", until);
  if (why != dra_hold_logged_) {
    spdlog::info("DRA guard: {}", status.dra.evidence);
    dra_hold_logged_ = why;
  }
}

absl::StatusOr<int> GuardRunner::DraClaimHolders() {
  if (!pod_resources_) {
    PodResourcesClient::Options options;
    options.clock = options_.clock;
    pod_resources_ = std::make_unique<PodResourcesClient>(
        options_.kubelet_dir / "pod-resources/kubelet.sock", options);
  }
  absl::StatusOr<v1::ListPodResourcesResponse> list = pod_resources_->List();
  if (!list.ok()) return list.status();
  auto efa_claim = [&](const v1::DynamicResource& claim) {
    if (claim.claim_resources().empty()) return true;
    for (const auto& r : claim.claim_resources()) {
      const auto& drivers = options_.dra_drivers;
      if (std::find(drivers.begin(), drivers.end(), r.driver_name()) != drivers.end()) return true;
    }
    return false;
  };
  int held = 0;
  for (const auto& pod : list->pod_resources()) {
    for (const auto& container : pod.containers()) {
      const auto& claims = container.dynamic_resources();
      held += std::any_of(claims.begin(), claims.end(), efa_claim);
    }
  }
  return held;
}

GuardVerdict GuardRunner::Decide(GuardStatus status) {
  const bool protect =
      options_.mofed_policy == MofedPolicy::kProtect && status.mofed.state == MofedState::kOn;
  const bool yield = options_.dra_policy == DraPolicy::kMonitor ||
                     (options_.dra_policy == DraPolicy::kYield && status.dra.present);
  GuardVerdict verdict;
  verdict.devices_changed = protect != mofed_protect_ || yield != dra_yield_;
  verdict.register_again = dra_yield_ && !yield;
  if (protect) {
    mofed_problem_ =
        absl::StrCat("the NVIDIA device plugin has MOFED enabled (policy protect): ",
                     status.mofed.evidence.empty() ? std::string() : status.mofed.evidence.front());
  }
  mofed_protect_ = protect;
  dra_yield_ = yield;
  status.efas_held_unhealthy = protect;
  status.withdrawn = yield;
  absl::MutexLock lock(&mu_);
  status.checks = status_.checks + 1;
  status.mofed_incomplete = status_.mofed_incomplete + !status.mofed.incomplete.empty();
  status.dra_incomplete = status_.dra_incomplete + !status.dra.error.empty();
  status_ = std::move(status);
  return verdict;
}

std::vector<topology::EfaDevice> GuardRunner::Apply(
    std::vector<topology::EfaDevice> devices) const {
  if (dra_yield_) return {};
  if (mofed_protect_) {
    for (topology::EfaDevice& d : devices) {
      if (d.healthy()) d.health_problem = mofed_problem_;
    }
  }
  return devices;
}

void GuardRunner::WatchDirs() {
  // The DRA driver's registration socket and the MOFED CDI spec come and
  // go in these; a directory created later is picked up by the periodic check.
  std::vector<fs::path> dirs = {options_.kubelet_dir / kPluginsRegistryDir};
  if (options_.mofed_policy != MofedPolicy::kOff) {
    dirs.insert(dirs.end(), options_.cdi_spec_dirs.begin(), options_.cdi_spec_dirs.end());
  }
  if (!options_.watches) return;
  for (const fs::path& dir : dirs) {
    bool watched = false;
    for (const auto& [wd, watched_dir] : watches_) watched |= watched_dir == dir.string();
    if (watched) continue;
    const InotifyWatches::Watch watch =
        options_.watches->Add(dir, IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM |
                                       IN_CLOSE_WRITE | IN_DELETE_SELF | IN_ONLYDIR | IN_MASK_ADD);
    if (watch.wd >= 0) watches_[watch.wd] = dir.string();
  }
}

bool GuardRunner::TakeWatchEvent(int wd, uint32_t mask) {
  if (!watches_.count(wd)) return false;
  if (mask & IN_IGNORED) watches_.erase(wd);
  return true;
}

GuardStatus GuardRunner::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

bool GuardRunner::WaitForStatusForTest(const std::function<bool(const GuardStatus&)>& pred,
                                       std::chrono::milliseconds timeout) const {
  struct Arg {
    const std::function<bool(const GuardStatus&)>* pred;
    const GuardStatus* status;
  };
  absl::MutexLock lock(&mu_);
  Arg arg{&pred, &status_};
  return mu_.AwaitWithTimeout(absl::Condition(
                                  +[](Arg* a) { return (*a->pred)(*a->status); }, &arg),
                              absl::Milliseconds(timeout.count()));
}

}  // namespace efa::plugin
