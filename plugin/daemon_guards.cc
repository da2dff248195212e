// The daemon's side of the guards: when they run, what they change in what
// the kubelet is told, and what is logged. Detection is in mofed_guard.h
// and dra_guard.h.
//
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
#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "plugin/daemon.h"
#include "spdlog/spdlog.h"

namespace efa::plugin {
namespace {

std::string Evidence(const MofedReport& report) { return absl::StrJoin(report.evidence, "; "); }

}  // namespace

bool Daemon::CheckGuards() {
  // The periodic pass (PeriodicCheck) calls again; a DRA socket that
  // refuses is probed sooner (below).
  next_guard_check_ = std::chrono::steady_clock::time_point::max();
  // A node without EFA has nothing to guard: no /proc scan, no watches. The
  // first EFA brings the first check, before serving.
  if (known_.empty()) return false;
  WatchGuardDirs();
  GuardStatus status;
  status.mofed_policy = options_.mofed_policy;
  status.dra_policy = options_.dra_policy;

  if (options_.mofed_policy != MofedPolicy::kOff) {
    if (!mofed_guard_) {
      // Kept: it remembers since when pod-resources leaves a container out.
      MofedGuard::Options mofed{options_.kubelet_dir / "device-plugins" / kCheckpointFile,
                                options_.cdi_spec_dirs, options_.roots.proc,
                                options_.kubelet_dir / "device-plugins",
                                options_.kubelet_dir / "pod-resources/kubelet.sock"};
      mofed.time_box = options_.mofed_time_box;
      mofed_guard_ = std::make_unique<MofedGuard>(std::move(mofed));
    }
    status.mofed = mofed_guard_->Check(options_.clock->Now());
    if (!status.mofed.incomplete.empty()) {
      // A source stopped at a bound (time box, candidate cap, a file's
      // size) and showed nothing: the last verdict stands, Unknown before
      // the first.
      MofedReport kept;
      {
        absl::MutexLock lock(&guard_mu_);
        kept = guard_status_.mofed;
      }
      if (!mofed_state_) {
        kept = status.mofed;
        kept.state = MofedState::kUnknown;
      }
      kept.incomplete = status.mofed.incomplete;
      if (!mofed_incomplete_logged_) {
        spdlog::warn("MOFED guard: {}; {}", kept.incomplete,
                     mofed_state_ ? fmt::format("the previous verdict ({}) stands",
                                                MofedStateName(*mofed_state_))
                                  : std::string("no verdict yet (unknown)"));
        mofed_incomplete_logged_ = true;
      }
      status.mofed = std::move(kept);
    } else {
      mofed_incomplete_logged_ = false;
    }
    const MofedState state = status.mofed.state;
    if (status.mofed.hints != mofed_hints_) {
      if (!status.mofed.hints.empty() && state != MofedState::kOn) {
        spdlog::warn(
            "{}. Not acted on: only a running container given MOFED (the kubelet checkpoint) "
            "or the NVIDIA plugin's process shows MOFED on",
            absl::StrJoin(status.mofed.hints, "; "));
      }
      mofed_hints_ = status.mofed.hints;
    }
    if (mofed_state_ != state) {
      const bool protect = options_.mofed_policy == MofedPolicy::kProtect;
      if (state == MofedState::kOn) {
        spdlog::warn(
            "MOFED conflict: the NVIDIA device plugin gives every GPU container all "
            "/dev/infiniband/uverbs* devices, including EFAs allocated to other pods ({}). "
            "Remedy: {}. Policy {}: {}",
            Evidence(status.mofed), kMofedRemedy, MofedPolicyName(options_.mofed_policy),
            protect ? "every EFA is reported Unhealthy until the conflict clears"
                    : "EFAs stay schedulable (--mofed-policy=protect stops offering them)");
      } else if (state == MofedState::kUnknown) {
        spdlog::warn(
            "cannot tell whether the NVIDIA device plugin has MOFED enabled ({}); EFAs stay "
            "schedulable",
            Evidence(status.mofed));
      } else if (mofed_state_ == MofedState::kOn) {
        spdlog::info("MOFED conflict cleared ({}){}", Evidence(status.mofed),
                     mofed_protect_ ? "; EFAs are offered again" : "");
      } else {
        spdlog::info("MOFED guard (policy {}): no conflict ({})",
                     MofedPolicyName(options_.mofed_policy), Evidence(status.mofed));
      }
      mofed_state_ = state;
    }
  }

  status.dra = DetectDraDrivers(options_.kubelet_dir / kPluginsRegistryDir, options_.dra_drivers);
  if (!status.dra.present && status.dra.refusing > 0) {
    // A driver binds its registration socket before it listens: the probe
    // at the bind is refused. Probe again soon, less often as it stays so.
    dra_reprobe_ = std::clamp(2 * dra_reprobe_, std::chrono::milliseconds(100),
                              std::max(options_.rescan_interval, std::chrono::milliseconds(100)));
    next_guard_check_ = options_.clock->Now() + dra_reprobe_;
  } else {
    dra_reprobe_ = std::chrono::milliseconds(0);
  }
  if (dra_present_ != status.dra.present) {
    if (status.dra.present && options_.dra_policy == DraPolicy::kYield) {
      spdlog::warn(
          "the EFA DRA driver ({}) serves this node's EFAs ({}): {} until it goes, so that no EFA "
          "is given out twice (--dra-policy=ignore serves anyway)",
          status.dra.driver, status.dra.evidence,
          registrar_.registered()
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

  const bool protect =
      options_.mofed_policy == MofedPolicy::kProtect && status.mofed.state == MofedState::kOn;
  const bool yield = options_.dra_policy == DraPolicy::kYield && status.dra.present;
  const bool changed = protect != mofed_protect_ || yield != dra_yield_;
  if (protect) {
    mofed_problem_ =
        absl::StrCat("the NVIDIA device plugin has MOFED enabled (policy protect): ",
                     status.mofed.evidence.empty() ? std::string() : status.mofed.evidence.front());
  }
  if (dra_yield_ && !yield) {
    registrar_.RegisterAgainNow(Registrar::Reason::kDraDriverGone);
  }
  mofed_protect_ = protect;
  dra_yield_ = yield;
  status.efas_held_unhealthy = protect;
  status.withdrawn = yield;
  absl::MutexLock lock(&guard_mu_);
  status.checks = guard_status_.checks + 1;
  status.mofed_incomplete = guard_status_.mofed_incomplete + !status.mofed.incomplete.empty();
  guard_status_ = std::move(status);
  return changed;
}

std::vector<topology::EfaDevice> Daemon::ApplyGuards(
    std::vector<topology::EfaDevice> devices) const {
  if (dra_yield_) return {};
  if (mofed_protect_) {
    for (topology::EfaDevice& d : devices) {
      if (d.healthy()) d.health_problem = mofed_problem_;
    }
  }
  return devices;
}

GuardStatus Daemon::guard_status() const {
  absl::MutexLock lock(&guard_mu_);
  return guard_status_;
}

bool Daemon::WaitForGuardStatusForTest(const std::function<bool(const GuardStatus&)>& pred,
                                       std::chrono::milliseconds timeout) const {
  struct Arg {
    const std::function<bool(const GuardStatus&)>* pred;
    const GuardStatus* status;
  };
  absl::MutexLock lock(&guard_mu_);
  Arg arg{&pred, &guard_status_};
  return guard_mu_.AwaitWithTimeout(absl::Condition(
                                        +[](Arg* a) { return (*a->pred)(*a->status); }, &arg),
                                    absl::Milliseconds(timeout.count()));
}

}  // namespace efa::plugin
