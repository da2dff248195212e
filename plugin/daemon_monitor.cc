#include "plugin/daemon_monitor.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "plugin/device_plugin_service.h"

namespace efa::plugin {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kLivenessSlack = std::chrono::seconds(15);

std::string Seconds(Clock::duration d) {
  const double s = std::chrono::duration<double>(d).count();
  return absl::StrCat(std::round(s * 10) / 10, "s");
}

HttpResponse Probe(const ProbeVerdict& verdict) {
  return {verdict.ok ? 200 : 503, "text/plain; charset=utf-8",
          absl::StrCat(verdict.ok ? "ok: " : "not ok: ", verdict.reason, "\n")};
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

ProbeVerdict Liveness(std::optional<Clock::time_point> heartbeat, Clock::time_point now,
                      std::chrono::milliseconds rescan_interval) {
  if (!heartbeat) return {false, "the owner loop has not started"};
  const Clock::duration age = now - *heartbeat;
  const Clock::duration limit = 3 * rescan_interval + kLivenessSlack;
  if (age > limit) {
    return {false, absl::StrCat("the owner loop last ran ", Seconds(age), " ago (limit ",
                                Seconds(limit), ")")};
  }
  return {true, absl::StrCat("the owner loop ran ", Seconds(age), " ago")};
}

ProbeVerdict Readiness(bool registered, int known_devices, const GuardStatus& guards) {
  if (guards.mofed.state == MofedState::kOn) {
    return {false, absl::StrCat("MOFED conflict: the NVIDIA device plugin gives every GPU "
                                "container all /dev/infiniband/uverbs* devices (",
                                absl::StrJoin(guards.mofed.evidence, "; "), ")")};
  }
  if (guards.dra.present) {
    if (guards.withdrawn) {
      return {false,
              absl::StrCat("the EFA DRA driver (", kDraDriverName, ") serves this node's EFAs, so ",
                           kResourceName, " is withdrawn (", guards.dra.evidence, ")")};
    }
    return {false, absl::StrCat("the EFA DRA driver (", kDraDriverName,
                                ") serves this node's EFAs too (--dra-policy=ignore): the same "
                                "EFA may be given out twice (",
                                guards.dra.evidence, ")")};
  }
  if (registered) return {true, absl::StrCat(kResourceName, " is registered with the kubelet")};
  if (known_devices == 0) return {true, "no EFA on this node, nothing to register"};
  return {false, absl::StrCat(kResourceName, " is not registered with the kubelet yet")};
}

DaemonMonitor::DaemonMonitor(MonitorOptions options)
    : options_(std::move(options)),
      efa_count_(ResolveInstanceType(options_.instance_type, options_.sysfs_root),
                 options_.expected_efa_count) {
  constexpr char kPrefix[] = "efa_device_plugin_";
  auto name = [&](const char* n) { return absl::StrCat(kPrefix, n); };

  devices_ = &registry_.AddGauge(name("devices"),
                                 "EFAs advertised to the kubelet, by health (after the guards: "
                                 "none while withdrawn, all unhealthy under MOFED protect).",
                                 {"health"});
  efas_found_ = &registry_.AddGauge(name("efas_found"), "EFAs found on the node by the last scan.")
                     .WithLabels({});
  efas_expected_ = &registry_.AddGauge(
      name("efas_expected"),
      "EFAs the node should have (expectedEfaCount, else the instance type's count); absent "
      "when unknown.");
  registered_ =
      &registry_.AddGauge(name("registered"), "1 while vpc.amazonaws.com/efa is registered.").Get();
  registrations_ =
      &registry_
           .AddCounter(name("registrations_total"), "Successful registrations with the kubelet.")
           .Get();
  kubelet_restarts_ = &registry_
                           .AddCounter(name("kubelet_restarts_total"),
                                       "Kubelet restarts seen (kubelet.sock re-created).")
                           .Get();
  heartbeat_age_ = &registry_
                        .AddGauge(name("heartbeat_age_seconds"),
                                  "Seconds since the owner loop's last pass (see /healthz).")
                        .Get();

  allocations_ = &registry_.AddCounter(name("allocations_total"),
                                       "Allocate calls, by gRPC status code.", {"code"});
  allocations_ok_ = &allocations_->WithLabels({"OK"});
  allocation_size_ =
      &registry_
           .AddHistogram(name("allocation_size"), "EFAs given to each container by Allocate.",
                         {1, 2, 4, 8, 16, 32})
           .Get();
  efa_allocations_ = &registry_.AddCounter(
      name("efa_allocations_total"),
      "Containers given each physical EFA by Allocate (with sharing, its replicas' containers).",
      {"efa"});
  auto& rpc = registry_.AddHistogram(
      name("rpc_duration_seconds"), "Time spent in the device-plugin RPC handlers, by method.",
      {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5},
      {"method"});
  for (RpcMethod m : {RpcMethod::kGetDevicePluginOptions, RpcMethod::kGetPreferredAllocation,
                      RpcMethod::kAllocate, RpcMethod::kPreStartContainer}) {
    rpc_duration_[static_cast<size_t>(m)] = &rpc.WithLabels({std::string(RpcMethodName(m))});
  }

  decisions_ = &registry_.AddCounter(
      name("alignment_decisions_total"),
      "GetPreferredAllocation decisions: targeted (the container's accelerators were known), "
      "predicted (none known yet), degraded (pod-resources failed).",
      {"decision"});
  judgments_ = &registry_.AddCounter(
      name("alignment_judgments_total"),
      "Containers holding EFAs and accelerators, judged once after admission.", {"result"});
  late_binding_ = &registry_.AddCounter(
      name("late_binding_total"),
      "Late binding: EFAs bound at PreStartContainer (bound), kept for a restarted container "
      "(kept), PreStartContainer failures (failed), bindings released (released) and recovered "
      "from the CDI dir at start (recovered).",
      {"event"});

  mofed_state_ = &registry_.AddGauge(
      name("mofed_state"),
      "1 for the NVIDIA MOFED guard's current state (off, on, unknown); all 0 with the policy off.",
      {"state"});
  dra_present_ = &registry_
                      .AddGauge(name("dra_driver_present"),
                                "1 while the EFA DRA driver (dra.net) is registered.")
                      .Get();
  held_unhealthy_ = &registry_
                         .AddGauge(name("efas_held_unhealthy"),
                                   "1 while MOFED policy protect reports every EFA Unhealthy.")
                         .Get();
  withdrawn_ = &registry_
                    .AddGauge(name("withdrawn"),
                              "1 while vpc.amazonaws.com/efa is withdrawn for the DRA driver.")
                    .Get();
  guard_checks_ = &registry_.AddCounter(name("guard_checks_total"), "Guard checks run.").Get();

  registry_.AddCollector([this] { Collect(); });
}

void DaemonMonitor::Attach(DaemonOptions& options) {
  options.rpc_observer = this;
  options.on_inventory = [this](const topology::Inventory& inventory) {
    efa_count_.Observe(static_cast<int>(inventory.devices.size()));
  };
}

void DaemonMonitor::RpcHandled(RpcMethod method, grpc::StatusCode code,
                               std::chrono::nanoseconds elapsed) {
  Histogram* h = rpc_duration_[static_cast<size_t>(method)];
  if (h != nullptr) h->Observe(std::chrono::duration<double>(elapsed).count());
  if (method != RpcMethod::kAllocate) return;
  if (code == grpc::StatusCode::OK) {
    allocations_ok_->Increment();
  } else {
    allocations_->WithLabels({std::string(GrpcCodeName(code))}).Increment();
  }
}

void DaemonMonitor::ContainerAllocated(size_t devices) {
  allocation_size_->Observe(static_cast<double>(devices));
}

void DaemonMonitor::EfaAllocated(std::string_view ibdev) {
  efa_allocations_->WithLabels({std::string(ibdev)}).Increment();
}

void DaemonMonitor::Collect() {
  if (auto check = efa_count_.latest()) {
    efas_found_->Set(check->found);
    if (check->expected) efas_expected_->Get().Set(*check->expected);
  }
  const Daemon* daemon = daemon_.load();
  if (daemon == nullptr) return;

  int healthy = 0, unhealthy = 0;
  const v1beta1::ListAndWatchResponse advertised = daemon->advertised();
  for (const auto& d : advertised.devices()) {
    (d.health() == kHealthy ? healthy : unhealthy)++;
  }
  devices_->WithLabels({"healthy"}).Set(healthy);
  devices_->WithLabels({"unhealthy"}).Set(unhealthy);
  registered_->Set(daemon->registered() ? 1 : 0);
  registrations_->Set(daemon->registrations());
  kubelet_restarts_->Set(daemon->kubelet_restarts());
  if (auto beat = daemon->heartbeat()) {
    heartbeat_age_->Set(std::chrono::duration<double>(Clock::now() - *beat).count());
  }

  if (const AlignmentStats* stats = daemon->alignment_stats()) {
    const AlignmentStats::Counts c = stats->Get();
    decisions_->WithLabels({"targeted"}).Set(c.targeted);
    decisions_->WithLabels({"predicted"}).Set(c.predicted);
    decisions_->WithLabels({"degraded"}).Set(c.degraded);
    judgments_->WithLabels({"aligned"}).Set(c.aligned);
    judgments_->WithLabels({"unaligned"}).Set(c.unaligned);
  }
  if (const LateBinder* late = daemon->late_binder()) {
    const LateBindingCounts c = late->counts();
    late_binding_->WithLabels({"bound"}).Set(c.bound);
    late_binding_->WithLabels({"kept"}).Set(c.kept);
    late_binding_->WithLabels({"failed"}).Set(c.failed);
    late_binding_->WithLabels({"released"}).Set(c.released);
    late_binding_->WithLabels({"recovered"}).Set(c.recovered);
  }

  const GuardStatus g = daemon->guard_status();
  const bool looked = g.mofed_policy != MofedPolicy::kOff;
  for (MofedState s : {MofedState::kOff, MofedState::kOn, MofedState::kUnknown}) {
    mofed_state_->WithLabels({std::string(MofedStateName(s))})
        .Set(looked && g.mofed.state == s ? 1 : 0);
  }
  dra_present_->Set(g.dra.present ? 1 : 0);
  held_unhealthy_->Set(g.efas_held_unhealthy ? 1 : 0);
  withdrawn_->Set(g.withdrawn ? 1 : 0);
  guard_checks_->Set(g.checks);
}

HttpResponse DaemonMonitor::Metrics() const {
  return {200, kMetricsContentType, registry_.Render()};
}

HttpResponse DaemonMonitor::Healthz() const {
  const Daemon* daemon = daemon_.load();
  return Probe(Liveness(daemon ? daemon->heartbeat() : std::nullopt, Clock::now(),
                        options_.rescan_interval));
}

HttpResponse DaemonMonitor::Readyz() const {
  const Daemon* daemon = daemon_.load();
  if (daemon == nullptr) return Probe({false, "the daemon has not started"});
  return Probe(Readiness(daemon->registered(), daemon->known_devices(), daemon->guard_status()));
}

std::map<std::string, HttpHandler> DaemonMonitor::Routes() const {
  return {{"/metrics", [this] { return Metrics(); }},
          {"/healthz", [this] { return Healthz(); }},
          {"/readyz", [this] { return Readyz(); }}};
}

}  // namespace efa::plugin
