// The daemon's binary with a container's usual descriptor limit (1024)
// under a flood of more connections than that, each trickling a byte every
// 0.9 s, on one of its two HTTP ports: the other port answers all along,
// and the daemon's own work (registering again after a kubelet restart,
// telling which EFA went away) goes on.
#include "test/support/http_flood.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "test/fake_kubelet/fake_kubelet.h"
#include "test/sim/sim_root.h"
#include "test/support/devices.h"
#include "test/support/temp_dir.h"
#include "test/support/test_node.h"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using efa::testing::ConnectionFlood;
using efa::testing::DaemonRun;
using efa::testing::FakeKubelet;
using efa::testing::ProbeOnce;
using efa::testing::Prober;
using efa::testing::TestNode;
using efa::testing::TestNodeOptions;

namespace {

using efa::testing::kDeadline;
using efa::testing::kEfa;
// A container's usual RLIMIT_NOFILE, soft and hard, and a flood of more
// connections than that.
constexpr rlim_t kContainerFiles = 1024;
constexpr size_t kFloodConnections = 1100;

double Worst(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

long long OpenFiles(pid_t pid) {
  long long n = 0;
  std::error_code ec;
  for (fs::directory_iterator it("/proc/" + std::to_string(pid) + "/fd", ec), end; !ec && it != end;
       it.increment(ec)) {
    ++n;
  }
  return n;
}

// The daemon's binary on a simulated p5 with 1024 descriptors, registered
// with the fake kubelet, both listeners on free loopback ports.
TestNodeOptions FloodedNode() {
  return {.machine = "p5.48xlarge",
          .run = DaemonRun::kBinary,
          .flags = {"--log-level", "info", "--probe-address", "127.0.0.1:0"},
          .max_files = kContainerFiles,
          .monitor = true,
          .wait_serving = true};
}

// Before a flood: every EFA Healthy, both probes passing (the kubelet's
// initial delay: the owner loop's first pass ends after the registration),
// and this process able to hold the flood's connections.
void ReadyForFlood(TestNode& node) {
  REQUIRE(node.WaitAll("Healthy"));
  REQUIRE(node.metrics_port() > 0);
  REQUIRE(node.probe_port() > 0);
  for (const char* path : {"/healthz", "/readyz"}) {
    const auto until = std::chrono::steady_clock::now() + kDeadline;
    while (ProbeOnce(node.probe_port(), path, 1s).status != 200 &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(10ms);
    }
    REQUIRE(ProbeOnce(node.probe_port(), path, 1s).status == 200);
  }
  REQUIRE(efa::testing::RaiseFileLimit(kFloodConnections + 1024) >= kFloodConnections + 256);
}

// Waits (bounded) until every slot of `flood` connected once: the flood
// presses with all it has.
void WaitFloodUp(const ConnectionFlood& flood) {
  const auto until = std::chrono::steady_clock::now() + kDeadline;
  while (flood.connected() < kFloodConnections && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(20ms);
  }
  INFO("flood connections made: " << flood.connected());
  REQUIRE(flood.connected() >= kFloodConnections);
}

}  // namespace

TEST_CASE("A flood of the metrics port leaves the probes, re-registration and device health alone",
          "[http][process][flood]") {
  TestNode node(FloodedNode());
  ReadyForFlood(node);
  auto flood = std::make_unique<ConnectionFlood>(node.metrics_port(), kFloodConnections);
  WaitFloodUp(*flood);
  Prober prober(node.probe_port(), {"/healthz", "/readyz"}, {"/healthz"});

  // The kubelet restarts: the daemon registers again within a second.
  const int before = node.kubelet().registrations(kEfa);
  const auto restart = std::chrono::steady_clock::now();
  REQUIRE(node.kubelet().Restart().ok());
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, before + 1, kDeadline));
  const double registered =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - restart).count();
  CHECK(registered < 1.0);

  // An EFA goes away (its uverbs node): that one alone turns Unhealthy.
  const std::string gone(absl::StripAsciiWhitespace(
      efa::testing::ReadFile(node.sim().sys() / "class/infiniband_verbs/uverbs5/ibdev")));
  fs::remove(node.sim().path() / "dev/infiniband/uverbs5");
  CHECK(node.kubelet().WaitForDevices(
      kEfa,
      [&](const std::vector<v1beta1::Device>& d) {
        return d.size() == 32 && std::all_of(d.begin(), d.end(), [&](const auto& x) {
                 return x.health() == (x.id() == gone ? "Unhealthy" : "Healthy");
               });
      },
      kDeadline));
  node.sim().RestoreUverbs(5);
  CHECK(node.WaitAll("Healthy"));

  // The flood went on all along; what it holds of the daemon is bounded.
  std::this_thread::sleep_until(restart + 3s);  // a few seconds of flood at least
  const long long files = OpenFiles(node.pid());
  prober.Stop();
  const double worst = Worst(prober.seconds());
  std::printf(
      "metrics port flooded (%zu connections): %zu probes, worst %.0f ms; registered again in "
      "%.0f ms; daemon's open files %lld; flood connections made %zu, closed by the daemon %zu\n",
      kFloodConnections, prober.seconds().size(), worst * 1000, registered * 1000, files,
      flood->connected(), flood->closed_by_server());
  CHECK(prober.failures() == std::vector<std::string>{});
  CHECK(prober.seconds().size() >= 40);
  CHECK(worst < 1.0);
  // 64 metrics connections at most, 16 probes, and the daemon's own.
  CHECK(files < 300);
  CHECK(flood->closed_by_server() >= kFloodConnections - 64);

  // Once the flood ends (its last connections time out), /metrics counts
  // what it refused, where an operator looks.
  flood.reset();
  efa::testing::ProbeResult metrics;
  for (const auto until = std::chrono::steady_clock::now() + kDeadline;
       metrics.status != 200 && std::chrono::steady_clock::now() < until;) {
    metrics = ProbeOnce(node.metrics_port(), "/metrics", 5s);
  }
  REQUIRE(metrics.status == 200);
  const std::string series =
      "efa_device_plugin_http_connections_dropped_total{listener=\"metrics\",reason=\"limit\"} ";
  const size_t at = metrics.body.find(series);
  REQUIRE(at != std::string::npos);
  CHECK(std::atof(metrics.body.c_str() + at + series.size()) >= kFloodConnections - 64);
}

TEST_CASE(
    "A flood of the probe port leaves /metrics answering, and the probes of another address "
    "passing",
    "[http][process][flood]") {
  TestNode node(FloodedNode());
  ReadyForFlood(node);
  ConnectionFlood flood(node.probe_port(), kFloodConnections);
  WaitFloodUp(flood);
  const auto start = std::chrono::steady_clock::now();
  Prober scraper(node.metrics_port(), {"/metrics", "/healthz"}, {"/metrics", "/healthz"});
  // The kubelet probes from the node's address, not the flood's: one
  // client holds at most half of the probe listener's 16 places.
  Prober kubelet(node.probe_port(), {"/healthz"}, {"/healthz"}, "127.0.0.2");
  std::this_thread::sleep_until(start + 3s);  // a few seconds of flood
  scraper.Stop();
  kubelet.Stop();
  const double worst = Worst(scraper.seconds());
  const double worst_probe = Worst(kubelet.seconds());
  std::printf(
      "probe port flooded (%zu connections): %zu requests to the metrics port, worst %.0f ms; "
      "%zu probes from another address, worst %.0f ms; daemon's open files %lld\n",
      kFloodConnections, scraper.seconds().size(), worst * 1000, kubelet.seconds().size(),
      worst_probe * 1000, OpenFiles(node.pid()));
  CHECK(scraper.failures() == std::vector<std::string>{});
  CHECK(scraper.seconds().size() >= 40);
  CHECK(worst < 1.0);
  CHECK(kubelet.failures() == std::vector<std::string>{});
  CHECK(kubelet.seconds().size() >= 20);
  CHECK(worst_probe < 1.0);
  CHECK(flood.closed_by_server() >= kFloodConnections - 8);
}
