// The EFAs as the owner loop knows them: discovering them, keeping every
// EFA once seen (listed Unhealthy while gone), the host model built from
// them, and publishing them to the service.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "plugin/device_plugin_service.h"
#include "plugin/guard_runner.h"
#include "plugin/inotify_watches.h"
#include "plugin/ops/efa_counter_monitor.h"
#include "plugin/runtime/clock.h"
#include "topology/efa_discovery.h"
#include "topology/host_model.h"
#include "topology/sysfs.h"

namespace efa::plugin {

// Owner thread only, except discovery_errors(), which is thread-safe.
class DeviceTracker {
 public:
  struct Options {
    topology::HostRoots roots;
    // The PCI tree: an hwloc XML file, else hwloc reads the host (the
    // parent of roots.sysfs when that is a simulated ".../sys").
    std::string topology_xml;
    // The instance type for the model; empty: the DMI product name.
    std::string instance_type;
    // A full rescan at least this often, whatever the uevent count says
    // (given by the daemon: DaemonOptions holds the default).
    std::chrono::milliseconds full_rescan_interval{};
    // Told of every inventory a rescan finds (may be null; must be quick).
    std::function<void(const topology::Inventory&)> on_inventory;
    const Clock* clock = &Clock::Steady();
    // The owner loop's inotify instance (not owned, may be null): the
    // device directories are watched on it.
    InotifyWatches* watches = nullptr;
    // The EFAs held by containers the kubelet does not count against them
    // (ibdev -> why; LateBinder::Reserved): advertised Unhealthy, so that
    // no new container is given them. Null: none.
    std::function<const std::map<std::string, std::string>&()> reserved = nullptr;
    // EFAs a running container holds by the kubelet's record that this
    // process has not found (ibdev -> why): listed Unhealthy under their
    // names, as the process that saw them go did, so that the kubelet's
    // record of the container (its pod status) keeps saying so. Null: none.
    std::function<const std::map<std::string, std::string>&()> held_missing = nullptr;
  };
  // Listings ("list") and device reads ("read") that failed for a reason
  // that says nothing about the devices (topology::DiscoveryError).
  struct DiscoveryErrorCounts {
    int64_t list = 0;
    int64_t read = 0;
  };

  // Not owned, and they outlive this: `service` is given the devices,
  // `guards` decides how they are advertised, `counters` is told of every
  // inventory and holds present EFAs Unhealthy by their counters.
  DeviceTracker(Options options, DevicePluginService* service, const GuardRunner* guards,
                EfaCounterMonitor* counters);
  DeviceTracker(const DeviceTracker&) = delete;
  DeviceTracker& operator=(const DeviceTracker&) = delete;

  // Discovers the EFAs, watches their directories and publishes them (with
  // the host model when it is current, else the fallback model of the
  // device table: NUMA node and root complex). What an incomplete
  // discovery could not see keeps its last known state; an EFA a complete
  // one no longer finds stays listed, Unhealthy. The hwloc model is rebuilt
  // later, by UpdateModel().
  void Rescan();
  // The periodic pass's look: a Rescan() when `force`, after an incomplete
  // discovery, every full_rescan_interval, or when the kernel counted a
  // uevent since the last look and the devices' fingerprint changed (or on
  // every sixth such look), taking a device directory inotify could not
  // watch as a uevent; else only watches the device directories created
  // since (and those it could not watch before).
  void PeriodicLook(bool force);
  // Gives the service the known EFAs as the guards let them be advertised,
  // a present one held Unhealthy by its counters' health problem, with the
  // model.
  void Publish();
  // Rebuilds the model from hwloc when the set of EFAs changed since it
  // was built, and publishes it. The caller runs it after registering: the
  // kubelet must not wait for hwloc. Returns whether it did.
  bool UpdateModel();
  // Whether inotify watch `wd` is one of the device directories' (forgotten
  // once the kernel dropped it, `mask` having IN_IGNORED or IN_DELETE_SELF).
  bool TakeWatchEvent(int wd, uint32_t mask);

  // Whether an EFA was ever seen, and how many (each listed since).
  bool has_devices() const { return !known_.empty(); }
  // Whether an EFA called `ibdev`, or at PCI address `pci` ("0000:4f:00.0"),
  // was seen since start.
  bool Knows(const std::string& ibdev) const;
  bool KnowsPci(const std::string& pci) const { return known_.count(pci) > 0; }
  int known_count() const { return static_cast<int>(known_.size()); }
  // Whether the latest discovery was complete.
  bool complete() const { return inventory_.complete(); }
  // The hwloc model of the current EFAs, or null while it is not built.
  const std::shared_ptr<const topology::HostModel>& model() const { return model_; }
  // The failed listings and reads since start. Thread-safe.
  DiscoveryErrorCounts discovery_errors() const {
    return {discovery_list_errors_.load(), discovery_read_errors_.load()};
  }

 private:
  // Logs a discovery's errors once per cause (and their end), and counts
  // them.
  void NoteDiscoveryErrors(const topology::Inventory& inventory);
  // Logs each skipped verbs device once per reason.
  void LogSkipped(const topology::Inventory& inventory);
  // Takes the discovered EFAs into known_, by PCI address, logging the new,
  // renamed and those whose health changed.
  void TakeFound(const topology::Inventory& inventory);
  // Marks the known EFAs `inventory` does not have Unhealthy, where it can
  // tell that they are gone or broken.
  void MarkMissing(const topology::Inventory& inventory);
  // Drops the model when the set of EFAs changed, and notes whether one is
  // to be built.
  void UpdateModelKey();
  void WatchDeviceDirs();

  const Options options_;
  DevicePluginService* const service_;
  const GuardRunner* const guards_;
  EfaCounterMonitor* const counters_;
  std::atomic<int64_t> discovery_list_errors_{0};
  std::atomic<int64_t> discovery_read_errors_{0};

  std::map<std::string, topology::EfaDevice> known_;  // every EFA seen, by PCI address
  topology::Inventory inventory_;                     // the latest discovery
  std::shared_ptr<const topology::HostModel> model_;  // rebuilt when the EFAs change
  std::string model_key_;                             // the EFAs model_ was built from
  bool model_stale_ = false;                          // the EFAs changed since
  std::string fingerprint_;                           // DiscoveryFingerprint at the latest rescan
  std::string uevent_seqnum_;                         // UeventSeqnum at the latest look
  int looks_since_rescan_ = 0;                        // periodic looks since
  Clock::time_point last_rescan_;
  std::string discovery_error_;      // the first error of an incomplete discovery, as logged
  std::string discovery_error_key_;  // its operation and errno: logged once while it lasts
  std::set<std::string> logged_skips_;
  std::map<int, std::string> device_watches_;  // inotify wd -> directory
  bool dirs_unwatched_ = false;  // a device directory's watch was refused at the latest try
};

}  // namespace efa::plugin
