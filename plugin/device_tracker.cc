#include "plugin/device_tracker.h"

#include <sys/inotify.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "topology/hwloc_loader.h"
#include "topology/uevents.h"

namespace efa::plugin {
namespace fs = std::filesystem;

namespace {

// Periodic looks between two full rescans when nothing seemed to change.
constexpr int kFullRescanEvery = 6;

}  // namespace

DeviceTracker::DeviceTracker(Options options, DevicePluginService* service,
                             const GuardRunner* guards, EfaCounterMonitor* counters)
    : options_(std::move(options)), service_(service), guards_(guards), counters_(counters) {}

void DeviceTracker::Rescan() {
  // libibverbs' own list (MarkVerbsProviders) is for the inventory command
  // only: it would load the verbs providers and read sysfs again.
  looks_since_rescan_ = 0;
  last_rescan_ = options_.clock->Now();
  // First: a change after shows.
  uevent_seqnum_ = topology::UeventSeqnum(options_.roots.sysfs);
  fingerprint_ = topology::DiscoveryFingerprint(options_.roots);
  topology::Inventory found = topology::DiscoverEfaDevices(options_.roots);
  NoteDiscoveryErrors(found);
  // What an incomplete discovery could not see keeps its last known state:
  // out of descriptors, a listing of class/infiniband fails, and taking
  // that for absence would turn every EFA Unhealthy.
  inventory_ = topology::KeepLastKnown(std::move(found), inventory_);
  counters_->SetDevices(inventory_.devices);
  if (options_.on_inventory) options_.on_inventory(inventory_);
  LogSkipped(inventory_);
  TakeFound(inventory_);
  MarkMissing(inventory_);
  // The health goes out now; a changed set of EFAs gets its hwloc model
  // after (UpdateModel), the policy meanwhile placing by NUMA node and root
  // complex.
  UpdateModelKey();
  Publish();
  WatchDeviceDirs();
}

void DeviceTracker::LogSkipped(const topology::Inventory& inventory) {
  for (const auto& s : inventory.skipped) {
    if (!logged_skips_.insert(s.ibdev + "\n" + s.reason).second) continue;
    if (s.malformed) {
      spdlog::warn("skipping verbs device {}: {}", s.ibdev, s.reason);
    } else {
      spdlog::debug("skipping verbs device {}: {}", s.ibdev, s.reason);
    }
  }
}

void DeviceTracker::TakeFound(const topology::Inventory& inventory) {
  // A device is its PCI function, not its name: udev renames efa_0 to
  // rdmap79s0 after the kernel announced it (hot-plug, or a daemon started
  // before udev finished), and the old name must not stay listed beside
  // the new one.
  for (const topology::EfaDevice& d : inventory.devices) {
    const std::string key = d.pci.ToString();
    auto it = known_.find(key);
    if (it != known_.end() && it->second.ibdev != d.ibdev) {
      spdlog::info("EFA {} was renamed {} ({})", it->second.ibdev, d.ibdev, key);
      known_.erase(it);
      it = known_.end();
    }
    if (it == known_.end()) {
      spdlog::info("found EFA {} ({}, {}, NUMA {}){}", d.ibdev, key, d.uverbs,
                   d.numa_node ? std::to_string(*d.numa_node) : "unknown",
                   d.healthy() ? "" : ", unhealthy: " + d.health_problem);
    } else if (it->second.health_problem != d.health_problem) {
      if (d.healthy()) {
        spdlog::info("EFA {} is healthy again", d.ibdev);
      } else {
        spdlog::warn("EFA {} is unhealthy: {}", d.ibdev, d.health_problem);
      }
    }
    known_[key] = d;
  }
}

void DeviceTracker::MarkMissing(const topology::Inventory& inventory) {
  std::set<std::string> present;
  for (const topology::EfaDevice& d : inventory.devices) present.insert(d.pci.ToString());
  // A device that vanished from sysfs stays listed, unhealthy, so that the
  // kubelet keeps its capacity honest and stops placing pods on it. Only a
  // complete discovery can tell that it vanished.
  for (auto& [key, d] : known_) {
    if (present.count(key)) continue;
    std::string problem = (options_.roots.sysfs / "class/infiniband" / d.ibdev).string() + ": gone";
    bool skipped = false;
    for (const auto& s : inventory.skipped) {
      if (s.ibdev != d.ibdev) continue;
      problem = s.reason;  // still there, but its sysfs is broken
      skipped = true;
    }
    if (!skipped && !inventory.complete()) continue;
    if (d.health_problem != problem) {
      spdlog::warn("EFA {} is unhealthy: {}", d.ibdev, problem);
      d.health_problem = problem;
    }
  }
}

void DeviceTracker::UpdateModelKey() {
  std::string key;
  for (const auto& d : inventory_.devices) key += d.ibdev + "@" + d.pci.ToString() + ";";
  if (key != model_key_) {
    model_key_ = std::move(key);
    model_ = nullptr;
  }
  model_stale_ = !model_ && !inventory_.devices.empty();
}

void DeviceTracker::NoteDiscoveryErrors(const topology::Inventory& inventory) {
  if (inventory.complete()) {
    if (!discovery_error_.empty()) {
      spdlog::info("device discovery is complete again (it failed with: {})", discovery_error_);
    }
    discovery_error_.clear();
    discovery_error_key_.clear();
    return;
  }
  for (const topology::DiscoveryError& e : inventory.errors) {
    ++(e.operation == "list" ? discovery_list_errors_ : discovery_read_errors_);
  }
  // Once per cause, not once per pass or per device: out of descriptors,
  // every pass and every device fails alike.
  const topology::DiscoveryError& first = inventory.errors.front();
  std::string key = absl::StrCat(first.operation, " ", first.err);
  if (key == discovery_error_key_) return;
  discovery_error_key_ = std::move(key);
  discovery_error_ = first.message;
  spdlog::warn(
      "device discovery is incomplete: {}{}; the EFAs it could not see keep their last known "
      "state, and every periodic pass looks again",
      first.message,
      inventory.errors.size() > 1 ? absl::StrCat(" (and ", inventory.errors.size() - 1, " more)")
                                  : "");
}

void DeviceTracker::PeriodicLook(bool force) {
  // The fallback for changes no uevent or inotify event reported: a full
  // discovery of a p5 costs about a thousand system calls, its fingerprint
  // a third of that, the kernel's uevent count one. While the count stands
  // no device came, went, was bound, unbound or renamed (it counts the
  // uevents this pod's network namespace does not receive too; device
  // nodes coming and going are inotify's): the look reads no more. Else it
  // rescans when the fingerprint changed, and every sixth such look all the
  // same: the attributes the fingerprint leaves out (vendor, device, NUMA
  // node) change only with the device, or when its sysfs breaks. Beside
  // the gate: a rescan at every look while the last one was incomplete (its
  // cause, such as a full descriptor table, sends no event when it ends),
  // and one every full_rescan_interval whatever the count says.
  // Without a watch on the device directories (no inotify, or the kernel
  // refused one: InotifyWatches), the count says nothing of the device
  // nodes: the fingerprint, which covers them, is compared at every look.
  std::string seqnum = topology::UeventSeqnum(options_.roots.sysfs);
  const bool no_uevent = !dirs_unwatched_ && !seqnum.empty() && seqnum == uevent_seqnum_;
  uevent_seqnum_ = std::move(seqnum);
  const bool full_rescan_due =
      options_.clock->Now() - last_rescan_ >= options_.full_rescan_interval;
  if (force || !inventory_.complete() || full_rescan_due ||
      (!no_uevent && (++looks_since_rescan_ >= kFullRescanEvery ||
                      topology::DiscoveryFingerprint(options_.roots) != fingerprint_))) {
    Rescan();
  } else {
    WatchDeviceDirs();  // a device directory created since
  }
}

void DeviceTracker::Publish() {
  // Device health from the counters (opt-in) holds a present EFA Unhealthy.
  const std::map<std::string, std::string> counter_problems = counters_->HealthProblems();
  static const std::map<std::string, std::string> kNone;
  const std::map<std::string, std::string>& reserved =
      options_.reserved ? options_.reserved() : kNone;
  std::vector<topology::EfaDevice> devices;
  for (const auto& [id, d] : known_) {
    devices.push_back(d);
    for (const auto* problems : {&counter_problems, &reserved}) {
      auto problem = problems->find(d.ibdev);
      if (devices.back().healthy() && problem != problems->end()) {
        devices.back().health_problem = problem->second;
      }
    }
  }
  if (options_.held_missing) {
    for (const auto& [ibdev, why] : options_.held_missing()) {
      if (Knows(ibdev)) continue;
      topology::EfaDevice& ghost = devices.emplace_back();
      ghost.ibdev = ibdev;
      ghost.health_problem = why;
    }
  }
  std::sort(devices.begin(), devices.end(),
            [](const auto& a, const auto& b) { return a.pci < b.pci; });
  service_->SetDevices(guards_->Apply(std::move(devices)), model_, model_stale_);
}

bool DeviceTracker::Knows(const std::string& ibdev) const {
  return std::any_of(known_.begin(), known_.end(),
                     [&](const auto& entry) { return entry.second.ibdev == ibdev; });
}

bool DeviceTracker::UpdateModel() {
  // hwloc takes milliseconds to load: only when the set of EFAs changes,
  // not on every rescan or health change.
  if (!model_stale_) return false;
  model_stale_ = false;
  const topology::TopologySource source =
      topology::SourceFor(options_.roots.sysfs, options_.topology_xml);
  auto topology = topology::LoadTopology(source);
  if (!topology.ok()) {
    spdlog::warn("no PCI topology ({}); placing EFAs by NUMA node and root complex only",
                 std::string(topology.status().message()));
    Publish();  // no longer pending: the fallback it is
    return true;
  }
  model_ = topology::HostModel::FromHwloc(inventory_, topology->get(), {options_.instance_type});
  for (const std::string& w : model_->warnings()) spdlog::warn("topology: {}", w);
  size_t gpus = 0, neurons = 0;
  for (const auto& a : model_->accelerators()) {
    (a.kind == topology::AcceleratorKind::kNvidiaGpu ? gpus : neurons)++;
  }
  spdlog::info(
      "topology of {}: {} EFAs, {} GPUs, {} Neuron devices{}",
      model_->instance_type().empty() ? "an unknown instance type" : model_->instance_type(),
      model_->efas().size(), gpus, neurons,
      model_->neuron_table() ? ", AWS Neuron-to-EFA table" : "");
  Publish();
  return true;
}

void DeviceTracker::WatchDeviceDirs() {
  // inotify reports device nodes coming and going under devtmpfs and every
  // change of a simulated sysfs; real sysfs sends none (uevents cover it).
  if (!options_.watches) return;
  dirs_unwatched_ = false;
  for (const fs::path& dir : topology::DiscoveryDirs(options_.roots)) {
    const InotifyWatches::Watch watch = options_.watches->Add(dir, topology::kDiscoveryDirEvents);
    if (watch.wd >= 0) device_watches_[watch.wd] = dir.string();
    dirs_unwatched_ |= watch.refused;
  }
}

bool DeviceTracker::TakeWatchEvent(int wd, uint32_t mask) {
  auto it = device_watches_.find(wd);
  if (it == device_watches_.end()) return false;
  if (mask & (IN_IGNORED | IN_DELETE_SELF)) device_watches_.erase(it);
  return true;
}

}  // namespace efa::plugin
