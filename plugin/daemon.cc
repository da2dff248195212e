#include "plugin/daemon.h"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plugin/alignment/cdi_spec.h"
#include "plugin/ops/orphan_reaper.h"
#include "plugin/ops/signals.h"
#include "spdlog/spdlog.h"
#include "topology/efa_discovery.h"
#include "topology/hwloc_loader.h"
#include "topology/uevents.h"

namespace efa::plugin {
namespace fs = std::filesystem;

namespace {

// The retry of a failed alignment report: doubling from the first to the
// most while pod-resources keeps failing.
constexpr std::chrono::milliseconds kReportRetryFirst{500};
constexpr std::chrono::milliseconds kReportRetryMost{30000};
// Periodic passes between two full rescans when nothing seemed to change.
constexpr int kFullRescanEvery = 6;

void CloseFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

struct Daemon::Fds {
  int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);  // Stop(), stream ends
  // The device-plugins dir, the device directories and the guards' ones.
  int inotify = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  int uevent = -1;
  int signal = -1;
  bool reap_orphans = false;  // SIGCHLD reaps the container's orphans (PID 1)
  ~Fds() {
    CloseFd(wake);
    CloseFd(inotify);
    CloseFd(uevent);
    CloseFd(signal);
  }
};

Daemon::Daemon(DaemonOptions options)
    : options_(std::move(options)),
      fds_(std::make_unique<Fds>()),
      service_(DevicePluginService::Options{options_.report_numa, options_.replicas}),
      registrar_({.kubelet_dir = options_.kubelet_dir,
                  .resource_name = options_.resource_name,
                  .clock = options_.clock},
                 &service_),
      guards_({.kubelet_dir = options_.kubelet_dir,
               .proc_root = options_.roots.proc,
               .mofed_policy = options_.mofed_policy,
               .mofed_time_box = options_.mofed_time_box,
               .dra_policy = options_.dra_policy,
               .dra_drivers = options_.dra_drivers,
               .cdi_spec_dirs = options_.cdi_spec_dirs,
               .rescan_interval = options_.rescan_interval,
               .resource_name = options_.resource_name,
               .clock = options_.clock,
               .inotify_fd = fds_->inotify}) {
  AlignerOptions aligner_options;
  aligner_options.kubelet_dir = options_.kubelet_dir;
  aligner_options.proc_root = options_.roots.proc;
  aligner_options.efa_resource = options_.resource_name;
  aligner_options.resources = options_.accelerator_resources;
  if (options_.alignment == AlignmentMode::kLateBinding) {
    LateBinderOptions late;
    late.cdi_dir = options_.cdi_dir;
    late.kubelet_dir = options_.kubelet_dir;
    late.proc_root = options_.roots.proc;
    late.efa_resource = options_.resource_name;
    late.replicas = options_.replicas;
    late.resources = options_.accelerator_resources;
    late.now = [this] { return options_.clock->Now(); };
    late.release_after = options_.late_release_after;
    late.recheck_every = options_.late_recheck_every;
    late.refresh_checkpoint = [this] { service_.Resend(); };
    late.on_bound = [this] {
      report_requested_ = true;  // judge the new binding now, not at the next rescan
      Wake();
    };
    late_binder_ = std::make_unique<LateBinder>(std::move(late));
    service_.SetLateBinding(
        [this](const topology::DeviceTable& table, const std::vector<std::string>& kubelet_ids) {
          return late_binder_->PreStart(table, kubelet_ids);
        },
        options_.cdi_handover);
  }
  if (late_binder_ || options_.replicas > 1) {
    aligner_options.bound_efas = [this](const std::vector<std::string>& kubelet_ids) {
      return PhysicalEfas(kubelet_ids);
    };
  }
  if (options_.alignment != AlignmentMode::kOff) {
    aligner_ = std::make_unique<Aligner>(std::move(aligner_options));
    if (!late_binder_) {
      service_.SetTargetFinder(
          [this](const topology::HostModel& model) { return aligner_->ForAdmission(model); });
    }
  }
  EfaCounterMonitorOptions counters;
  counters.sysfs_root = options_.roots.sysfs;
  counters.interval = options_.counter_interval;
  counters.idle_timeout = options_.idle_timeout;
  counters.health = options_.device_health;
  counters.holders = EfaCounterMonitor::PodResourcesHolders(
      options_.kubelet_dir / "pod-resources/kubelet.sock", options_.resource_name,
      [this](const std::vector<std::string>& ids) { return PhysicalEfas(ids); });
  counters.on_health_change = [this] {
    health_changed_ = true;
    Wake();
  };
  counters_ = std::make_unique<EfaCounterMonitor>(std::move(counters));
  service_.SetRpcObserver(options_.rpc_observer);
  service_.SetStreamEndCallback([this] {
    stream_ended_ = true;
    Wake();
  });
}

// Before the members the service's handlers call into go.
Daemon::~Daemon() { registrar_.StopServer(); }

std::optional<std::vector<std::string>> Daemon::PhysicalEfas(
    const std::vector<std::string>& ids) const {
  if (late_binder_) return late_binder_->BoundEfas(ids);
  return service_.Table()->PhysicalEfas(ids);
}

void Daemon::Wake() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(fds_->wake, &one, sizeof one);
}

void Daemon::Heartbeat() {
  registered_now_ = registrar_.registered();
  known_devices_ = static_cast<int>(known_.size());
  heartbeat_ns_ = std::max<int64_t>(1, options_.clock->Now().time_since_epoch().count());
}

std::optional<Clock::time_point> Daemon::heartbeat() const {
  const int64_t ns = heartbeat_ns_.load();
  if (ns == 0) return std::nullopt;
  return Clock::time_point(Clock::duration(ns));
}

void Daemon::Stop() {
  stop_ = true;
  Wake();
}

void Daemon::Rescan() {
  // libibverbs' own list (MarkVerbsProviders) is for the inventory command
  // only: it would load the verbs providers and read sysfs again.
  passes_since_rescan_ = 0;
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
  const topology::Inventory& inv = inventory_;
  counters_->SetDevices(inv.devices);
  if (options_.on_inventory) options_.on_inventory(inv);
  for (const auto& s : inv.skipped) {
    if (!logged_skips_.insert(s.ibdev + "\n" + s.reason).second) continue;
    if (s.malformed) {
      spdlog::warn("skipping verbs device {}: {}", s.ibdev, s.reason);
    } else {
      spdlog::debug("skipping verbs device {}: {}", s.ibdev, s.reason);
    }
  }
  // A device is its PCI function, not its name: udev renames efa_0 to
  // rdmap79s0 after the kernel announced it (hot-plug, or a daemon started
  // before udev finished), and the old name must not stay listed beside
  // the new one.
  std::set<std::string> present;
  for (const topology::EfaDevice& d : inv.devices) {
    const std::string key = d.pci.ToString();
    present.insert(key);
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
  // A device that vanished from sysfs stays listed, unhealthy, so that the
  // kubelet keeps its capacity honest and stops placing pods on it. Only a
  // complete discovery can tell that it vanished.
  for (auto& [key, d] : known_) {
    if (present.count(key)) continue;
    std::string problem = (options_.roots.sysfs / "class/infiniband" / d.ibdev).string() + ": gone";
    bool skipped = false;
    for (const auto& s : inv.skipped) {
      if (s.ibdev != d.ibdev) continue;
      problem = s.reason;  // still there, but its sysfs is broken
      skipped = true;
    }
    if (!skipped && !inv.complete()) continue;
    if (d.health_problem != problem) {
      spdlog::warn("EFA {} is unhealthy: {}", d.ibdev, problem);
      d.health_problem = problem;
    }
  }
  // The health goes out now; a changed set of EFAs gets its hwloc model
  // after (UpdateModel), the policy meanwhile placing by NUMA node and root
  // complex.
  std::string key;
  for (const auto& d : inv.devices) key += d.ibdev + "@" + d.pci.ToString() + ";";
  if (key != model_key_) {
    model_key_ = std::move(key);
    model_ = nullptr;
  }
  model_stale_ = !model_ && !inv.devices.empty();
  Publish();
  WatchDeviceDirs();
}

void Daemon::NoteDiscoveryErrors(const topology::Inventory& inventory) {
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

void Daemon::Publish() {
  // Device health from the counters (opt-in) holds a present EFA Unhealthy.
  const std::map<std::string, std::string> counter_problems = counters_->HealthProblems();
  std::vector<topology::EfaDevice> devices;
  for (const auto& [id, d] : known_) {
    devices.push_back(d);
    auto problem = counter_problems.find(d.ibdev);
    if (d.healthy() && problem != counter_problems.end()) {
      devices.back().health_problem = problem->second;
    }
  }
  std::sort(devices.begin(), devices.end(),
            [](const auto& a, const auto& b) { return a.pci < b.pci; });
  service_.SetDevices(guards_.Apply(std::move(devices)), model_, model_stale_);
}

void Daemon::UpdateModel() {
  // hwloc takes milliseconds to load: only when the set of EFAs changes,
  // not on every rescan or health change.
  if (!model_stale_) return;
  model_stale_ = false;
  topology::TopologySource source{"/", options_.topology_xml};
  if (options_.roots.sysfs != "/sys") source.fsroot = options_.roots.sysfs.parent_path().string();
  auto topology = topology::LoadTopology(source);
  if (!topology.ok()) {
    spdlog::warn("no PCI topology ({}); placing EFAs by NUMA node and root complex only",
                 std::string(topology.status().message()));
    Publish();  // no longer pending: the fallback it is
    return;
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
}

void Daemon::WatchDeviceDirs() {
  // inotify reports device nodes coming and going under devtmpfs and every
  // change of a simulated sysfs; real sysfs sends none (uevents cover it).
  for (const fs::path& dir : topology::DiscoveryDirs(options_.roots)) {
    int wd = ::inotify_add_watch(fds_->inotify, dir.c_str(), topology::kDiscoveryDirEvents);
    if (wd >= 0) device_watches_[wd] = dir.string();
  }
}

void Daemon::TryRegister() {
  // Take in the events already queued (a kubelet.sock created before this
  // check is not a restart after this registration).
  HandleInotify();
  if (registrar_.registered() || guards_.withdrawn() || !registrar_.KubeletSocketPresent()) {
    return;  // inotify reports kubelet.sock
  }
  // A DRA driver may have started listening since the last probe (nothing
  // signals a listen()): probe again, never register beside it.
  if (CheckGuards()) Rescan();
  if (guards_.withdrawn()) return;
  // Streams open before this attempt belong to the registration it
  // replaces: their ending (ours, when the server restarts below, or the
  // kubelet's) must not start another one.
  service_.BeginRegistration();
  // A stream that ended before this point (the restarted kubelet closing
  // the old one) is answered by this very registration: not another one.
  stream_ended_ = false;
  registrar_.Register();
}

void Daemon::HandleInotify() {
  alignas(inotify_event) char buf[4096];
  bool rescan = false;
  bool guards = false;
  bool report = false;
  bool overflow = false;
  while (true) {
    ssize_t n = ::read(fds_->inotify, buf, sizeof buf);
    if (n <= 0) break;
    for (char* p = buf; p < buf + n;) {
      auto* ev = reinterpret_cast<inotify_event*>(p);
      p += sizeof(inotify_event) + ev->len;
      std::string name = ev->len ? ev->name : "";
      if (ev->mask & IN_Q_OVERFLOW) {
        overflow = true;
      } else if (ev->wd == kubelet_watch_) {
        if (name == "kubelet.sock" && (ev->mask & (IN_CREATE | IN_MOVED_TO))) {
          registrar_.RegisterAgainNow(Registrar::Reason::kKubeletSocketCreated);
        } else if (name == kPluginSocket && (ev->mask & (IN_DELETE | IN_MOVED_FROM))) {
          registrar_.RegisterAgainNow(Registrar::Reason::kPluginSocketDeleted);
        } else if (name == kCheckpointFile) {
          guards = true;  // the MOFED guard reads it
          report = true;  // a container was admitted or removed
        }
      } else if (guards_.TakeWatchEvent(ev->wd, ev->mask)) {
        // Late binding's own specs (and their temporary files) in a CDI
        // dir the MOFED guard watches are no guard's business.
        if (late_binder_ && (name.starts_with(kCdiSpecPrefix) ||
                             name.starts_with(std::string(".") + kCdiSpecPrefix))) {
          continue;
        }
        guards = true;
        guards_.ProbeDraSoon();  // a new socket: probe it quickly
      } else if (device_watches_.count(ev->wd)) {
        if (ev->mask & (IN_IGNORED | IN_DELETE_SELF)) device_watches_.erase(ev->wd);
        rescan = true;
      }
    }
  }
  if (overflow) {
    // The kernel dropped events: any of them may have been a device, a
    // guard, our socket's deletion or a new kubelet.sock (which may reuse
    // the old inode). Look at everything now rather than at the next rescan.
    spdlog::warn("inotify queue overflowed: events were lost; rescanning everything");
    guards = rescan = report = true;
    guards_.ProbeDraSoon();
    if (registrar_.registrations() > 0) {
      // Registering again is harmless, a missed restart is not.
      registrar_.RegisterAgainNow(Registrar::Reason::kEventsLost);
    }
  }
  if (guards && CheckGuards()) rescan = true;
  if (rescan) Rescan();
  if (report) ReportAlignment();
}

void Daemon::PeriodicCheck() {
  // One wake-up per interval for all periodic work, not one per kind.
  next_periodic_ = options_.clock->Now() + options_.rescan_interval;
  // The fallback for changes no uevent or inotify event reported: a full
  // discovery of a p5 costs about a thousand system calls, its fingerprint
  // a third of that, the kernel's uevent count one. While the count stands
  // no device came, went, was bound, unbound or renamed (it counts the
  // uevents this pod's network namespace does not receive too; device
  // nodes coming and going are inotify's): the pass reads no more. Else it
  // rescans when the fingerprint changed, and every sixth such pass all the
  // same: the attributes the fingerprint leaves out (vendor, device, NUMA
  // node) change only with the device, or when its sysfs breaks. Beside
  // the gate: a rescan at every pass while the last one was incomplete (its
  // cause, such as a full descriptor table, sends no event when it ends),
  // and one every full_rescan_interval whatever the count says.
  const bool guards_changed = CheckGuards();
  std::string seqnum = topology::UeventSeqnum(options_.roots.sysfs);
  const bool no_uevent = !seqnum.empty() && seqnum == uevent_seqnum_;
  uevent_seqnum_ = std::move(seqnum);
  const bool full_rescan_due =
      options_.clock->Now() - last_rescan_ >= options_.full_rescan_interval;
  if (guards_changed || !inventory_.complete() || full_rescan_due ||
      (!no_uevent && (++passes_since_rescan_ >= kFullRescanEvery ||
                      topology::DiscoveryFingerprint(options_.roots) != fingerprint_))) {
    Rescan();
  } else {
    WatchDeviceDirs();  // a device directory created since
  }
  ReportAlignment(/*periodic=*/true);
}

void Daemon::ReportAlignment(bool periodic) {
  next_report_ = Clock::time_point::max();
  if (known_.empty()) return;  // no EFA: no container holds one
  // Entries of the checkpoint that cannot be parsed are skipped one by one
  // wherever it is read; count them here (the file changed, or a rescan).
  // The aligner keeps it parsed (once per change).
  const auto checkpoint =
      aligner_ ? aligner_->Checkpoint()
               : std::make_shared<const CheckpointCache::Result>(
                     ReadCheckpoint(options_.kubelet_dir / "device-plugins" / kCheckpointFile));
  const int skipped = checkpoint->ok() ? static_cast<int>((*checkpoint)->skipped.size()) : 0;
  if (skipped != checkpoint_entries_skipped_.exchange(skipped)) {
    for (const std::string& why :
         checkpoint->ok() ? (*checkpoint)->skipped : std::vector<std::string>{}) {
      spdlog::warn("kubelet checkpoint: skipping an entry that cannot be parsed: {}", why);
    }
  }
  if (late_binder_) ReleaseGone();
  // Admissions change the checkpoint (and are reported on its inotify
  // event); a periodic pass over the same checkpoint would ask
  // pod-resources for nothing new.
  if (periodic && checkpoint == reported_checkpoint_) return;
  if (aligner_ && model_) {
    switch (aligner_->Report(*model_)) {
      case Aligner::ReportOutcome::kJudged:
        reported_checkpoint_ = checkpoint;
        report_backoff_ = std::chrono::milliseconds(0);
        break;
      case Aligner::ReportOutcome::kDeferred:
        // A burst of admissions spent our own tokens: one is due soon, and
        // doubling here would leave the burst unjudged for up to 30 s.
        next_report_ = options_.clock->Now() + kReportRetryFirst;
        break;
      case Aligner::ReportOutcome::kFailed:
        // pod-resources failed: try again, less often while it keeps failing.
        report_backoff_ = std::clamp(report_backoff_ * 2, kReportRetryFirst, kReportRetryMost);
        next_report_ = options_.clock->Now() + report_backoff_;
        break;
    }
  }
}

bool Daemon::CheckGuards() {
  const GuardVerdict verdict = guards_.Check(!known_.empty(), registrar_.registered());
  if (verdict.register_again) registrar_.RegisterAgainNow(Registrar::Reason::kDraDriverGone);
  return verdict.devices_changed;
}

void Daemon::ReleaseGone() {
  next_release_ = late_binder_->ReleaseGone().value_or(Clock::time_point::max());
}

bool Daemon::OpenEventSources() {
  if (fds_->wake < 0 || fds_->inotify < 0) {
    spdlog::error("cannot create eventfd/inotify: {}", std::strerror(errno));
    return false;
  }
  fds_->uevent = topology::OpenUeventSocket();
  // As PID 1 of its container the daemon is handed the container's orphans
  // (orphan_reaper.h): reaped on SIGCHLD, and once now for any handed over
  // before this loop (or to the idle process it was exec'ed from).
  fds_->reap_orphans = options_.handle_signals && InheritsOrphans();
  if (options_.handle_signals) fds_->signal = OpenOwnerLoopSignalFd();
  if (fds_->reap_orphans) ReapEndedChildren();
  const fs::path plugin_dir = options_.kubelet_dir / "device-plugins";
  std::error_code ec;
  fs::create_directories(plugin_dir, ec);
  kubelet_watch_ =
      ::inotify_add_watch(fds_->inotify, plugin_dir.c_str(),
                          IN_CREATE | IN_MOVED_TO | IN_DELETE | IN_MOVED_FROM | IN_CLOSE_WRITE);
  if (kubelet_watch_ < 0) {
    spdlog::error("cannot watch {}: {}", plugin_dir.string(), std::strerror(errno));
    return false;
  }
  return true;
}

void Daemon::Start() {
  Rescan();
  // Alive from here on: /healthz must not wait for the first registration,
  // which may block for the registration's timeout (the idle process
  // answered 200 until it exec'ed this one).
  Heartbeat();
  if (late_binder_) {
    // Before serving: no PreStartContainer may bind an EFA a spec holds.
    late_binder_->Recover();
    ReleaseGone();
  }
  next_periodic_ = options_.clock->Now() + options_.rescan_interval;
}

void Daemon::ServeAndRegister() {
  if (!serving_started_) {
    // The first EFA: the API is served (the guards look before the
    // registration, in TryRegister). Until then the daemon runs no gRPC
    // at all: no server, no threads. A device once seen stays listed, so
    // serving never stops again.
    serving_started_ = true;
    if (absl::Status served = registrar_.StartServer(); !served.ok()) {
      // Retried with the registration (TryRegister), whatever the cause.
      spdlog::error("cannot serve the device plugin API: {}", std::string(served.message()));
    }
  }
  if (!registrar_.registered() && !guards_.withdrawn() &&
      options_.clock->Now() >= registrar_.next_attempt()) {
    TryRegister();
  }
}

Clock::time_point Daemon::NextDeadline() const {
  auto deadline = std::min({next_periodic_, guards_.next_check(), next_report_, next_release_});
  if (options_.device_health.enabled) deadline = std::min(deadline, next_health_read_);
  if (!known_.empty() && !registrar_.registered() && !guards_.withdrawn() &&
      registrar_.KubeletSocketPresent()) {
    deadline = std::min(deadline, registrar_.next_attempt());
  }
  return deadline;
}

bool Daemon::WaitForEvents(Clock::time_point deadline) {
  // Rounded up: rounded down, a deadline 0.9 ms away became a zero timeout
  // and the loop spun until it passed.
  auto wait = std::chrono::ceil<std::chrono::milliseconds>(deadline - options_.clock->Now());
  std::vector<pollfd> pfds = {{fds_->wake, POLLIN, 0}, {fds_->inotify, POLLIN, 0}};
  if (fds_->uevent >= 0) pfds.push_back({fds_->uevent, POLLIN, 0});
  if (fds_->signal >= 0) pfds.push_back({fds_->signal, POLLIN, 0});
  int n = ::poll(pfds.data(), pfds.size(), static_cast<int>(std::max<int64_t>(wait.count(), 0)));
  if (n < 0 && errno != EINTR) {
    spdlog::error("poll: {}", std::strerror(errno));
    return false;
  }
  for (const pollfd& p : pfds) {
    if (!(p.revents & POLLIN)) continue;
    if (p.fd == fds_->wake) {
      uint64_t v;
      [[maybe_unused]] ssize_t r = ::read(fds_->wake, &v, sizeof v);
    } else if (p.fd == fds_->inotify) {
      HandleInotify();
    } else if (p.fd == fds_->uevent) {
      if (topology::DrainUevents(fds_->uevent)) Rescan();
    } else if (p.fd == fds_->signal) {
      HandleSignals();
    }
  }
  return true;
}

void Daemon::HandleSignals() {
  signalfd_siginfo info;
  while (::read(fds_->signal, &info, sizeof info) == sizeof info) {
    if (info.ssi_signo == SIGCHLD) {
      if (fds_->reap_orphans) ReapEndedChildren();
    } else if (info.ssi_signo == SIGHUP) {
      spdlog::info("SIGHUP: rescanning and registering again");
      Rescan();
      registrar_.RegisterAgainNow(Registrar::Reason::kSighup);
    } else {
      spdlog::info("signal {}: stopping", info.ssi_signo);
      stop_ = true;
    }
  }
}

void Daemon::RunDueWork() {
  const Clock& clock = *options_.clock;
  if (clock.Now() >= guards_.next_check() && CheckGuards()) Rescan();
  if (report_requested_.exchange(false) || clock.Now() >= next_report_) ReportAlignment();
  if (clock.Now() >= next_release_) ReleaseGone();
  if (options_.device_health.enabled && clock.Now() >= next_health_read_) {
    // A scrape in between reads for it; then this answers the last read.
    counters_->Sample();
    next_health_read_ = clock.Now() + options_.counter_interval;
  }
  if (health_changed_.exchange(false)) Publish();
  if (clock.Now() >= next_periodic_) PeriodicCheck();
}

int Daemon::Run() {
  if (!OpenEventSources()) return 1;
  Start();
  bool announced_idle = false;
  while (!stop_) {
    if (stream_ended_.exchange(false) && registrar_.registered()) {
      registrar_.RegisterAgainNow(Registrar::Reason::kStreamEnded);
    }
    const bool have_devices = !known_.empty();
    // An incomplete first scan is no proof of a node without EFA: the
    // periodic pass looks again before the daemon idles.
    if (!have_devices && !announced_idle && inventory_.complete()) {
      announced_idle = true;
      if (!serving_started_ && options_.on_idle) options_.on_idle();
      spdlog::info("no EFA on this node; idle until one appears");
    }
    if (have_devices) ServeAndRegister();
    UpdateModel();  // after the registration: the kubelet does not wait for hwloc
    const Clock::time_point deadline = NextDeadline();
    Heartbeat();
    if (!WaitForEvents(deadline)) break;
    RunDueWork();
  }
  registrar_.StopServer();
  spdlog::info("stopped; {} removed", plugin_socket().string());
  return 0;
}

}  // namespace efa::plugin
