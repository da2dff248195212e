// Measure 9: the probes' latency and the time to register again after
// kubelet restarts, on a daemon of a container's descriptor limit, with and
// without a flood of connections to its metrics port.
#include <memory>
#include <thread>

#include "absl/strings/str_format.h"
#include "test/bench/bench.h"
#include "test/support/http_flood.h"

namespace efa::bench {

// 9. A p5 daemon started with a container's descriptor limit (1024):
// /healthz and /readyz on its probe port asked every 100 ms, and the
// kubelet restarted `events` times, for flood_seconds; then the same
// while 1,100 connections (more than its descriptors) hold its metrics
// port, each trickling a byte every 0.9 s. The probes' p99 latency and
// the time to register again, with the flood and without.
void MeasureFlood(Bench& bench) {
  constexpr size_t kConnections = 1100;
  if (efa::testing::RaiseFileLimit(kConnections + 1024) < kConnections + 256) {
    Fail("this process cannot open the flood's 1,100 connections (RLIMIT_NOFILE)");
  }
  SimRoot node(bench.p5_spec);
  FakeKubelet kubelet(FakeKubelet::ForKubeletDir(node.path() / "kubelet"));
  if (auto s = kubelet.Start(); !s.ok()) Fail(std::string(s.message()));
  const fs::path log = bench.logs() / "daemon-flood.log";
  ChildProcess daemon(bench.DaemonArgs(node), log, 1024);
  if (!kubelet.WaitForRegistrations(kEfa, 1, kDeadline))
    Fail("the flood's daemon did not register");
  const auto metrics_port =
      static_cast<uint16_t>(LoggedPort(log, "/metrics, /healthz and /readyz"));
  const auto probe_port = static_cast<uint16_t>(LoggedPort(log, "/healthz and /readyz"));
  // Live before the first phase (the kubelet's initial delay): the owner
  // loop's first pass ends after the registration.
  for (const auto until = Clock::now() + kDeadline;
       efa::testing::ProbeOnce(probe_port, "/healthz", 1s).status != 200;) {
    if (Clock::now() > until) Fail("the flood's daemon was not live within 10 s");
    std::this_thread::sleep_for(10ms);
  }
  struct Phase {
    std::vector<double> probes, registered;
    size_t failures = 0;
  };
  auto phase = [&](bool flooded) {
    std::unique_ptr<efa::testing::ConnectionFlood> flood;
    if (flooded) {
      flood = std::make_unique<efa::testing::ConnectionFlood>(metrics_port, kConnections);
      for (const auto until = Clock::now() + kDeadline;
           flood->connected() < kConnections && Clock::now() < until;) {
        std::this_thread::sleep_for(20ms);
      }
      if (flood->connected() < kConnections) Fail("the flood could not connect");
    }
    Phase out;
    efa::testing::Prober prober(probe_port, {"/healthz", "/readyz"}, {"/healthz"});
    const auto start = Clock::now();
    const auto window = std::chrono::duration<double>(bench.settings.flood_seconds);
    for (int i = 0; i < bench.settings.events; ++i) {
      // Restarts spread over the window: its schedule, nothing to wait for.
      std::this_thread::sleep_until(start + window * i / bench.settings.events);
      const int before = kubelet.registrations(kEfa);
      const auto restart = Clock::now();
      if (auto s = kubelet.Restart(); !s.ok()) Fail(std::string(s.message()));
      if (!kubelet.WaitForRegistrations(kEfa, before + 1, kDeadline)) {
        Fail(
            absl::StrFormat("the daemon did not register again within 10 s of a kubelet "
                            "restart%s",
                            flooded ? " during the flood" : ""));
      }
      out.registered.push_back(Seconds(Clock::now() - restart));
    }
    std::this_thread::sleep_until(start + window);
    prober.Stop();
    out.probes = prober.seconds();
    out.failures = prober.failures().size();
    return out;
  };
  const Phase calm = phase(false);
  const Phase flooded = phase(true);
  if (daemon.Stop(kDeadline) != 0) Fail("the flood's daemon did not stop cleanly on SIGTERM");
  const double p99 = Percentile(flooded.probes, 0.99);
  const double calm_p99 = Percentile(calm.probes, 0.99);
  bench.rows.push_back(
      {9,
       absl::StrFormat("probe latency p99 (%s probes over %.0f s) while %s connections flood the "
                       "metrics port; failed probes",
                       Count(static_cast<long>(flooded.probes.size())),
                       bench.settings.flood_seconds, Count(static_cast<long>(kConnections))),
       absl::StrFormat("%s; %d failed", Ms(p99), flooded.failures),
       absl::StrFormat("no flood: %s; %d failed", Ms(calm_p99), calm.failures), p99 / calm_p99,
       "none failed, p99 ≤ 1 s", flooded.failures == 0 && p99 <= 1.0});
  bench.rows.push_back(
      {9,
       absl::StrFormat("kubelet restarted → registered again during the flood (worst of %d)",
                       bench.settings.events),
       WorstAndMedian(flooded.registered), "no flood: " + WorstAndMedian(calm.registered),
       Max(flooded.registered) / Max(calm.registered), "≤ 1 s", Max(flooded.registered) <= 1.0});
}

}  // namespace efa::bench
