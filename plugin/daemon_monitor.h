// The daemon seen from outside: Prometheus metrics, the liveness and
// readiness verdicts, and the HTTP routes that serve them. It reads the
// daemon's thread-safe state when asked and receives RPC and inventory
// events through the DaemonOptions hooks; it never drives the daemon.
//
//   DaemonMonitor monitor({rescan_interval, instance_type, sysfs_root, expected});
//   DaemonOptions options = ...;
//   monitor.Attach(options);          // before the daemon is built
//   Daemon daemon(options);
//   monitor.Watch(&daemon);           // before serving HTTP
//   auto http = HttpServer::Start(":8080", monitor.Routes());
//   auto probes = HttpServer::Start(":8081", monitor.ProbeRoutes());
//   daemon.Run();
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "plugin/daemon.h"
#include "plugin/rpc_observer.h"
#include "plugin/runtime/expected_efas.h"
#include "plugin/runtime/http_server.h"
#include "plugin/runtime/metrics.h"
#include "plugin/runtime/probes.h"

namespace efa::plugin {

// The configuration's values, given by main.cc (no defaults here).
struct MonitorOptions {
  std::chrono::milliseconds rescan_interval{};
  std::string instance_type;  // empty: the DMI product name under sysfs_root
  std::filesystem::path sysfs_root;
  int expected_efa_count = 0;  // 0: from the instance type
};

// Ready when the daemon serves as configured: the resource is registered
// with the kubelet, or there is no EFA to register (a node without EFA is
// in its steady state), or it is withdrawn because the EFA DRA driver is
// present under --dra-policy=yield, or it stands aside for another device
// plugin serving its socket (the plugin's host service: its steady state
// on such a node, Registrar::StartServer). Guard findings (MOFED on, the DRA
// driver beside the plugin under ignore) are logs and metrics, and under
// MOFED protect the devices' health: never unreadiness, which would stall
// every rolling update on such nodes. The reason names `resource`, the
// resource the daemon registers. Pure.
ProbeVerdict Readiness(bool registered, int known_devices, const GuardStatus& guards,
                       const std::string& resource = kResourceName, bool standing_aside = false);

class DaemonMonitor final : public RpcObserver {
 public:
  explicit DaemonMonitor(MonitorOptions options);

  // Points the daemon's observability hooks (rpc_observer, on_inventory)
  // at this monitor, which must outlive the daemon.
  void Attach(DaemonOptions& options);
  // Reads `daemon`'s state from now on (null: none). Call before serving
  // the routes; `daemon` must outlive the serving.
  void Watch(const Daemon* daemon) { daemon_.store(daemon); }

  // GET /metrics, /healthz, /readyz. Thread-safe.
  HttpResponse Metrics() const;
  HttpResponse Healthz() const;
  HttpResponse Readyz() const;
  // All three, for metricsAddress; the probes alone, for probeAddress.
  std::map<std::string, HttpHandler> Routes() const;
  std::map<std::string, HttpHandler> ProbeRoutes() const;

  const ExpectedEfasMonitor& expected_efas() const { return expected_efas_; }
  // The counters of the HTTP listeners, for ServeEndpoints: /metrics
  // reports them. Thread-safe.
  EndpointCounters& http() { return http_; }

  void RpcHandled(RpcMethod method, grpc::StatusCode code,
                  std::chrono::nanoseconds elapsed) override;
  void ContainerAllocated(size_t devices) override;
  void EfaAllocated(std::string_view ibdev) override;

 private:
  // The families read from the daemon's state at each scrape.
  void CollectState(std::vector<prometheus::MetricFamily>& out) const;
  // The families of the EFAs' counters.
  static void CollectCounters(const EfaCounterSnapshot& snapshot,
                              std::vector<prometheus::MetricFamily>& out);
  // Those families as text: serialized once per read of the counters (some
  // 700 series on a p5.48xlarge), reused by the scrapes until the next.
  std::string CountersText(std::shared_ptr<const EfaCounterSnapshot> snapshot) const;

  const MonitorOptions options_;
  std::atomic<const Daemon*> daemon_{nullptr};
  ExpectedEfasMonitor expected_efas_;
  EndpointCounters http_;
  mutable absl::Mutex counters_mu_;
  mutable std::shared_ptr<const EfaCounterSnapshot> counters_snapshot_
      ABSL_GUARDED_BY(counters_mu_);
  mutable std::string counters_text_ ABSL_GUARDED_BY(counters_mu_);
  prometheus::Registry registry_;

  // Updated on gRPC threads: looked up once.
  std::array<prometheus::Histogram*, kRpcMethodCount> rpc_duration_{};
  prometheus::Family<prometheus::Counter>* allocations_ = nullptr;
  prometheus::Counter* allocations_ok_ = nullptr;
  prometheus::Histogram* allocation_size_ = nullptr;
  prometheus::Family<prometheus::Counter>* efa_allocations_ = nullptr;
};

// gRPC's name of a status code ("OK", "INVALID_ARGUMENT").
std::string_view GrpcCodeName(grpc::StatusCode code);

}  // namespace efa::plugin
