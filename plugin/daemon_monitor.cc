#include "plugin/daemon_monitor.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "plugin/device_plugin_service.h"
#include "topology/efa_counters.h"
#include "topology/replica_id.h"

namespace efa::plugin {
namespace {

// The labels of an EFA's series.
std::vector<prometheus::ClientMetric::Label> EfaLabels(const topology::EfaDevice& d) {
  return {{"efa", d.ibdev},
          {"pci_address", d.pci.ToString()},
          {"numa_node", d.numa_node ? std::to_string(*d.numa_node) : "-1"}};
}

// A family named kMetricPrefix + `name`, appended to `out`; the reference
// is valid until the next is added.
prometheus::MetricFamily& Family(std::vector<prometheus::MetricFamily>& out,
                                 const std::string& name, std::string help,
                                 prometheus::MetricType type) {
  return AddFamily(out, absl::StrCat(kMetricPrefix, name), std::move(help), type);
}

// The labels of a container's series.
std::vector<prometheus::ClientMetric::Label> ContainerLabels(const EfaHolder& h) {
  return {{"namespace", h.pod_namespace}, {"pod", h.pod}, {"container", h.container}};
}

// For an EFA the container holds through a ResourceClaim, the claim's and
// the device's names, as dcgm-exporter labels the GPUs of DRA claims
// (NVIDIA/dcgm-exporter internal/pkg/transformation/const.go).
void AddDraLabels(const EfaHolder& h, const std::string& ibdev,
                  std::vector<prometheus::ClientMetric::Label>& labels) {
  auto dra = h.dra.find(ibdev);
  if (dra == h.dra.end()) return;
  const DraDevice& d = dra->second;
  labels.push_back({"dra_claim_name", d.claim_name});
  labels.push_back({"dra_claim_namespace", d.claim_namespace});
  labels.push_back({"dra_driver_name", d.driver});
  labels.push_back({"dra_pool_name", d.pool});
  labels.push_back({"dra_device_name", d.device});
}

// The devices the daemon advertises, by health.
struct AdvertisedHealth {
  int healthy = 0, unhealthy = 0;
  std::set<std::string> unhealthy_efas;  // physical EFAs, for the alert to name
};

AdvertisedHealth Advertised(const Daemon& daemon) {
  AdvertisedHealth out;
  const v1beta1::ListAndWatchResponse advertised = daemon.advertised();
  for (const auto& d : advertised.devices()) {
    (d.health() == kHealthy ? out.healthy : out.unhealthy)++;
    if (d.health() == kHealthy) continue;
    const auto replica = topology::ParseReplicaId(d.id());
    out.unhealthy_efas.insert(replica ? replica->ibdev : d.id());
  }
  return out;
}

// The devices advertised Unhealthy, the registration with the kubelet,
// discovery's errors and the owner loop's heartbeat.
void CollectOwnerLoop(const Daemon& daemon, const std::set<std::string>& unhealthy_efas,
                      std::vector<prometheus::MetricFamily>& out) {
  using prometheus::MetricType;
  auto& unhealthy_by_efa =
      Family(out, "efa_advertised_unhealthy",
             "1 for each EFA advertised Unhealthy to the kubelet, whatever the cause (gone, "
             "device health, MOFED protect); absent while Healthy.",
             MetricType::Gauge);
  for (const std::string& efa : unhealthy_efas) AddSample(unhealthy_by_efa, 1, {{"efa", efa}});
  auto& reserved = Family(
      out, "efa_reserved",
      "1 for each EFA a running container holds under an earlier configuration (another "
      "alignment mode, resource name or replica count): advertised Unhealthy, so given to no "
      "new container, until that container ends; absent otherwise.",
      MetricType::Gauge);
  for (const std::string& efa : daemon.reserved_efas()) AddSample(reserved, 1, {{"efa", efa}});
  AddSample(Family(out, "late_bound_unserved_name",
                   "Running containers late-bound under the EFA resource name the daemon no "
                   "longer serves (sharing's rename changed it): they keep their EFAs while they "
                   "run, but the kubelet cannot restart them.",
                   MetricType::Gauge),
            daemon.bound_under_other_name());
  AddSample(
      Family(out, "registered", "1 while vpc.amazonaws.com/efa is registered.", MetricType::Gauge),
      daemon.registered() ? 1 : 0);
  AddSample(Family(out, "registrations_total", "Successful registrations with the kubelet.",
                   MetricType::Counter),
            daemon.registrations());
  AddSample(Family(out, "kubelet_restarts_total",
                   "Kubelet restarts seen (kubelet.sock re-created).", MetricType::Counter),
            daemon.kubelet_restarts());
  const Daemon::DiscoveryErrorCounts discovery = daemon.discovery_errors();
  auto& discovery_errors =
      Family(out, "discovery_errors_total",
             "Device discovery's listings (list) and device reads (read) that failed for a reason "
             "that says nothing about the devices (out of descriptors or memory), and reads of "
             "the RDMA subsystem's network namespace mode that failed (netns_mode); what they "
             "hid kept its last known state.",
             MetricType::Counter);
  AddSample(discovery_errors, static_cast<double>(discovery.list), {{"operation", "list"}});
  AddSample(discovery_errors, static_cast<double>(discovery.read), {{"operation", "read"}});
  AddSample(discovery_errors, static_cast<double>(daemon.rdma_netns_read_errors()),
            {{"operation", "netns_mode"}});
  AddSample(Family(out, "watches_unavailable",
                   "Directories the daemon cannot watch with inotify now: the kernel refused the "
                   "watch or gave no inotify instance (fs.inotify limits). While above 0 it runs "
                   "on its timers: the periodic pass looks for what their events would report.",
                   MetricType::Gauge),
            daemon.watches_unavailable());
  AddSample(Family(out, "rdma_netns_exclusive",
                   "1 while the RDMA subsystem is in exclusive network namespace mode (ib_core "
                   "netns_mode N): containers outside the host's network namespace cannot open "
                   "their EFAs, and EFAs a DRA driver moves into pods are out of the daemon's "
                   "sight.",
                   MetricType::Gauge),
            daemon.rdma_netns_exclusive() ? 1 : 0);
  const auto beat = daemon.heartbeat();
  AddSample(Family(out, "heartbeat_age_seconds",
                   "Seconds since the owner loop's last pass (see /healthz).", MetricType::Gauge),
            beat ? std::chrono::duration<double>(daemon.clock().Now() - *beat).count() : 0);
}

// The aligner's decisions and judgments, and late binding's events.
void CollectAlignment(const Daemon& daemon, std::vector<prometheus::MetricFamily>& out) {
  using prometheus::MetricType;
  const AlignmentStats* stats = daemon.alignment_stats();
  const AlignmentStats::Counts counts = stats ? stats->Get() : AlignmentStats::Counts{};
  auto& decisions = Family(
      out, "alignment_decisions_total",
      "GetPreferredAllocation decisions: targeted (the container's accelerators were known), "
      "predicted (none known yet), degraded (pod-resources failed).",
      MetricType::Counter);
  if (stats) {
    AddSample(decisions, counts.targeted, {{"decision", "targeted"}});
    AddSample(decisions, counts.predicted, {{"decision", "predicted"}});
    AddSample(decisions, counts.degraded, {{"decision", "degraded"}});
  }
  auto& judgments = Family(out, "alignment_judgments_total",
                           "Containers holding EFAs and accelerators, judged once after admission.",
                           MetricType::Counter);
  if (stats) {
    AddSample(judgments, counts.aligned, {{"result", "aligned"}});
    AddSample(judgments, counts.unaligned, {{"result", "unaligned"}});
  }
  auto& failures = Family(out, "alignment_report_failures_total",
                          "Judgment passes that pod-resources failed; retried with backoff.",
                          MetricType::Counter);
  if (stats) AddSample(failures, counts.report_failed, {});
  auto& events = Family(
      out, "late_binding_total",
      "Late binding: EFAs bound at PreStartContainer, or for a container that no call will come "
      "for before it starts (bound), kept for a restarted container (kept), failures to bind "
      "(failed), bindings released (released), recovered "
      "from the CDI dir at start (recovered), release passes the kubelet's records could "
      "not decide (undecided), and reads of the CDI dir that were not whole "
      "(recover_incomplete; retried, the daemon registers only after a whole one).",
      MetricType::Counter);
  if (const LateBinder* late = daemon.late_binder()) {
    const LateBindingCounts c = late->counts();
    AddSample(events, c.bound, {{"event", "bound"}});
    AddSample(events, c.kept, {{"event", "kept"}});
    AddSample(events, c.failed, {{"event", "failed"}});
    AddSample(events, c.released, {{"event", "released"}});
    AddSample(events, c.recovered, {{"event", "recovered"}});
    AddSample(events, c.undecided, {{"event", "undecided"}});
    AddSample(events, c.recover_incomplete, {{"event", "recover_incomplete"}});
  }
}

// The guards' findings: the MOFED guard's and the DRA guard's.
void CollectGuards(const GuardStatus& g, std::vector<prometheus::MetricFamily>& out) {
  using prometheus::MetricType;
  // Not looked yet: a node without EFA has nothing to guard.
  const bool looked = g.mofed_policy != MofedPolicy::kOff && g.checks > 0;
  auto& mofed = Family(
      out, "mofed_state",
      "1 for the NVIDIA MOFED guard's current state (off, on, unknown); all 0 with the policy off.",
      MetricType::Gauge);
  for (MofedState s : {MofedState::kOff, MofedState::kOn, MofedState::kUnknown}) {
    AddSample(mofed, looked && g.mofed.state == s ? 1 : 0,
              {{"state", std::string(MofedStateName(s))}});
  }
  AddSample(Family(out, "dra_driver_present", "1 while the EFA DRA driver (dra.net) is registered.",
                   MetricType::Gauge),
            g.dra.present ? 1 : 0);
  AddSample(Family(out, "efas_held_unhealthy",
                   "1 while MOFED policy protect reports every EFA Unhealthy.", MetricType::Gauge),
            g.efas_held_unhealthy ? 1 : 0);
  AddSample(Family(out, "withdrawn",
                   "1 while vpc.amazonaws.com/efa is withdrawn for the DRA driver (always under "
                   "draPolicy monitor).",
                   MetricType::Gauge),
            g.withdrawn ? 1 : 0);
  AddSample(Family(out, "guard_checks_total", "Guard checks run.", MetricType::Counter),
            static_cast<double>(g.checks));
  AddSample(Family(out, "mofed_checks_incomplete_total",
                   "MOFED guard checks that stopped at a bound (the time box, the cap on "
                   "nvidia-device-plugin processes read, a file's size) or for want of "
                   "descriptors or memory, and kept the previous verdict.",
                   MetricType::Counter),
            static_cast<double>(g.mofed_incomplete));
  AddSample(Family(out, "dra_checks_incomplete_total",
                   "DRA guard checks that could not list the plugin registry whole or probe a "
                   "driver's socket, and kept the previous answer.",
                   MetricType::Counter),
            static_cast<double>(g.dra_incomplete));
}

// Each counter of the efa driver per EFA, and those shown per container
// (EfaCounter::per_container) per container holding the EFA.
void CollectCounterValues(const EfaCounterSnapshot& snapshot,
                          std::vector<prometheus::MetricFamily>& out) {
  using prometheus::MetricType;
  const auto& counters = topology::EfaCounters();
  std::map<std::string, const EfaCounterSnapshot::Efa*> by_ibdev;
  for (const auto& efa : snapshot.efas) by_ibdev[efa.device.ibdev] = &efa;
  for (size_t i = 0; i < counters.size(); ++i) {
    const topology::EfaCounter& c = counters[i];
    auto& per_efa = Family(out, absl::StrCat("efa_", c.name, "_total"),
                           absl::StrCat(c.help, " The efa driver's ", c.name, " counter."),
                           MetricType::Counter);
    for (const auto& efa : snapshot.efas) {
      if (efa.counters.values[i]) {
        AddSample(per_efa, static_cast<double>(*efa.counters.values[i]), EfaLabels(efa.device));
      }
    }
    if (!c.per_container) continue;
    auto& held = Family(
        out, absl::StrCat("container_efa_", c.name, "_total"),
        absl::StrCat("The efa driver's ", c.name,
                     " counter of each EFA a container holds now, labelled with the container "
                     "(with sharing, every sharer of an EFA shows the EFA's whole count)."),
        MetricType::Counter);
    for (const auto& container : snapshot.containers) {
      for (const std::string& ibdev : container.holder.efas) {
        auto efa = by_ibdev.find(ibdev);
        if (efa == by_ibdev.end() || !efa->second->counters.values[i]) continue;
        auto labels = ContainerLabels(container.holder);
        for (auto& label : EfaLabels(efa->second->device)) labels.push_back(std::move(label));
        AddDraLabels(container.holder, ibdev, labels);
        AddSample(held, static_cast<double>(*efa->second->counters.values[i]), std::move(labels));
      }
    }
  }
}

// The counters not read at the latest read, and the EFAs device health
// holds Unhealthy by them.
void CollectCounterProblems(const EfaCounterSnapshot& snapshot,
                            std::vector<prometheus::MetricFamily>& out) {
  using prometheus::MetricType;
  // Each family's reference is valid until the next is added.
  auto& unavailable =
      Family(out, "efa_counters_unavailable",
             "EFA counters not read at the latest read: missing (the driver has no such counter, "
             "as on older kernels), error (the device answered the read with an error) or "
             "unreadable (not read for a reason that says nothing about the device: out of "
             "descriptors or memory, not a counter).",
             MetricType::Gauge);
  for (const auto& efa : snapshot.efas) {
    AddSample(unavailable, efa.counters.missing,
              {{"efa", efa.device.ibdev}, {"reason", "missing"}});
    AddSample(unavailable, static_cast<double>(efa.counters.errors.size()),
              {{"efa", efa.device.ibdev}, {"reason", "error"}});
    AddSample(unavailable, static_cast<double>(efa.counters.unreadable.size()),
              {{"efa", efa.device.ibdev}, {"reason", "unreadable"}});
  }
  auto& unhealthy =
      Family(out, "efa_unhealthy_by_counters",
             "1 for each EFA device health holds Unhealthy, by reason: keep_alive "
             "(keep_alive_rcvd stopped) or admin_errors (admin commands failing); only with "
             "deviceHealth on.",
             MetricType::Gauge);
  for (const auto& efa : snapshot.efas) {
    if (!efa.unhealthy.empty()) {
      AddSample(unhealthy, 1, {{"efa", efa.device.ibdev}, {"reason", efa.unhealthy_kind}});
    }
  }
}

}  // namespace

std::string_view GrpcCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "UNKNOWN";
  }
}

ProbeVerdict Readiness(bool registered, int known_devices, const GuardStatus& guards,
                       const std::string& resource, bool standing_aside) {
  // Guard findings are logs and metrics, not readiness: a 503 here would
  // stall a DaemonSet rollout on every such node although the daemon
  // serves as configured.
  if (guards.withdrawn && guards.dra_policy == DraPolicy::kMonitor) {
    return {true, absl::StrCat(
                      "this node's EFAs are handed out by DRA (--dra-policy=monitor): ", resource,
                      " is never registered; their health and traffic are "
                      "exported (",
                      guards.dra.evidence, ")")};
  }
  if (guards.withdrawn) {
    return {true,
            absl::StrCat("the EFA DRA driver (", guards.dra.driver,
                         ") serves this node's EFAs: ", resource,
                         " is withdrawn, as --dra-policy=yield asks (", guards.dra.evidence, ")")};
  }
  if (registered) return {true, absl::StrCat(resource, " is registered with the kubelet")};
  if (standing_aside) {
    return {true, absl::StrCat("another device plugin serves ", resource,
                               " on this node (the plugin's host service?): standing aside")};
  }
  if (known_devices == 0) return {true, kNoEfaReadiness};
  return {false, absl::StrCat(resource, " is not registered with the kubelet yet")};
}

DaemonMonitor::DaemonMonitor(MonitorOptions options)
    : options_(std::move(options)),
      expected_efas_(ResolveInstanceType(options_.instance_type, options_.sysfs_root),
                     options_.expected_efa_count) {
  allocations_ = &prometheus::BuildCounter()
                      .Name(absl::StrCat(kMetricPrefix, "allocations_total"))
                      .Help("Allocate calls, by gRPC status code.")
                      .Register(registry_);
  // Every code Allocate answers, at 0 from the start: a series born at its
  // first error, with that error's count, is no increase() to Prometheus,
  // which would miss the first burst of each code after every restart.
  for (grpc::StatusCode code : kAllocateCodes) {
    allocations_->Add({{"code", std::string(GrpcCodeName(code))}});
  }
  allocations_ok_ = &allocations_->Add({{"code", "OK"}});
  allocation_size_ = &prometheus::BuildHistogram()
                          .Name(absl::StrCat(kMetricPrefix, "allocation_size"))
                          .Help("EFAs given to each container by Allocate.")
                          .Register(registry_)
                          .Add({}, prometheus::Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32});
  efa_allocations_ =
      &prometheus::BuildCounter()
           .Name(absl::StrCat(kMetricPrefix, "efa_allocations_total"))
           .Help(
               "Containers given each physical EFA by Allocate (with sharing, its replicas' "
               "containers).")
           .Register(registry_);
  auto& rpc = prometheus::BuildHistogram()
                  .Name(absl::StrCat(kMetricPrefix, "rpc_duration_seconds"))
                  .Help("Time spent in the device-plugin RPC handlers, by method.")
                  .Register(registry_);
  for (RpcMethod m : {RpcMethod::kGetDevicePluginOptions, RpcMethod::kGetPreferredAllocation,
                      RpcMethod::kAllocate, RpcMethod::kPreStartContainer}) {
    rpc_duration_[static_cast<size_t>(m)] = &rpc.Add(
        {{"method", std::string(RpcMethodName(m))}},
        prometheus::Histogram::BucketBoundaries{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                                0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5});
  }
}

void DaemonMonitor::Attach(DaemonOptions& options) {
  options.rpc_observer = this;
  options.on_inventory = [this](const topology::Inventory& inventory) {
    expected_efas_.Observe(static_cast<int>(inventory.devices.size()));
  };
}

void DaemonMonitor::RpcHandled(RpcMethod method, grpc::StatusCode code,
                               std::chrono::nanoseconds elapsed) {
  prometheus::Histogram* h = rpc_duration_[static_cast<size_t>(method)];
  if (h != nullptr) h->Observe(std::chrono::duration<double>(elapsed).count());
  if (method != RpcMethod::kAllocate) return;
  if (code == grpc::StatusCode::OK) {
    allocations_ok_->Increment();
  } else {
    allocations_->Add({{"code", std::string(GrpcCodeName(code))}}).Increment();
  }
}

void DaemonMonitor::ContainerAllocated(size_t devices) {
  allocation_size_->Observe(static_cast<double>(devices));
}

void DaemonMonitor::EfaAllocated(std::string_view ibdev) {
  efa_allocations_->Add({{"efa", std::string(ibdev)}}).Increment();
}

void DaemonMonitor::CollectState(std::vector<prometheus::MetricFamily>& out) const {
  CollectExpectedEfas(expected_efas_.latest(), out);
  const Daemon* daemon = daemon_.load();
  const AdvertisedHealth advertised = daemon ? Advertised(*daemon) : AdvertisedHealth{};
  // Idle as long as no EFA was ever found: the daemon waiting in its own
  // loop, when it cannot exec the idle process, reads as that process.
  const bool serving =
      daemon != nullptr && (daemon->known_devices() > 0 || daemon->registrations() > 0);
  const char* mode = !serving                                                   ? kModeIdle
                     : daemon->guard_status().dra_policy == DraPolicy::kMonitor ? kModeMonitoring
                                                                                : kModeServing;
  CollectIdentity(mode, advertised.healthy, advertised.unhealthy, out);
  if (daemon == nullptr) return;
  CollectOwnerLoop(*daemon, advertised.unhealthy_efas, out);
  CollectAlignment(*daemon, out);
  CollectGuards(daemon->guard_status(), out);
  AddSample(Family(out, "checkpoint_entries_skipped",
                   "Entries of the kubelet checkpoint skipped at its latest read because they "
                   "cannot be parsed (the others are still used).",
                   prometheus::MetricType::Gauge),
            static_cast<double>(daemon->checkpoint_entries_skipped()));
}

void DaemonMonitor::CollectCounters(const EfaCounterSnapshot& snapshot,
                                    std::vector<prometheus::MetricFamily>& out) {
  using prometheus::MetricType;
  CollectCounterValues(snapshot, out);
  auto& idle = Family(out, "container_idle_efas",
                      "EFAs a running container holds that moved no bytes for the idle timeout "
                      "(allocated but unused: NCCL or libfabric may have fallen back to TCP).",
                      MetricType::Gauge);
  for (const auto& container : snapshot.containers) {
    AddSample(idle, static_cast<double>(container.idle.size()), ContainerLabels(container.holder));
  }
  CollectCounterProblems(snapshot, out);
  // "efa_counters_", as efa_counters_unavailable: a counter named
  // "..._counter_..." reads to promtool's lint as naming its type.
  AddSample(Family(out, "efa_counters_reads_total",
                   "Reads of the EFAs' counters (on a scrape, or for device health; at most one "
                   "per counterInterval).",
                   MetricType::Counter),
            static_cast<double>(snapshot.reads));
  AddSample(Family(out, "efa_counters_files_unreadable_total",
                   "Counter files not read for a reason that says nothing about the device (out "
                   "of descriptors or memory, not a counter); device health keeps its verdict "
                   "meanwhile.",
                   MetricType::Counter),
            static_cast<double>(snapshot.unreadable_total));
  AddSample(Family(out, "efa_counters_holder_errors_total",
                   "Reads of the counters whose question to pod-resources (which containers "
                   "hold which EFAs) failed; the containers known before are kept.",
                   MetricType::Counter),
            static_cast<double>(snapshot.holder_errors));
  if (snapshot.claim_lookups < 0) return;
  AddSample(Family(out, "claim_lookups_total",
                   "Lookups in the API server of a ResourceClaim the kubelet lists without "
                   "devices (claimLookup).",
                   MetricType::Counter),
            static_cast<double>(snapshot.claim_lookups));
  AddSample(Family(out, "claim_lookup_errors_total",
                   "Claim lookups that failed (the API server unreachable, the token refused, "
                   "the claim not allocated); their containers get no per-container series "
                   "until one succeeds.",
                   MetricType::Counter),
            static_cast<double>(snapshot.claim_lookup_errors));
}

std::string DaemonMonitor::CountersText(std::shared_ptr<const EfaCounterSnapshot> snapshot) const {
  absl::MutexLock lock(&counters_mu_);
  if (snapshot != counters_snapshot_) {
    std::vector<prometheus::MetricFamily> families;
    CollectCounters(*snapshot, families);
    counters_text_ = SerializeMetrics(std::move(families));
    counters_snapshot_ = std::move(snapshot);
  }
  return counters_text_;
}

HttpResponse DaemonMonitor::Metrics() const {
  std::vector<prometheus::MetricFamily> families = registry_.Collect();
  CollectState(families);
  CollectEndpointCounters(http_, families);
  std::string text = SerializeMetrics(std::move(families));
  if (const Daemon* daemon = daemon_.load()) text += CountersText(daemon->efa_counters().Sample());
  return {200, kMetricsContentType, std::move(text)};
}

HttpResponse DaemonMonitor::Healthz() const {
  const Daemon* daemon = daemon_.load();
  if (daemon == nullptr) return Probe(Liveness(std::nullopt, {}, options_.rescan_interval));
  return Probe(Liveness(daemon->heartbeat(), daemon->clock().Now(), options_.rescan_interval));
}

HttpResponse DaemonMonitor::Readyz() const {
  const Daemon* daemon = daemon_.load();
  if (daemon == nullptr) return Probe({false, "the daemon has not started"});
  return Probe(Readiness(daemon->registered(), daemon->known_devices(), daemon->guard_status(),
                         daemon->resource_name(), daemon->standing_aside()));
}

std::map<std::string, HttpHandler> DaemonMonitor::Routes() const {
  std::map<std::string, HttpHandler> routes = ProbeRoutes();
  routes.emplace("/metrics", [this] { return Metrics(); });
  return routes;
}

std::map<std::string, HttpHandler> DaemonMonitor::ProbeRoutes() const {
  return {{"/healthz", [this] { return Healthz(); }}, {"/readyz", [this] { return Readyz(); }}};
}

}  // namespace efa::plugin
