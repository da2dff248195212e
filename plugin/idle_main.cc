// efa-k8s-device-plugin-idle: the device plugin on a node without EFA.
//
// The daemon execs it (same PID) when its first scan finds no EFA, with the
// daemon's own command line after `--`. It answers /healthz, /readyz and
// /metrics on the daemon's addresses, watches for an EFA as the daemon
// does (uevents, inotify on the discovery directories, the rescan
// interval) and execs the daemon again when one appears. It maps no gRPC,
// protobuf, hwloc or libibverbs, so the thousands of nodes of a cluster
// that have no EFA keep only its few MiB resident (BENCHMARKS.md).
//
//   efa-k8s-device-plugin-idle --sysfs-root /sys --dev-root /dev
//       --rescan-interval-ms 10000 --metrics-address :8080 --probe-address :8081
//       --metrics-max-connections 64 --probe-max-connections 16 --http-request-timeout-ms 3000
//       --instance-type "" --expected-efa-count 0 --log-level info --log-format text
//       -- /usr/bin/efa-k8s-device-plugin [the daemon's arguments]
#include <sys/inotify.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "CLI/CLI.hpp"
#include "plugin/runtime/event_loop.h"
#include "plugin/runtime/expected_efas.h"
#include "plugin/runtime/fd_budget.h"
#include "plugin/runtime/http_server.h"
#include "plugin/runtime/idle_args.h"
#include "plugin/runtime/logging.h"
#include "plugin/runtime/metrics.h"
#include "plugin/runtime/probes.h"
#include "plugin/runtime/signals.h"
#include "spdlog/spdlog.h"
#include "topology/efa_discovery.h"
#include "topology/uevents.h"

namespace {

using efa::plugin::HttpHandler;
using efa::plugin::HttpServer;
using efa::plugin::IdleArgs;
using SteadyClock = std::chrono::steady_clock;

// The loop's last pass, for /healthz.
std::atomic<SteadyClock::rep> heartbeat{0};

// Serves /healthz, /readyz and /metrics on the daemon's addresses; the
// error names the address that cannot be served.
absl::StatusOr<std::vector<std::unique_ptr<HttpServer>>> ServeIdleEndpoints(const IdleArgs& a) {
  const auto interval = a.rescan_interval;
  const efa::plugin::ExpectedEfasCheck count = efa::plugin::CheckExpectedEfas(
      efa::plugin::ResolveInstanceType(a.instance_type, a.sysfs_root), a.expected_efa_count, 0);
  std::map<std::string, HttpHandler> probes = {
      {"/healthz",
       [interval] {
         const SteadyClock::rep beat = heartbeat.load();
         return efa::plugin::Probe(efa::plugin::Liveness(
             beat == 0 ? std::nullopt
                       : std::optional(SteadyClock::time_point(SteadyClock::duration(beat))),
             SteadyClock::now(), interval));
       }},
      {"/readyz", [] {
         return efa::plugin::Probe({true, efa::plugin::kNoEfaReadiness});
       }}};
  std::map<std::string, HttpHandler> routes = probes;
  static efa::plugin::EndpointCounters http;  // outlives the servers
  routes.emplace("/metrics", [count] {
    std::vector<prometheus::MetricFamily> families;
    efa::plugin::CollectIdentity(efa::plugin::kModeIdle, 0, 0, families);
    efa::plugin::CollectExpectedEfas(count, families);
    efa::plugin::CollectEndpointCounters(http, families);
    return efa::plugin::HttpResponse{200, efa::plugin::kMetricsContentType,
                                     efa::plugin::SerializeMetrics(std::move(families))};
  });
  efa::plugin::InitDescriptorBudget();  // before the servers hold descriptors
  return efa::plugin::ServeEndpoints(
      a.metrics_address, std::move(routes), a.probe_address, std::move(probes),
      efa::plugin::FitEndpointLimits(a.limits, efa::plugin::HttpDescriptorAllowance()), &http);
}

// Waits until an EFA appears (nullopt); else the exit code: 0 after a stop
// signal, 1 when the wait fails.
std::optional<int> WaitForEfa(const IdleArgs& a) {
  efa::topology::HostRoots roots;
  roots.sysfs = a.sysfs_root;
  roots.dev = a.dev_root;
  efa::plugin::EventLoop loop({.take_signals = true, .on_hangup = nullptr});  // SIGHUP: ignored
  if (absl::Status opened = loop.Open(); !opened.ok()) {
    spdlog::error("{}", std::string(opened.message()));
    return 1;
  }
  const int inotify_fd = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  const int uevent_fd = efa::topology::OpenUeventSocket();
  // Every wake-up ends in a look: the handlers only take in what came.
  loop.Watch(inotify_fd, [inotify_fd] {
    char buf[4096];
    while (::read(inotify_fd, buf, sizeof buf) > 0) {
    }
  });
  loop.Watch(uevent_fd, [uevent_fd] { efa::topology::DrainUevents(uevent_fd); });
  // Watched again before each look: a directory created later (the driver
  // loaded after boot) is picked up at the latest by the timer.
  auto efa_present = [&] {
    for (const auto& dir : efa::topology::DiscoveryDirs(roots)) {
      ::inotify_add_watch(inotify_fd, dir.c_str(), efa::topology::kDiscoveryDirEvents);
    }
    return !efa::topology::DiscoverEfaDevices(roots).devices.empty();
  };
  bool found = efa_present();  // one may have come since the daemon looked
  if (!found) spdlog::info("no EFA on this node; idle until one appears");
  while (!found) {
    heartbeat = SteadyClock::now().time_since_epoch().count();
    if (!loop.RunOnce(SteadyClock::now() + a.rescan_interval)) return 1;
    if (loop.stopped()) return 0;
    found = efa_present();
  }
  return std::nullopt;
}

}  // namespace

// An exception that reaches main is a bug or memory exhaustion: std::terminate
// then ends the process with a core dump and the DaemonSet restarts it.
// NOLINTNEXTLINE(bugprone-exception-escape)
int main(int argc, char** argv) {
  // The daemon's test before it execs this binary: reaching main() shows
  // that the dynamic loader found every library and the static
  // initialisers ran (plugin/main.cc, CheckIdleBinary).
  if (argc == 2 && std::string_view(argv[1]) == "--check") return 0;
  IdleArgs args;
  CLI::App app{"The EFA device plugin on a node without EFA (run by the daemon)"};
  efa::plugin::AddIdleOptions(app, args);
  CLI11_PARSE(app, argc, argv);
  efa::plugin::ConfigureLogging(args.log_level, args.log_format);

  // The daemon blocked these before exec (the mask is inherited): taken here
  // through a signalfd as the daemon does, SIGCHLD to reap the orphans it
  // is handed as PID 1.
  efa::plugin::BlockOwnerLoopSignals();
  auto servers = ServeIdleEndpoints(args);
  if (!servers.ok()) {
    spdlog::error("{}", std::string(servers.status().message()));
    return 1;
  }
  if (std::optional<int> code = WaitForEfa(args)) return *code;

  spdlog::info("an EFA appeared; starting the device plugin");
  servers->clear();  // the daemon binds the same addresses
  spdlog::default_logger()->flush();
  std::vector<char*> exec_args;
  for (std::string& a : args.daemon) exec_args.push_back(a.data());
  exec_args.push_back(nullptr);
  ::execv(exec_args[0], exec_args.data());
  spdlog::error("cannot run {}: {}", args.daemon[0], std::strerror(errno));
  return 1;
}
