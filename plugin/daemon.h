// The daemon's owner loop: discover, serve, register, watch, re-register.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "plugin/alignment/aligner.h"
#include "plugin/alignment/late_binder.h"
#include "plugin/device_plugin_service.h"
#include "plugin/device_tracker.h"
#include "plugin/guard_runner.h"
#include "plugin/inotify_watches.h"
#include "plugin/ops/efa_counter_monitor.h"
#include "plugin/registrar.h"
#include "plugin/rpc_observer.h"
#include "plugin/runtime/clock.h"
#include "plugin/runtime/event_loop.h"
#include "plugin/runtime/host_paths.h"
#include "topology/sysfs.h"

namespace efa::plugin {

enum class AlignmentMode {
  kBestEffort,   // pod-resources at admission, else prediction (default)
  kLateBinding,  // decide at PreStartContainer through CDI
  kOff,
};

// Every default of the daemon's options is here or in the part's settings it
// holds (GuardSettings, EfaCounterSettings, LateBinderOptions,
// topology::HostRoots, plugin/runtime/host_paths.h); the configuration's
// defaults are read from them (plugin/config.cc, DefaultConfig).
struct DaemonOptions {
  topology::HostRoots roots;
  std::filesystem::path kubelet_dir = kDefaultKubeletDir;
  bool report_numa = true;
  // Fallback rescan for hosts where neither uevents nor inotify report a
  // change (a pod without the host's network namespace gets no uevents).
  std::chrono::milliseconds rescan_interval{10000};
  // A full rescan at least this often, whatever the uevent count says: no
  // state the periodic pass missed outlives its cause on a quiet node.
  std::chrono::milliseconds full_rescan_interval{300000};
  // Take SIGTERM/SIGINT (stop), SIGHUP (rescan and re-register) and
  // SIGCHLD (reap orphans, as PID 1 only: plugin/runtime/orphan_reaper.h)
  // through a signalfd; the caller must have blocked them in every thread.
  bool handle_signals = false;
  // The PCI tree: an hwloc XML file, else hwloc reads the host (the parent
  // of roots.sysfs when that is a simulated ".../sys").
  std::string topology_xml;
  // The instance type, e.g. "p5.48xlarge"; empty: the DMI product name.
  std::string instance_type;
  // How EFAs are aligned with the admitted container's accelerators
  // (docs/alignment.md).
  AlignmentMode alignment = AlignmentMode::kBestEffort;
  AcceleratorResources accelerator_resources;
  // Where late binding writes its CDI specs (a host path the runtime reads).
  std::filesystem::path cdi_dir = kRuntimeCdiDir;
  // How long a late binding's container must stay absent from the kubelet's
  // records before the binding is released (LateBinderOptions).
  std::chrono::milliseconds late_release_after = LateBinderOptions().release_after;
  // While bindings exist, how often the kubelet's records are read again
  // (LateBinderOptions).
  std::chrono::milliseconds late_recheck_every = LateBinderOptions().recheck_every;
  // How late binding's Allocate answer names the CDI device.
  CdiHandover cdi_handover = CdiHandover::kBoth;
  // Guards (docs/guards.md).
  GuardSettings guards;
  // Sharing (docs/alignment.md, "Sharing"): device IDs per EFA, and the resource name.
  int replicas = 1;
  std::string resource_name = kResourceName;
  // The EFAs' own counters (docs/observability.md, "EFA traffic and device
  // health"): device health from them is opt-in; then the owner loop reads
  // them every counters.interval.
  EfaCounterSettings counters;
  // Observability hooks (not owned; may be null): told of every unary RPC
  // the service handles, and of every inventory a rescan finds (on the
  // owner thread; must be quick).
  RpcObserver* rpc_observer = nullptr;
  std::function<void(const topology::Inventory&)> on_inventory;
  // Called once on the owner thread when the first scan finds no EFA,
  // before the daemon idles in its loop: the binary execs the idle process
  // here (it returns only when it could not).
  std::function<void()> on_idle;
  // The time the owner loop and the monitor read (not owned; tests pass a
  // fake one and call Daemon::Wake() after moving it on).
  const Clock* clock = &Clock::Steady();
};

// Runs the plugin. One owner thread (the caller of Run) does all lifecycle
// work; gRPC threads only read the service's immutable snapshots.
class Daemon {
 public:
  explicit Daemon(DaemonOptions options);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Blocks until Stop() or a stop signal. Returns the process exit code:
  // 0 after a clean stop (streams closed, socket removed), 1 when its
  // event loop cannot be opened (eventfd). A plugin socket that cannot be
  // served is retried with the registration; without inotify (or a watch)
  // the daemon runs on its timers (InotifyWatches).
  int Run();
  // Asks Run() to return. Thread-safe, async-signal-unsafe.
  void Stop();
  // Makes the owner loop run a pass now, reading the clock again (after a
  // fake clock moved on). Thread-safe.
  void Wake();
  // The clock of DaemonOptions. Thread-safe.
  const Clock& clock() const { return *options_.clock; }

  // Successful registrations with the kubelet so far. Thread-safe.
  int registrations() const { return registrar_.registrations(); }
  // Times kubelet.sock was created again after a first registration (the
  // kubelet restarted). Thread-safe.
  int kubelet_restarts() const { return registrar_.kubelet_restarts(); }
  // When the owner loop last finished a pass (it then waits up to the
  // rescan interval), or nullopt before Run() got that far. Thread-safe.
  std::optional<Clock::time_point> heartbeat() const;
  // Whether the resource is registered with the kubelet now, and how many
  // EFAs the daemon knows (listed to the kubelet unless withdrawn), as of
  // the latest heartbeat. Thread-safe.
  bool registered() const { return registered_now_.load(); }
  // Whether another device plugin serves its socket, so that it neither
  // serves nor registers (Registrar::StartServer), as of the latest
  // heartbeat. Thread-safe.
  bool standing_aside() const { return standing_aside_now_.load(); }
  int known_devices() const { return known_devices_.load(); }
  // The resource it registers (vpc.amazonaws.com/efa, or .shared when
  // sharing renames it). Thread-safe.
  const std::string& resource_name() const { return options_.resource_name; }
  // Listings ("list") and device reads ("read") that failed, since start,
  // for a reason that says nothing about the devices (out of descriptors or
  // memory: topology::DiscoveryError). Thread-safe.
  using DiscoveryErrorCounts = DeviceTracker::DiscoveryErrorCounts;
  DiscoveryErrorCounts discovery_errors() const { return tracker_.discovery_errors(); }
  // The directories the daemon cannot watch with inotify now (the kernel
  // refused, or gave no instance): the periodic pass looks at them instead.
  // Thread-safe.
  int watches_unavailable() const { return watches_.unavailable(); }
  // Whether the RDMA subsystem was in exclusive network namespace mode at
  // the latest look that could tell (topology::ReadRdmaNetnsShared).
  bool rdma_netns_exclusive() const { return rdma_netns_exclusive_.load(); }
  // Reads of that mode that failed (not a missing ib_core), since start.
  int64_t rdma_netns_read_errors() const { return rdma_netns_read_errors_.load(); }
  // Entries of the kubelet checkpoint skipped at its latest read because
  // they could not be parsed. Thread-safe.
  int checkpoint_entries_skipped() const { return checkpoint_entries_skipped_.load(); }
  // The device list the kubelet is given now. Thread-safe.
  v1beta1::ListAndWatchResponse advertised() const { return service_.CurrentList(); }
  // Alignment counters, or null when alignment is off. Thread-safe.
  const AlignmentStats* alignment_stats() const { return aligner_ ? &aligner_->stats() : nullptr; }
  // The late-binding state: bindings of this configuration or of an
  // earlier one (LateBinder). Thread-safe.
  const LateBinder* late_binder() const { return late_binder_.get(); }
  // The EFAs held under an earlier configuration and so given to no new
  // container (LateBinder::Reserved). Thread-safe.
  // Late bindings held under the EFA resource name not served now
  // (LateBinder::BoundUnderOtherName). Thread-safe.
  int bound_under_other_name() const { return bound_under_other_name_.load(); }
  std::set<std::string> reserved_efas() const {
    absl::MutexLock lock(&reserved_mu_);
    return reserved_efas_;
  }
  // The EFAs' counters, read when sampled. Thread-safe.
  EfaCounterMonitor& efa_counters() const { return *counters_; }
  std::filesystem::path plugin_socket() const { return registrar_.plugin_socket(); }
  std::filesystem::path kubelet_socket() const { return registrar_.kubelet_socket(); }
  // The guards' latest findings. Thread-safe.
  GuardStatus guard_status() const { return guards_.status(); }
  // Blocks until `pred` holds for the guard status or `timeout` passes;
  // returns whether it held. `pred` runs under an internal lock.
  bool WaitForGuardStatusForTest(const std::function<bool(const GuardStatus&)>& pred,
                                 std::chrono::milliseconds timeout) const {
    return guards_.WaitForStatusForTest(pred, timeout);
  }

 private:
  struct Fds;
  // A file as stat() tells it apart from another at the same path.
  struct FileIdentity {
    bool present = false;
    dev_t dev = 0;
    ino_t ino = 0;
    int64_t ctime_sec = 0;
    int64_t ctime_nsec = 0;
    bool operator==(const FileIdentity&) const = default;
  };
  // `path`'s identity; absent on ENOENT and ENOTDIR, nullopt on another
  // error (which says nothing about the file).
  static std::optional<FileIdentity> Identify(const std::filesystem::path& path);
  // Reads the RDMA subsystem's network namespace mode; logs a change.
  void LookAtRdmaNetnsMode();
  // Whether the registration in effect reached this kubelet.sock.
  bool RegisteredTo(const std::optional<FileIdentity>& kubelet_socket) const;
  // The constructor's parts: the counters' options, and the aligner and
  // late binder the alignment mode asks for.
  EfaCounterMonitorOptions CounterOptions();
  void SetUpAlignment();
  // The periodic pass: guards, the device tracker's look, the alignment
  // report if the checkpoint changed.
  void PeriodicCheck();
  // Judges the containers admitted since (Aligner::Report); `periodic`:
  // only if the checkpoint changed since the last report.
  void ReportAlignment(bool periodic = false);
  bool late_binding() const { return options_.alignment == AlignmentMode::kLateBinding; }
  // Releases the bindings confirmed gone, schedules the next look at those
  // still being confirmed, and advertises the EFAs reserved now.
  void ReleaseGone();
  // Takes HeldMissing() when it could be read, logging each EFA newly listed
  // so; returns whether it changed (then the caller publishes).
  bool UpdateHeldMissing();
  // Reads the bindings back from the CDI dir (LateBinder::Recover): before
  // the first registration, and again at each periodic pass until whole.
  void RecoverBindings();
  // The physical EFAs of the kubelet's device IDs `ids` of one container:
  // the late-binding bindings (nullopt while not bound), else the IDs'
  // EFAs (replicas mapped to their EFA). Thread-safe.
  std::optional<std::vector<std::string>> PhysicalEfas(const std::vector<std::string>& ids) const;
  // The EFAs a container holding `ids` of the EFA resource has, for its
  // traffic: as PhysicalEfas, but an ID not bound by late binding names its
  // EFA by itself (its ibdev, or a replica's), whatever is advertised now.
  // Thread-safe.
  std::optional<std::vector<std::string>> HeldEfas(const std::vector<std::string>& ids) const;
  // The EFAs of the resource served that the kubelet's checkpoint says a
  // container holds and that this process has not found (ibdev -> why);
  // nullopt when the checkpoint cannot be read (nothing is concluded). None
  // with late binding (the kubelet's IDs there are tokens, not EFAs).
  std::optional<std::map<std::string, std::string>> HeldMissing() const;
  // Run()'s steps. Opens the loop, the uevent socket and watches the
  // device-plugins dir; false (logged) when the loop cannot watch.
  bool OpenEventSources();
  // The loop's timers, in the order they run after a wait: guards,
  // alignment report, late-binding release, counter reads, publishing a
  // health change, the periodic pass.
  void AddTimers();
  // The first scan, the first heartbeat, late binding's recovery.
  void Start();
  // Registers again when the kubelet ended the stream of the registration
  // that stands.
  void TakeStreamEnd();
  // Once, when a complete first scan finds no EFA: the on_idle hook.
  void AnnounceIdle();
  // With an EFA known: serves from the first one on, and registers when an
  // attempt is due.
  void ServeAndRegister();
  // When the next registration attempt is due, or never while none is to
  // be made (the loop wakes for it; the next pass makes it).
  Clock::time_point NextRegistration() const;
  // SIGHUP: rescans and registers again.
  void Hangup();
  // Registers unless the guards withhold the resource or there is no
  // kubelet, after taking in the queued events and probing the guards.
  void TryRegister();
  void HandleInotify();
  // Creates the inotify instance and watches the device-plugins dir, when
  // not done yet (at start, then on each periodic pass while they fail).
  void WatchKubeletDir();
  // On timers (the device-plugins dir not watched): what its events would
  // have said, a kubelet.sock other than at the previous look (created
  // again: the kubelet restarted).
  void LookForKubeletSocket();
  // On every periodic pass: our socket deleted (inotify sees only its
  // directory, not the socket in it).
  void LookForPluginSocket();
  // Publishes the heartbeat and the state read by other threads.
  void Heartbeat();
  // Runs the guards and applies their verdict: registers again when they
  // stop withholding the resource. Returns whether the devices to
  // advertise changed (the caller rescans).
  bool CheckGuards();

  const DaemonOptions options_;
  EventLoop loop_;  // Wake() and Stop() come from any thread
  std::unique_ptr<Fds> fds_;
  InotifyWatches watches_;  // before guards_ and tracker_, which watch on it
  DevicePluginService service_;
  Registrar registrar_;  // after service_, which it serves
  GuardRunner guards_;
  std::unique_ptr<Aligner> aligner_;  // null when alignment is off
  std::unique_ptr<LateBinder> late_binder_;
  std::unique_ptr<EfaCounterMonitor> counters_;
  DeviceTracker tracker_;                    // after what it publishes to
  std::atomic<bool> health_changed_{false};  // device health from the counters changed
  std::atomic<bool> report_requested_{false};
  std::atomic<bool> stream_ended_{false};
  std::atomic<bool> rdma_netns_exclusive_{false};
  std::atomic<int64_t> rdma_netns_read_errors_{0};
  std::string rdma_netns_read_error_;     // as logged; "" while the mode reads (owner thread)
  std::atomic<int64_t> heartbeat_ns_{0};  // clock(); 0: none yet
  std::atomic<bool> registered_now_{false};
  std::atomic<bool> standing_aside_now_{false};
  std::atomic<int> known_devices_{0};
  std::atomic<int> checkpoint_entries_skipped_{0};
  std::atomic<int> bound_under_other_name_{0};
  mutable absl::Mutex reserved_mu_;
  std::set<std::string> reserved_efas_ ABSL_GUARDED_BY(reserved_mu_);

  // Owner-thread state.
  Clock::time_point next_periodic_;
  Clock::time_point next_health_read_;                                  // with device health only
  bool serving_started_ = false;                                        // the first EFA was seen
  bool announced_idle_ = false;                                         // AnnounceIdle() ran
  std::shared_ptr<const CheckpointCache::Result> reported_checkpoint_;  // judged up to
  Clock::time_point next_report_ =                                      // alignment report retry
      Clock::time_point::max();
  std::chrono::milliseconds report_backoff_{0};                // doubles while reports fail
  Clock::time_point next_release_ = Clock::time_point::max();  // late binding: confirm a release
  int kubelet_watch_ = -1;  // the device-plugins dir; -1: on timers
  // kubelet.sock at the latest look on timers (none before the first).
  std::optional<FileIdentity> kubelet_socket_seen_;
  // The kubelet.sock the registration in effect reached (none: cannot
  // tell). inotify may report its creation after that registration, when
  // the kubelet created it between the look at queued events and the
  // connection: that report is no restart.
  std::optional<FileIdentity> registered_to_;
  std::map<std::string, std::string> reserved_;      // LateBinder::Reserved, advertised
  std::map<std::string, std::string> held_missing_;  // HeldMissing(), advertised
};

}  // namespace efa::plugin
