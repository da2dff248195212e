#include "plugin/daemon.h"

#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "plugin/alignment/cdi_spec.h"
#include "spdlog/spdlog.h"
#include "topology/replica_id.h"
#include "topology/uevents.h"

namespace efa::plugin {
namespace fs = std::filesystem;

namespace {

// The retry of a failed alignment report: doubling from the first to the
// most while pod-resources keeps failing.
constexpr std::chrono::milliseconds kReportRetryFirst{500};
constexpr std::chrono::milliseconds kReportRetryMost{30000};
// A timer's due time: at once, and never.
constexpr Clock::time_point kNow = Clock::time_point::min();
constexpr Clock::time_point kNever = Clock::time_point::max();

void CloseFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

struct Daemon::Fds {
  int uevent = -1;
  ~Fds() { CloseFd(uevent); }
};

std::optional<Daemon::FileIdentity> Daemon::Identify(const fs::path& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    return FileIdentity{.present = true,
                        .dev = st.st_dev,
                        .ino = st.st_ino,
                        .ctime_sec = st.st_ctim.tv_sec,
                        .ctime_nsec = st.st_ctim.tv_nsec};
  }
  if (errno == ENOENT || errno == ENOTDIR) return FileIdentity{};
  return std::nullopt;  // errors are not absence
}

Daemon::Daemon(DaemonOptions options)
    : options_(std::move(options)),
      loop_({.clock = options_.clock,
             .take_signals = options_.handle_signals,
             .on_hangup = [this] { Hangup(); }}),
      fds_(std::make_unique<Fds>()),
      watches_({.rescan_interval = options_.rescan_interval}),
      service_(DevicePluginService::Options{options_.report_numa, options_.replicas,
                                            options_.resource_name}),
      registrar_({.kubelet_dir = options_.kubelet_dir,
                  .resource_name = options_.resource_name,
                  .clock = options_.clock},
                 &service_),
      // The settings, then kubelet_dir, proc_root, rescan_interval, resource_name, clock, watches.
      guards_({options_.guards, options_.kubelet_dir, options_.roots.proc, options_.rescan_interval,
               options_.resource_name, options_.clock, &watches_}),
      counters_(std::make_unique<EfaCounterMonitor>(CounterOptions())),
      tracker_(
          {.roots = options_.roots,
           .topology_xml = options_.topology_xml,
           .instance_type = options_.instance_type,
           .full_rescan_interval = options_.full_rescan_interval,
           .on_inventory = options_.on_inventory,
           .clock = options_.clock,
           .watches = &watches_,
           .reserved = [this]() -> const std::map<std::string, std::string>& { return reserved_; },
           .held_missing = [this]() -> const std::map<std::string, std::string>& {
             return held_missing_;
           }},
          &service_, &guards_, counters_.get()) {
  SetUpAlignment();
  service_.SetRpcObserver(options_.rpc_observer);
  service_.SetStreamEndCallback([this] {
    stream_ended_ = true;
    Wake();
  });
  AddTimers();
}

EfaCounterMonitorOptions Daemon::CounterOptions() {
  EfaCounterMonitorOptions counters;
  static_cast<EfaCounterSettings&>(counters) = options_.counters;
  counters.sysfs_root = options_.roots.sysfs;
  counters.holders = EfaCounterMonitor::PodResourcesHolders(
      options_.kubelet_dir / "pod-resources/kubelet.sock",
      [this](const std::vector<std::string>& ids) { return HeldEfas(ids); });
  if (options_.counters.claim_lookup) {
    counters.claim_devices = EfaCounterMonitor::ApiServerClaims(options_.counters.api_server);
  }
  counters.on_health_change = [this] {
    health_changed_ = true;
    Wake();
  };
  return counters;
}

void Daemon::SetUpAlignment() {
  AlignerOptions aligner_options;
  aligner_options.kubelet_dir = options_.kubelet_dir;
  aligner_options.proc_root = options_.roots.proc;
  aligner_options.resources = options_.accelerator_resources;
  aligner_options.pod_resources.clock = options_.clock;
  // In every mode: bindings an earlier configuration made are kept until
  // their containers end (LateBinder).
  {
    LateBinderOptions late;
    late.late_binding = options_.alignment == AlignmentMode::kLateBinding;
    late.cdi_dir = options_.cdi_dir;
    late.kubelet_dir = options_.kubelet_dir;
    late.proc_root = options_.roots.proc;
    late.resource_name = options_.resource_name;
    late.replicas = options_.replicas;
    late.resources = options_.accelerator_resources;
    late.clock = options_.clock;
    late.release_after = options_.late_release_after;
    late.recheck_every = options_.late_recheck_every;
    late.refresh_checkpoint = [this] { service_.Resend(); };
    late.on_bound = [this] {
      report_requested_ = true;  // judge the new binding now, not at the next rescan
      Wake();
    };
    late_binder_ = std::make_unique<LateBinder>(std::move(late));
  }
  if (late_binding()) {
    service_.SetLateBinding(
        [this](const topology::DeviceTable& table, const std::vector<std::string>& kubelet_ids) {
          return late_binder_->PreStart(table, kubelet_ids);
        },
        options_.cdi_handover);
  }
  aligner_options.bound_efas = [this](const std::vector<std::string>& kubelet_ids) {
    return PhysicalEfas(kubelet_ids);
  };
  if (options_.alignment != AlignmentMode::kOff) {
    aligner_ = std::make_unique<Aligner>(std::move(aligner_options));
    if (!late_binding()) {
      service_.SetTargetFinder(
          [this](const topology::HostModel& model) { return aligner_->ForAdmission(model); });
    }
  }
}

void Daemon::AddTimers() {
  loop_.AddTimer([this] { return guards_.next_check(); },
                 [this] {
                   if (CheckGuards()) tracker_.Rescan();
                 });
  loop_.AddTimer([this] { return report_requested_ ? kNow : next_report_; },
                 [this] {
                   report_requested_ = false;
                   ReportAlignment();
                 });
  loop_.AddTimer([this] { return next_release_; }, [this] { ReleaseGone(); });
  if (options_.counters.health.enabled) {
    loop_.AddTimer([this] { return next_health_read_; },
                   [this] {
                     // A scrape in between reads for it; then this answers the last read.
                     // The owner loop never waits on the API server: claims
                     // are looked up by scrapes.
                     counters_->Sample(/*look_up_claims=*/false);
                     next_health_read_ = options_.clock->Now() + options_.counters.interval;
                   });
  }
  loop_.AddTimer([this] { return health_changed_ ? kNow : kNever; },
                 [this] {
                   health_changed_ = false;
                   tracker_.Publish();
                 });
  loop_.AddTimer([this] { return next_periodic_; }, [this] { PeriodicCheck(); });
}

// Before the members the service's handlers call into go.
Daemon::~Daemon() { registrar_.StopServer(); }

std::optional<std::vector<std::string>> Daemon::PhysicalEfas(
    const std::vector<std::string>& ids) const {
  // A binding, of this configuration or an earlier one, says; else with
  // late binding the IDs are tokens not bound yet.
  if (auto bound = late_binder_->BoundEfas(ids)) return bound;
  if (late_binding()) return std::nullopt;
  return service_.Table()->PhysicalEfas(ids);
}

std::optional<std::vector<std::string>> Daemon::HeldEfas(
    const std::vector<std::string>& ids) const {
  if (auto bound = late_binder_->BoundEfas(ids)) return bound;
  if (late_binding()) return std::nullopt;
  // By the IDs' names, not the table served: withdrawn for the DRA driver
  // it is empty, and the containers admitted before keep their EFAs.
  std::vector<std::string> out;
  for (const std::string& id : ids) {
    const auto replica = topology::ParseReplicaId(id);
    std::string efa = replica ? replica->ibdev : id;
    if (std::find(out.begin(), out.end(), efa) == out.end()) out.push_back(std::move(efa));
  }
  return out;
}

void Daemon::Wake() { loop_.Wake(); }

void Daemon::Stop() { loop_.Stop(); }

void Daemon::Heartbeat() {
  registered_now_ = registrar_.registered();
  standing_aside_now_ = registrar_.standing_aside();
  known_devices_ = tracker_.known_count();
  heartbeat_ns_ = std::max<int64_t>(1, options_.clock->Now().time_since_epoch().count());
}

std::optional<Clock::time_point> Daemon::heartbeat() const {
  const int64_t ns = heartbeat_ns_.load();
  if (ns == 0) return std::nullopt;
  return Clock::time_point(Clock::duration(ns));
}

void Daemon::TryRegister() {
  // Take in the events already queued (a kubelet.sock created before this
  // check is not a restart after this registration); on timers, look.
  HandleInotify();
  if (kubelet_watch_ < 0) LookForKubeletSocket();
  if (registrar_.registered() || guards_.withdrawn() || !registrar_.KubeletSocketPresent()) {
    return;  // inotify reports kubelet.sock
  }
  // A DRA driver may have started listening since the last probe (nothing
  // signals a listen()): probe again, never register beside it.
  if (CheckGuards()) tracker_.Rescan();
  if (guards_.withdrawn()) return;
  // Streams open before this attempt belong to the registration it
  // replaces: their ending (ours, when the server restarts below, or the
  // kubelet's) must not start another one.
  service_.BeginRegistration();
  // A stream that ended before this point (the restarted kubelet closing
  // the old one) is answered by this very registration: not another one.
  stream_ended_ = false;
  // The socket this registration reaches, when it is the same before and
  // after: its creation, reported after the registration, is no restart.
  const std::optional<FileIdentity> before = Identify(registrar_.kubelet_socket());
  registrar_.Register();
  registered_to_.reset();
  if (registrar_.registered() && before && before->present &&
      Identify(registrar_.kubelet_socket()) == before) {
    registered_to_ = before;
  }
}

void Daemon::HandleInotify() {
  alignas(inotify_event) char buf[4096];
  bool rescan = false;
  bool guards = false;
  bool report = false;
  bool overflow = false;
  while (watches_.fd() >= 0) {
    ssize_t n = ::read(watches_.fd(), buf, sizeof buf);
    if (n <= 0) break;
    for (char* p = buf; p < buf + n;) {
      auto* ev = reinterpret_cast<inotify_event*>(p);
      p += sizeof(inotify_event) + ev->len;
      std::string name = ev->len ? ev->name : "";
      if (ev->mask & IN_Q_OVERFLOW) {
        overflow = true;
      } else if (ev->wd == kubelet_watch_) {
        if (ev->mask & IN_IGNORED) {
          kubelet_watch_ = -1;  // the directory went: on timers until watched again
        } else if (name == "kubelet.sock" && (ev->mask & (IN_CREATE | IN_MOVED_TO)) &&
                   !RegisteredTo(Identify(registrar_.kubelet_socket()))) {
          registrar_.RegisterAgainNow(Registrar::Reason::kKubeletSocketCreated);
        } else if (name == kPluginSocketDir && (ev->mask & (IN_DELETE | IN_MOVED_FROM))) {
          registrar_.RegisterAgainNow(Registrar::Reason::kPluginSocketDeleted);
        } else if (name == kCheckpointFile) {
          guards = true;  // the MOFED guard reads it
          report = true;  // a container was admitted or removed
        }
      } else if (guards_.TakeWatchEvent(ev->wd, ev->mask)) {
        // Late binding's own specs (and their temporary files) in a CDI
        // dir the MOFED guard watches are no guard's business.
        if ((name.starts_with(kCdiSpecPrefix) ||
             name.starts_with(std::string(".") + kCdiSpecPrefix))) {
          continue;
        }
        guards = true;
        guards_.ProbeDraSoon();  // a new socket: probe it quickly
      } else if (tracker_.TakeWatchEvent(ev->wd, ev->mask)) {
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
  if (rescan) tracker_.Rescan();
  if (report) ReportAlignment();
}

void Daemon::PeriodicCheck() {
  // One wake-up per interval for all periodic work, not one per kind.
  next_periodic_ = options_.clock->Now() + options_.rescan_interval;
  if (!late_binder_->recovered()) RecoverBindings();
  // Without inotify (or a watch), what its events would have said: the
  // watch asked for again first, so that a change after this look is
  // reported; the look also when it was given now (a change before it was).
  const bool on_timers = kubelet_watch_ < 0;
  WatchKubeletDir();
  if (on_timers) LookForKubeletSocket();
  LookForPluginSocket();
  LookAtRdmaNetnsMode();
  // The guards and the device tracker ask for their own watches again.
  tracker_.PeriodicLook(/*force=*/CheckGuards());
  ReportAlignment(/*periodic=*/true);
}

void Daemon::ReportAlignment(bool periodic) {
  next_report_ = Clock::time_point::max();
  if (!tracker_.has_devices()) return;  // no EFA: no container holds one
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
  ReleaseGone();
  // Admissions change the checkpoint (and are reported on its inotify
  // event); a periodic pass over the same checkpoint would ask
  // pod-resources for nothing new.
  if (periodic && checkpoint == reported_checkpoint_) return;
  if (aligner_ && tracker_.model()) {
    switch (aligner_->Report(*tracker_.model())) {
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
  const GuardVerdict verdict = guards_.Check(tracker_.has_devices(), registrar_.registered());
  if (verdict.register_again) registrar_.RegisterAgainNow(Registrar::Reason::kDraDriverGone);
  return verdict.devices_changed;
}

void Daemon::ReleaseGone() {
  next_release_ = late_binder_->ReleaseGone().value_or(Clock::time_point::max());
  const int renamed = late_binder_->BoundUnderOtherName();
  if (renamed > 0 && renamed != bound_under_other_name_.load()) {
    spdlog::warn(
        "{} running container(s) hold EFAs late-bound under {}, which this daemon no longer "
        "serves: they keep them while they run, but the kubelet cannot restart them (it has no "
        "plugin of that name to call PreStartContainer on); recreate their pods, or serve that "
        "name again (sharing.renameByDefault)",
        renamed, options_.resource_name == kResourceName ? kSharedResourceName : kResourceName);
  }
  bound_under_other_name_ = renamed;
  if (tracker_.has_devices()) late_binder_->BindUnstarted(*service_.Table());
  const bool missing_changed = UpdateHeldMissing();
  std::map<std::string, std::string> reserved = late_binder_->Reserved();
  if (reserved == reserved_) {
    if (missing_changed) tracker_.Publish();
    return;
  }
  if (reserved.empty()) {
    spdlog::info("no EFA is held under an earlier configuration any more");
  } else {
    for (const auto& [efa, why] : reserved) {
      if (!reserved_.count(efa)) spdlog::warn("EFA {} is given to no new container: {}", efa, why);
    }
  }
  reserved_ = std::move(reserved);
  {
    absl::MutexLock lock(&reserved_mu_);
    reserved_efas_.clear();
    for (const auto& [efa, why] : reserved_) reserved_efas_.insert(efa);
  }
  tracker_.Publish();
}

bool Daemon::UpdateHeldMissing() {
  std::optional<std::map<std::string, std::string>> missing = HeldMissing();
  if (!missing || *missing == held_missing_) return false;
  for (const auto& [efa, why] : *missing) {
    if (!held_missing_.count(efa)) spdlog::warn("EFA {} is listed Unhealthy: {}", efa, why);
  }
  held_missing_ = *std::move(missing);
  return true;
}

namespace {

// EFA -> PCI address, from an Allocate answer's EFA_DEVICES and
// EFA_PCI_ADDRESSES (the same order); empty when it has not both, alike.
std::map<std::string, std::string> AllocatedPciAddresses(
    const v1beta1::ContainerAllocateResponse& response) {
  auto env = [&](const char* name) -> std::vector<std::string> {
    auto it = response.envs().find(name);
    if (it == response.envs().end() || it->second.empty()) return {};
    return absl::StrSplit(it->second, ',');
  };
  const std::vector<std::string> names = env(kEnvDevices);
  const std::vector<std::string> addresses = env(kEnvPciAddresses);
  std::map<std::string, std::string> out;
  if (names.size() != addresses.size()) return out;
  for (size_t i = 0; i < names.size(); ++i) out.emplace(names[i], addresses[i]);
  return out;
}

}  // namespace

std::optional<std::map<std::string, std::string>> Daemon::HeldMissing() const {
  std::map<std::string, std::string> missing;
  if (late_binding()) return missing;
  const auto checkpoint =
      aligner_ ? aligner_->Checkpoint()
               : std::make_shared<const CheckpointCache::Result>(
                     ReadCheckpoint(options_.kubelet_dir / "device-plugins" / kCheckpointFile));
  if (!checkpoint->ok()) return std::nullopt;
  for (const CheckpointEntry& e : (*checkpoint)->entries) {
    if (e.resource_name != options_.resource_name) continue;
    // The EFAs' PCI addresses, from the Allocate answer: an EFA found under
    // another name since (udev renamed efa_0) is not missing.
    const std::map<std::string, std::string> pci_of = AllocatedPciAddresses(e.alloc_resp);
    for (const std::string& id : e.device_ids) {
      const auto replica = topology::ParseReplicaId(id);
      const std::string efa = replica ? replica->ibdev : id;
      auto pci = pci_of.find(efa);
      if (tracker_.Knows(efa) || pci == pci_of.end() || tracker_.KnowsPci(pci->second)) continue;
      missing.emplace(
          efa, absl::StrCat("not found since the daemon started, but pod ", e.pod_uid,
                            " container \"", e.container_name, "\" holds it (kubelet checkpoint)"));
    }
  }
  return missing;
}

void Daemon::RecoverBindings() {
  // Before serving: no PreStartContainer may bind, and no Allocate give, an
  // EFA a spec holds.
  if (late_binder_->Recover().ok()) ReleaseGone();
}

bool Daemon::OpenEventSources() {
  if (absl::Status opened = loop_.Open(); !opened.ok()) {
    spdlog::error("{}", std::string(opened.message()));
    return false;
  }
  fds_->uevent = topology::OpenUeventSocket();
  loop_.Watch(fds_->uevent, [this] {
    if (topology::DrainUevents(fds_->uevent)) tracker_.Rescan();
  });
  // inotify only makes the daemon react sooner: without it (logged,
  // counted) the periodic pass looks, and asks for it again.
  std::error_code ec;
  fs::create_directories(options_.kubelet_dir / "device-plugins", ec);
  WatchKubeletDir();
  return true;
}

void Daemon::WatchKubeletDir() {
  if (watches_.Open()) loop_.Watch(watches_.fd(), [this] { HandleInotify(); });
  if (kubelet_watch_ >= 0) return;
  kubelet_watch_ = watches_
                       .Add(options_.kubelet_dir / "device-plugins",
                            IN_CREATE | IN_MOVED_TO | IN_DELETE | IN_MOVED_FROM | IN_CLOSE_WRITE)
                       .wd;
}

void Daemon::LookAtRdmaNetnsMode() {
  const absl::StatusOr<std::optional<bool>> shared =
      topology::ReadRdmaNetnsShared(options_.roots.sysfs);
  if (!shared.ok()) {
    // Says nothing of the mode: the last answer stands. Counted; logged
    // once while the cause lasts.
    rdma_netns_read_errors_.fetch_add(1);
    const std::string cause(shared.status().message());
    if (cause == rdma_netns_read_error_) return;
    rdma_netns_read_error_ = cause;
    spdlog::warn(
        "cannot read the RDMA subsystem's network namespace mode: {}; keeping the last "
        "answer ({})",
        cause, rdma_netns_exclusive_.load() ? "exclusive" : "shared");
    return;
  }
  if (!rdma_netns_read_error_.empty()) {
    spdlog::info("the RDMA subsystem's network namespace mode can be read again (was: {})",
                 rdma_netns_read_error_);
    rdma_netns_read_error_.clear();
  }
  // No ib_core: nothing to say, the last answer stands.
  if (!shared->has_value()) return;
  const bool exclusive = !**shared;
  if (exclusive == rdma_netns_exclusive_.exchange(exclusive)) return;
  if (!exclusive) {
    spdlog::info("the RDMA subsystem shares its devices among network namespaces again");
    return;
  }
  spdlog::warn(
      "the RDMA subsystem is in exclusive network namespace mode (ib_core's netns_mode N): an "
      "EFA is usable, and seen, only in the network namespace it is in. Containers outside the "
      "host's cannot open the EFAs they are given (uverbs open fails with EPERM), and EFAs a DRA "
      "driver moves into pods are out of this daemon's sight. `rdma system set netns shared` "
      "shares them again (docs/runbook.md, EfaRdmaNetnsExclusive)");
}

bool Daemon::RegisteredTo(const std::optional<FileIdentity>& kubelet_socket) const {
  return registrar_.registered() && registered_to_ && kubelet_socket == registered_to_;
}

void Daemon::LookForKubeletSocket() {
  // Compared by inode and change time: a new socket may reuse the old
  // inode number, not at the same instant. Absent to present counts as
  // created; present to absent does not (a kubelet stopping).
  const std::optional<FileIdentity> now = Identify(registrar_.kubelet_socket());
  if (!now) return;  // cannot tell: the next look tells
  if (kubelet_socket_seen_ && now->present && *now != *kubelet_socket_seen_) {
    registrar_.RegisterAgainNow(Registrar::Reason::kKubeletSocketCreated);
  }
  kubelet_socket_seen_ = now;
}

void Daemon::LookForPluginSocket() {
  // Our socket deleted by someone (the kubelet keeps it; inotify reports
  // only its directory going): serve and register again. An error other
  // than absence tells nothing.
  const std::optional<FileIdentity> ours = Identify(registrar_.plugin_socket());
  if (registrar_.registered() && ours && !ours->present) {
    registrar_.RegisterAgainNow(Registrar::Reason::kPluginSocketDeleted);
  }
}

void Daemon::Start() {
  tracker_.Rescan();
  LookAtRdmaNetnsMode();
  // Alive from here on: /healthz must not wait for the first registration,
  // which may block for the registration's timeout (the idle process
  // answered 200 until it exec'ed this one).
  Heartbeat();
  RecoverBindings();
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
      // Retried with the registration (TryRegister), whatever the cause;
      // standing aside for another device plugin is no error, and logged.
      if (!absl::IsAlreadyExists(served)) {
        spdlog::error("cannot serve the device plugin API: {}", std::string(served.message()));
      }
    }
  }
  if (!registrar_.registered() && !guards_.withdrawn() && late_binder_->recovered() &&
      options_.clock->Now() >= registrar_.next_attempt()) {
    TryRegister();
  }
}

Clock::time_point Daemon::NextRegistration() const {
  if (tracker_.has_devices() && !registrar_.registered() && !guards_.withdrawn() &&
      late_binder_->recovered() && registrar_.KubeletSocketPresent()) {
    return registrar_.next_attempt();
  }
  return Clock::time_point::max();
}

void Daemon::Hangup() {
  spdlog::info("SIGHUP: rescanning and registering again");
  tracker_.Rescan();
  registrar_.RegisterAgainNow(Registrar::Reason::kSighup);
}

void Daemon::TakeStreamEnd() {
  if (stream_ended_.exchange(false) && registrar_.registered()) {
    registrar_.RegisterAgainNow(Registrar::Reason::kStreamEnded);
  }
}

void Daemon::AnnounceIdle() {
  // An incomplete first scan is no proof of a node without EFA: the
  // periodic pass looks again before the daemon idles.
  if (announced_idle_ || tracker_.has_devices() || !tracker_.complete()) return;
  announced_idle_ = true;
  if (!serving_started_ && options_.on_idle) options_.on_idle();
  spdlog::info("no EFA on this node; idle until one appears");
}

int Daemon::Run() {
  if (!OpenEventSources()) return 1;
  Start();
  while (!loop_.stopped()) {
    TakeStreamEnd();
    AnnounceIdle();
    if (tracker_.has_devices()) ServeAndRegister();
    // After the registration: the kubelet does not wait for hwloc. Claims
    // bound before their containers start wait for it (BindUnstarted).
    if (tracker_.UpdateModel()) ReleaseGone();
    Heartbeat();
    // Waits for an event, a due timer or the next registration attempt
    // (made by the next pass), handles what came and runs the due timers.
    if (!loop_.RunOnce(NextRegistration())) break;
  }
  // Standing aside, the socket is the other device plugin's: left to it.
  const bool aside = registrar_.standing_aside();
  registrar_.StopServer();
  if (aside) {
    spdlog::info("stopped; {} left to the device plugin serving it", plugin_socket().string());
  } else {
    spdlog::info("stopped; {} removed", plugin_socket().string());
  }
  return 0;
}

}  // namespace efa::plugin
