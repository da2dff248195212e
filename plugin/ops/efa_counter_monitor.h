// The EFAs' own counters (topology/efa_counters.h) turned into what an
// operator asks: how much each EFA, and each container holding EFAs, moves;
// which running containers' EFAs moved nothing for a while (NCCL or
// libfabric fell back to TCP); and, opt-in, which EFAs stopped working by
// the device's own account (docs/observability.md, "EFA traffic and device health").
//
// Reads happen only when asked (Sample(): a scrape, or the daemon's health
// check when device health is on), at most once per interval; in between
// the last read is answered. Idle detection and device health are judged at
// each read.
//
//   EfaCounterMonitor counters(options);
//   counters.SetDevices(inventory.devices);        // after each scan
//   auto snapshot = counters.Sample();             // on a scrape
//   auto problems = counters.HealthProblems();     // when listing devices
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "plugin/ops/api_server.h"
#include "plugin/runtime/clock.h"
#include "topology/efa_counters.h"
#include "topology/efa_device.h"
#include "topology/pci_address.h"

namespace efa::plugin {

// A device a container holds through a ResourceClaim (DRA), as the
// kubelet's pod-resources API names it (dynamic_resources).
struct DraDevice {
  std::string claim_name;
  std::string claim_namespace;
  std::string driver;
  std::string pool;
  std::string device;
  bool operator==(const DraDevice&) const = default;
};

// The name DRANET gives the device of PCI function `pci` in its
// ResourceSlices: "pci-" and the address with ':' and '.' replaced by '-'
// ("0000:10:1b.0" -> "pci-0000-10-1b-0"; kubernetes-sigs/dranet f258477,
// pkg/names/names.go NormalizePCIAddress, used for every PCI network device
// and standalone RDMA device in pkg/inventory/db.go). Pure.
std::string DraDeviceName(const topology::PciAddress& pci);

// A container and the physical EFAs it holds now.
struct EfaHolder {
  std::string pod_namespace;
  std::string pod;
  std::string container;
  std::vector<std::string> efas;  // ibdev names (in a snapshot: in PCI order)
  // The DRA devices it holds, as listed. In a snapshot: those that are one
  // of the node's EFAs (by DraDeviceName), their EFAs added to `efas`.
  std::vector<DraDevice> dra_devices = {};
  // In a snapshot: ibdev -> the claim's device it holds the EFA through.
  std::map<std::string, DraDevice> dra = {};
  std::string Name() const { return pod_namespace + "/" + pod + "/" + container; }
};

// Which containers hold EFAs now; an error when that cannot be told.
using EfaHoldersFn = std::function<absl::StatusOr<std::vector<EfaHolder>>()>;

// The devices ResourceClaim `claim_namespace`/`claim_name` was allocated
// (driver, pool and device; the claim's names left empty), found within
// `timeout`.
using ClaimDevicesFn = std::function<absl::StatusOr<std::vector<DraDevice>>(
    const std::string& claim_namespace, const std::string& claim_name,
    std::chrono::milliseconds timeout)>;

// The devices of a ResourceClaim object as the API server gives it (JSON,
// resource.k8s.io/v1): its status.allocation.devices.results, each as
// driver, pool and device. An error when it is not such an object or is
// not allocated. Pure.
absl::StatusOr<std::vector<DraDevice>> ClaimAllocation(std::string_view json);

// Device health from the counters (opt-in).
struct DeviceHealthOptions {
  bool enabled = false;
  // keep_alive_rcvd not advancing this long: Unhealthy.
  std::chrono::milliseconds keep_alive_timeout{60000};
  // cmds_err rising by this many between two reads: Unhealthy.
  int admin_errors = 10;
  // Healthy again only after this long without a problem.
  std::chrono::milliseconds hold_down{300000};
};

// What the configuration sets of the counters (docs/observability.md, "EFA
// traffic and device health"), with its defaults: DaemonOptions holds one.
struct EfaCounterSettings {
  // The least time between two reads of the counters.
  std::chrono::milliseconds interval{15000};
  // A held EFA that moved no bytes this long is idle.
  std::chrono::milliseconds idle_timeout{600000};
  DeviceHealthOptions health;
  // Look up, in the API server, the devices of a ResourceClaim the kubelet
  // lists without any (DRANET's), to give its containers per-container
  // series (docs/observability.md, "EFAs served by DRA"). Opt-in: it needs a
  // token allowed to get resourceclaims.
  bool claim_lookup = false;
  ApiServerSettings api_server;
  // What one read spends on claim lookups at most, in all. The scrape that
  // makes the read waits for them, so ToSettings makes it a third of
  // httpRequestTimeout (at most ApiServer::kTimeout): that scrape is still
  // answered in time when the API server does not answer.
  std::chrono::milliseconds claim_lookup_time{1000};
};

// The settings, and what the daemon gives the monitor.
struct EfaCounterMonitorOptions : EfaCounterSettings {
  std::filesystem::path sysfs_root;
  // Null: no per-container view and no idle detection.
  EfaHoldersFn holders;
  // The devices of a claim listed without any (ApiServerClaims when
  // claim_lookup is on). Null: such a claim's containers get no series.
  ClaimDevicesFn claim_devices;
  // Runs (on the reading thread, no lock held) when the EFAs device health
  // holds Unhealthy change. Null: nothing.
  std::function<void()> on_health_change;
  // The time reads, idle detection and device health count on. Not owned;
  // outlives the monitor.
  const Clock* clock = &Clock::Steady();
};

// One read of the counters and what was judged from it. Immutable.
struct EfaCounterSnapshot {
  struct Efa {
    topology::EfaDevice device;
    topology::EfaCounterValues counters;
    // Device health: why it holds this EFA Unhealthy ("" when it does
    // not), and the kind of problem: "keep_alive" or "admin_errors".
    std::string unhealthy;
    std::string unhealthy_kind;
  };
  struct Container {
    EfaHolder holder;
    std::vector<std::string> idle;  // its EFAs that moved no bytes for the idle timeout
  };
  std::vector<Efa> efas;  // as SetDevices gave them
  std::vector<Container> containers;
  int64_t reads = 0;  // reads of the counters since start
  // Counter files not read for a reason that says nothing about the device
  // (EfaCounterValues::unreadable), since start.
  int64_t unreadable_total = 0;
  // Reads whose question to pod-resources (holders) failed and kept the
  // containers known before, since start.
  int64_t holder_errors = 0;
  // Claim lookups (claim_devices) made and failed since start; both -1
  // when there is no claim lookup.
  int64_t claim_lookups = -1;
  int64_t claim_lookup_errors = -1;
};

class EfaCounterMonitor {
 public:
  explicit EfaCounterMonitor(EfaCounterMonitorOptions options);

  // The EFAs to read from now on: those present (found by the latest scan).
  // Thread-safe; never waits for a read.
  void SetDevices(std::vector<topology::EfaDevice> devices);

  // The counters, read now unless the latest read is younger than the
  // interval (then that one). The first call reads. Judges idle EFAs and,
  // when enabled, device health at each read, logging each change once.
  // Thread-safe: concurrent callers wait for one read, which with
  // claim_devices may spend up to claim_lookup_time on lookups.
  // `look_up_claims` false (a caller that must not wait on the API
  // server): no lookup, and no wait for a read another caller is making
  // (then the latest read is answered: null before the first); the next
  // call that allows lookups reads again at once when a claim was left
  // waiting.
  std::shared_ptr<const EfaCounterSnapshot> Sample(bool look_up_claims = true);

  // ibdev -> why device health holds it Unhealthy now (empty when disabled).
  // Thread-safe; never waits for a read.
  std::map<std::string, std::string> HealthProblems() const;

  // Holders from the kubelet's pod-resources API at `socket` (List, rate
  // limited): the containers holding EFAs (either resource name), their device IDs mapped to
  // physical EFAs by `physical` (nullopt: not bound yet, left out), and the
  // containers using ResourceClaims, with the claims' devices as listed
  // (Sample keeps those that are EFAs).
  static EfaHoldersFn PodResourcesHolders(
      const std::filesystem::path& socket,
      std::function<std::optional<std::vector<std::string>>(const std::vector<std::string>&)>
          physical);

  // Claim devices from the API server `settings` reach (ClaimAllocation of
  // GET /apis/resource.k8s.io/v1/namespaces/NS/resourceclaims/NAME).
  static ClaimDevicesFn ApiServerClaims(ApiServerSettings settings);

  // What one read looks up at most: kClaimLookupsPerRead claims (a node's
  // new pods'; the rest wait for the next read), in claim_lookup_time. A
  // failed lookup ends the read's lookups: an API server that is down
  // costs a read one timeout.
  static constexpr int kClaimLookupsPerRead = 8;

 private:
  // What one EFA's earlier reads left to judge the next by.
  struct EfaState {
    std::optional<uint64_t> bytes;  // tx_bytes + rx_bytes
    Clock::time_point moved;        // when `bytes` last changed (or was first read)
    std::optional<uint64_t> keep_alive;
    Clock::time_point keep_alive_moved;
    bool keep_alive_advanced = false;  // seen advancing at least once
    std::optional<uint64_t> cmds_err;
    std::optional<uint64_t> no_completion;
    std::string reported;                         // why it is held Unhealthy ("": it is not)
    std::string reported_kind;                    // "keep_alive", "admin_errors"
    std::optional<Clock::time_point> good_since;  // problem-free since (hold-down)
  };
  struct HolderState {
    std::map<std::string, Clock::time_point> since;  // EFA -> first seen held
    std::set<std::string> idle;                      // as last judged
  };

  Clock::time_point Now() const;
  // Sample's read, or the latest when it is younger than the interval;
  // `health_changed` set when device health changed.
  std::shared_ptr<const EfaCounterSnapshot> Read(bool look_up_claims, bool& health_changed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_);
  // Takes in the holders (options_.holders): the last known stay when
  // they cannot be listed, the failure counted and said once per kind.
  void ListHolders() ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_);
  // Judges one EFA's device health from a read; true when what is
  // reported changed.
  bool JudgeHealth(const std::string& ibdev, const topology::EfaCounterValues& values,
                   Clock::time_point now, EfaState& state) const;
  // Counts the snapshot's unreadable files (into unreadable_total) and logs
  // their cause once while it lasts, and when it ends.
  void NoteUnreadable(EfaCounterSnapshot& snapshot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_);
  // The holders' claimed DRA devices that are EFAs of `snapshot`, added to
  // their EFAs. A claim listed without devices gets its devices from
  // claim_devices (once while it is listed), or is logged once.
  // `look_up_claims` false: none looked up; `waiting` then says whether a
  // claim was left for a read that may.
  std::vector<EfaHolder> ResolveDra(std::vector<EfaHolder> holders, EfaCounterSnapshot& snapshot,
                                    bool look_up_claims, bool& waiting)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_);
  // What a read may still spend on claim lookups.
  struct LookupBudget {
    int lookups;
    std::chrono::steady_clock::time_point deadline;
  };
  // The devices of claim `listed` (listed without any) that `holder`'s pod
  // uses: known from an earlier read, or looked up now within `budget`;
  // null when unknown. What is known is kept in `known` (the claims listed
  // this read, by claim and pod).
  const std::vector<DraDevice>* ClaimDevices(const DraDevice& listed, const EfaHolder& holder,
                                             LookupBudget& budget,
                                             std::map<std::string, std::vector<DraDevice>>& known)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_);
  // Judges the idle EFAs of each holder and logs what changed.
  std::vector<EfaCounterSnapshot::Container> JudgeIdle(const std::vector<EfaHolder>& holders,
                                                       Clock::time_point now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_);

  const EfaCounterMonitorOptions options_;

  // Serializes reads; the state they judge by.
  absl::Mutex read_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::map<std::string, EfaState> efa_state_ ABSL_GUARDED_BY(read_mu_);        // by ibdev
  std::map<std::string, HolderState> holder_state_ ABSL_GUARDED_BY(read_mu_);  // by Name()
  std::vector<EfaHolder> holders_ ABSL_GUARDED_BY(read_mu_);                   // the last known
  int64_t holder_errors_ ABSL_GUARDED_BY(read_mu_) = 0;
  std::string holder_error_ ABSL_GUARDED_BY(read_mu_);  // the kind logged; "" while none
  int64_t unreadable_total_ ABSL_GUARDED_BY(read_mu_) = 0;
  std::string unreadable_cause_ ABSL_GUARDED_BY(read_mu_);  // as logged; "" while none
  // Claims listed without devices, as logged ("namespace/claim").
  std::set<std::string> deviceless_claims_ ABSL_GUARDED_BY(read_mu_);
  // Claims listed without devices whose devices were looked up, while listed
  // for the same pod: a claim deleted and made again under its name (for
  // another pod) is looked up again even with no read between.
  std::map<std::string, std::vector<DraDevice>> claim_devices_ ABSL_GUARDED_BY(read_mu_);
  int64_t claim_lookups_ ABSL_GUARDED_BY(read_mu_) = 0;
  int64_t claim_lookup_errors_ ABSL_GUARDED_BY(read_mu_) = 0;
  std::string claim_lookup_error_ ABSL_GUARDED_BY(read_mu_);  // the kind logged; "" while none

  mutable absl::Mutex mu_;
  std::vector<topology::EfaDevice> devices_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const EfaCounterSnapshot> latest_ ABSL_GUARDED_BY(mu_);
  Clock::time_point read_at_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> problems_ ABSL_GUARDED_BY(mu_);
  // The latest read left a claim unlooked-up (Sample(false)).
  bool claims_waiting_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace efa::plugin
