// /metrics, /healthz and /readyz of a running daemon, fetched over real HTTP
// (cpp-httplib's client) while the fake kubelet and the simulated node change
// under it.
#include "plugin/daemon_monitor.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "test/fake_kubelet/fake_accelerator_plugin.h"
#include "test/fake_kubelet/fake_kubelet.h"
#include "test/plugin/guard_fakes.h"
#include "test/sim/sim_root.h"
#include "test/support/devices.h"
#include "test/support/exposition.h"
#include "test/support/http_flood.h"
#include "test/support/scrape.h"
#include "test/support/test_node.h"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using namespace efa::plugin;
using efa::sim::SimRoot;
using efa::testing::AcceleratorKind;
using efa::testing::DaemonRun;
using efa::testing::FakeAcceleratorPlugin;
using efa::testing::FakeAcceleratorPluginOptions;
using efa::testing::FakeDraDriver;
using efa::testing::FakeKubelet;
using efa::testing::Has;
using efa::testing::HttpGet;
using efa::testing::HttpReply;
using efa::testing::Metrics;
using efa::testing::SummarizeExposition;
using efa::testing::TestNode;
using efa::testing::WaitScrape;

namespace {

using efa::testing::kDeadline;
using efa::testing::kEfa;
// A simulated node with the fake kubelet (its pod-resources API too), the
// daemon on a thread and its monitor serving HTTP on free loopback ports, as
// main() does: every route on the metrics address, the probes on the probe
// address.
class MonitoredNode : public TestNode {
 public:
  // `fake_clock`: the daemon and the monitor read clock() (TestNode::Pass).
  // `rescan`: rescanInterval (0: the default).
  explicit MonitoredNode(const std::string& machine,
                         const std::function<void(SimRoot&)>& prepare = nullptr,
                         MofedPolicy mofed_policy = MofedPolicy::kWarn,
                         AlignmentMode alignment = AlignmentMode::kBestEffort,
                         bool fake_clock = false, std::chrono::milliseconds rescan = {})
      : TestNode({.machine = machine,
                  .prepare = prepare,
                  .run = DaemonRun::kLater,
                  .fake_clock = fake_clock,
                  .monitor = true}) {
    // Watched only when they exist at start (as on a node).
    fs::create_directories(cdi_dir());
    fs::create_directories(registry());
    DaemonOptions& o = options();
    o.guards.cdi_spec_dirs = {cdi_dir()};
    o.guards.mofed_policy = mofed_policy;
    o.alignment = alignment;
    if (rescan.count() > 0) o.rescan_interval = rescan;
    if (alignment == AlignmentMode::kLateBinding) {
      o.cdi_dir = sim().path() / "var/run/cdi-claims";
      fs::create_directories(o.cdi_dir);
    }
    StartDaemon();
  }

  fs::path registry() const { return kubelet_dir() / "plugins_registry"; }

  HttpReply Get(const std::string& path) { return HttpGet(metrics_port(), path); }
  bool WaitReply(const std::string& path, int status, const std::string& body) {
    const auto deadline = std::chrono::steady_clock::now() + kDeadline;
    HttpReply reply;
    while (std::chrono::steady_clock::now() < deadline) {
      reply = Get(path);
      if (reply.status == status && reply.body == body) return true;
      std::this_thread::sleep_for(10ms);
    }
    UNSCOPED_INFO(path << " answered " << reply.status << " " << reply.body);
    return false;
  }
};

grpc::Status Allocate(FakeKubelet& kubelet, std::initializer_list<const char*> ids) {
  v1beta1::AllocateRequest request;
  auto* c = request.add_container_requests();
  for (const char* id : ids) c->add_devices_ids(id);
  v1beta1::AllocateResponse response;
  return kubelet.Allocate(kEfa, request, &response);
}

// The NVIDIA device plugin of the node's GPUs with MOFED on (as v0.19.0 to
// v0.19.2 by default), registered with the node's kubelet. MOFED is on once
// the kubelet admits a GPU container from it: checkpointed and listed by
// pod-resources (the MOFED CDI spec on disk is only a hint).
std::unique_ptr<FakeAcceleratorPlugin> StartMofedGpuPlugin(MonitoredNode& node) {
  FakeAcceleratorPluginOptions options;
  options.kind = AcceleratorKind::kNvidiaGpu;
  options.device_plugin_dir = node.device_plugin_dir();
  options.mofed_enabled = true;
  const auto machine = efa::sim::FindMachine(node.machine());
  REQUIRE(machine.ok());
  auto gpus = std::make_unique<FakeAcceleratorPlugin>(*machine, options);
  REQUIRE(gpus->Start().ok());
  REQUIRE(
      node.kubelet().WaitForStreaming(FakeAcceleratorPlugin::kNvidiaGpuResource, true, kDeadline));
  return gpus;
}

// Admits a running container holding one GPU as `uid`.
void AdmitGpuPod(MonitoredNode& node, const std::string& uid) {
  REQUIRE(node.kubelet()
              .AdmitContainer("train-" + uid, "default", uid, "cuda",
                              {{FakeAcceleratorPlugin::kNvidiaGpuResource, 1}})
              .ok());
}

}  // namespace

TEST_CASE("Metrics follow the devices' health, allocations and kubelet restarts",
          "[monitor][daemon][concurrency]") {
  MonitoredNode node("p4d.24xlarge");
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(node.WaitScrape(Has({{"efa_device_plugin_devices{health=\"healthy\"}", 4},
                               {"efa_device_plugin_devices{health=\"unhealthy\"}", 0},
                               {"efa_device_plugin_registered", 1},
                               {"efa_device_plugin_registrations_total", 1},
                               {"efa_device_plugin_kubelet_restarts_total", 0},
                               {"efa_device_plugin_efas_found", 4},
                               {"efa_device_plugin_efas_expected", 4}})));
  // Before any Allocate, every code it answers has its series at 0: the
  // first refusal is then an increase() (a series born at 1 is none).
  for (grpc::StatusCode code : kAllocateCodes) {
    const std::string series = absl::StrCat("efa_device_plugin_allocations_total{code=\"",
                                            std::string(GrpcCodeName(code)), "\"}");
    CAPTURE(series);
    CHECK(node.Scrape().at(series) == 0);
  }
  HttpReply reply = node.Get("/metrics");
  CHECK(reply.status == 200);
  CHECK(reply.content_type == "text/plain; version=0.0.4; charset=utf-8");
  CHECK(reply.body.find("# TYPE efa_device_plugin_rpc_duration_seconds histogram\n") !=
        std::string::npos);

  // A uverbs node disappears: one device turns Unhealthy.
  fs::remove(node.sim().path() / "dev/infiniband/uverbs1");
  REQUIRE(
      node.WaitScrape(Has({{"efa_device_plugin_devices{health=\"healthy\"}", 3},
                           {"efa_device_plugin_devices{health=\"unhealthy\"}", 1},
                           {"efa_device_plugin_efa_advertised_unhealthy{efa=\"rdmap32s27\"}", 1},
                           {"efa_device_plugin_efas_found", 4}})));

  // Allocations: one granted (2 EFAs), one refused (the unhealthy device).
  REQUIRE(Allocate(node.kubelet(), {"rdmap16s27", "rdmap144s27"}).ok());
  CHECK(Allocate(node.kubelet(), {"rdmap32s27"}).error_code() ==
        grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(node.WaitScrape(Has(
      {{"efa_device_plugin_allocations_total{code=\"OK\"}", 1},
       {"efa_device_plugin_allocations_total{code=\"FAILED_PRECONDITION\"}", 1},
       {"efa_device_plugin_allocation_size_bucket{le=\"1\"}", 0},
       {"efa_device_plugin_allocation_size_bucket{le=\"2\"}", 1},
       {"efa_device_plugin_allocation_size_count", 1},
       {"efa_device_plugin_allocation_size_sum", 2},
       {"efa_device_plugin_rpc_duration_seconds_count{method=\"Allocate\"}", 2},
       {"efa_device_plugin_rpc_duration_seconds_bucket{method=\"Allocate\",le=\"+Inf\"}", 2},
       {"efa_device_plugin_rpc_duration_seconds_count{method=\"GetDevicePluginOptions\"}", 1}})));

  // The node comes back, the kubelet restarts: registered again.
  node.sim().RestoreUverbs(1);
  REQUIRE(node.kubelet().Restart().ok());
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 2, kDeadline));
  CHECK(node.WaitScrape(Has({{"efa_device_plugin_devices{health=\"healthy\"}", 4},
                             {"efa_device_plugin_devices{health=\"unhealthy\"}", 0},
                             {"efa_device_plugin_registrations_total", 2},
                             {"efa_device_plugin_kubelet_restarts_total", 1}})));
  // Alignment counters are exported (GetPreferredAllocation was not called).
  const Metrics m = node.Scrape();
  CHECK(m.count("efa_device_plugin_efa_advertised_unhealthy{efa=\"rdmap32s27\"}") == 0);
  CHECK(m.at("efa_device_plugin_alignment_decisions_total{decision=\"targeted\"}") == 0);
  CHECK(m.at("efa_device_plugin_alignment_judgments_total{result=\"unaligned\"}") == 0);
  CHECK(m.at("efa_device_plugin_heartbeat_age_seconds") < 30);
}

TEST_CASE("Readiness and the guard metrics follow the MOFED conflict and the DRA driver",
          "[monitor][daemon][concurrency]") {
  // Rescans every 300 ms: the DRA driver's going counts after 3 of them.
  MonitoredNode node("p4d.24xlarge", nullptr, MofedPolicy::kWarn, AlignmentMode::kBestEffort, false,
                     std::chrono::milliseconds(300));
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(
      node.WaitReply("/readyz", 200, "ok: vpc.amazonaws.com/efa is registered with the kubelet\n"));
  CHECK(node.Get("/healthz").status == 200);
  CHECK(node.Get("/healthz").body.rfind("ok: the owner loop ran ", 0) == 0);
  CHECK(node.WaitScrape(Has({{"efa_device_plugin_mofed_state{state=\"off\"}", 1},
                             {"efa_device_plugin_mofed_state{state=\"on\"}", 0},
                             {"efa_device_plugin_dra_driver_present", 0},
                             {"efa_device_plugin_withdrawn", 0}})));

  // A GPU container is given MOFED (policy warn): a conflict, shown in the
  // metrics; the daemon still serves as configured, so still ready.
  const auto gpus = StartMofedGpuPlugin(node);
  AdmitGpuPod(node, "uid-mofed");
  REQUIRE(node.daemon().WaitForGuardStatusForTest(
      [](const GuardStatus& s) { return s.mofed.state == MofedState::kOn; }, kDeadline));
  CHECK(node.Get("/readyz").status == 200);
  CHECK(node.Get("/readyz").body == "ok: vpc.amazonaws.com/efa is registered with the kubelet\n");
  CHECK(node.WaitScrape(Has({{"efa_device_plugin_mofed_state{state=\"off\"}", 0},
                             {"efa_device_plugin_mofed_state{state=\"on\"}", 1},
                             {"efa_device_plugin_efas_held_unhealthy", 0},
                             {"efa_device_plugin_devices{health=\"healthy\"}", 4}})));
  // The pod goes: the kubelet rewrites the checkpoint without it.
  REQUIRE(node.kubelet().RemovePod("uid-mofed").ok());
  CHECK(node.WaitScrape(Has({{"efa_device_plugin_mofed_state{state=\"off\"}", 1},
                             {"efa_device_plugin_mofed_state{state=\"on\"}", 0}})));
  CHECK(
      node.WaitReply("/readyz", 200, "ok: vpc.amazonaws.com/efa is registered with the kubelet\n"));

  // The EFA DRA driver registers (policy yield): withdrawn as configured,
  // which is the daemon's steady state while the driver is there: ready.
  FakeDraDriver driver(node.registry());
  driver.Start();
  CHECK(
      node.WaitReply("/readyz", 200,
                     "ok: the EFA DRA driver (dra.net) serves this node's EFAs: "
                     "vpc.amazonaws.com/efa is withdrawn, as --dra-policy=yield asks (" +
                         driver.socket_path().string() +
                         ": the dra.net DRA driver's registration socket accepts connections)\n"));
  CHECK(node.WaitScrape(Has({{"efa_device_plugin_dra_driver_present", 1},
                             {"efa_device_plugin_withdrawn", 1},
                             {"efa_device_plugin_devices{health=\"healthy\"}", 0},
                             {"efa_device_plugin_devices{health=\"unhealthy\"}", 0}})));
  driver.Stop();
  CHECK(
      node.WaitReply("/readyz", 200, "ok: vpc.amazonaws.com/efa is registered with the kubelet\n"));
  CHECK(node.WaitScrape(Has(
      {{"efa_device_plugin_withdrawn", 0}, {"efa_device_plugin_devices{health=\"healthy\"}", 4}})));
  CHECK(node.Scrape().at("efa_device_plugin_guard_checks_total") >= 4);
}

TEST_CASE("Under policy protect the MOFED metrics and health go on, off and on again",
          "[monitor][daemon][concurrency]") {
  MonitoredNode node("p4d.24xlarge", nullptr, MofedPolicy::kProtect);
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  const auto gpus = StartMofedGpuPlugin(node);
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    CHECK(node.WaitScrape(Has({{"efa_device_plugin_mofed_state{state=\"off\"}", 1},
                               {"efa_device_plugin_efas_held_unhealthy", 0},
                               {"efa_device_plugin_devices{health=\"healthy\"}", 4},
                               {"efa_device_plugin_devices{health=\"unhealthy\"}", 0}})));
    // A GPU container given MOFED is admitted, then its pod goes.
    const std::string uid = "uid-train-" + std::to_string(round);
    AdmitGpuPod(node, uid);
    CHECK(node.WaitScrape(Has({{"efa_device_plugin_mofed_state{state=\"on\"}", 1},
                               {"efa_device_plugin_efas_held_unhealthy", 1},
                               {"efa_device_plugin_devices{health=\"healthy\"}", 0},
                               {"efa_device_plugin_devices{health=\"unhealthy\"}", 4}})));
    // What the kubelet is told agrees with the metric.
    const auto list = node.daemon().advertised();
    for (const auto& d : list.devices()) CHECK(d.health() == "Unhealthy");
    REQUIRE(node.kubelet().RemovePod(uid).ok());
  }
  CHECK(node.WaitScrape(Has({{"efa_device_plugin_mofed_state{state=\"off\"}", 1},
                             {"efa_device_plugin_devices{health=\"healthy\"}", 4}})));
  const auto list = node.daemon().advertised();
  CHECK(list.devices_size() == 4);
  for (const auto& d : list.devices()) CHECK(d.health() == "Healthy");
}

TEST_CASE("A node without EFA is ready with nothing to register",
          "[monitor][daemon][concurrency]") {
  MonitoredNode node("no-efa");
  CHECK(node.WaitReply("/readyz", 200, "ok: no EFA on this node, nothing to register\n"));
  CHECK(node.WaitScrape(Has({{"efa_device_plugin_registered", 0},
                             {"efa_device_plugin_efas_found", 0},
                             {"efa_device_plugin_devices{health=\"healthy\"}", 0}})));
  // No EFA count is known for an m5.8xlarge: the expected count is absent.
  CHECK(node.Scrape().count("efa_device_plugin_efas_expected") == 0);
}

TEST_CASE("A p5.48xlarge with 31 EFAs reports the shortfall in its metrics",
          "[monitor][daemon][concurrency]") {
  MonitoredNode node("p5.48xlarge", [](SimRoot& sim) {
    fs::remove(sim.sys() / "class/infiniband/rdmap201s0");
    fs::remove_all(sim.sys() / "class/infiniband_verbs/uverbs31");
    fs::remove(sim.path() / "dev/infiniband/uverbs31");
  });
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  CHECK(node.WaitScrape(Has({{"efa_device_plugin_efas_found", 31},
                             {"efa_device_plugin_efas_expected", 32},
                             {"efa_device_plugin_devices{health=\"healthy\"}", 31}})));
}

TEST_CASE("Liveness allows three rescan intervals and some slack between loop passes",
          "[monitor]") {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0{std::chrono::hours(1)};
  CHECK(Liveness(std::nullopt, t0, 10s).reason == "the owner loop has not started");
  CHECK_FALSE(Liveness(std::nullopt, t0, 10s).ok);
  ProbeVerdict v = Liveness(t0, t0 + 2500ms, 10s);
  CHECK(v.ok);
  CHECK(v.reason == "the owner loop ran 2.5s ago");
  CHECK(Liveness(t0, t0 + 45s, 10s).ok);
  v = Liveness(t0, t0 + 45100ms, 10s);
  CHECK_FALSE(v.ok);
  CHECK(v.reason == "the owner loop last ran 45.1s ago (limit 45s)");
  CHECK_FALSE(Liveness(t0, t0 + 16s, 100ms).ok);
}

TEST_CASE(
    "The RDMA subsystem's exclusive network namespace mode is exported; an unreadable mode "
    "changes nothing",
    "[monitor]") {
  MonitoredNode node("p4d.24xlarge", nullptr, MofedPolicy::kWarn, AlignmentMode::kBestEffort,
                     /*fake_clock=*/true);
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  const std::string gauge = "efa_device_plugin_rdma_netns_exclusive";
  // A periodic pass, done: the heartbeat of the pass at the new time comes
  // before its timers run; the next pass's comes after them.
  auto periodic_pass = [&] { return node.Pass(10s) && node.Pass(1ms); };
  CHECK(node.Scrape().at(gauge) == 0);  // no ib_core parameter on the simulated node
  const fs::path mode = node.sim().path() / "sys/module/ib_core/parameters/netns_mode";
  fs::create_directories(mode.parent_path());
  std::ofstream(mode) << "N\n";
  REQUIRE(periodic_pass());
  CHECK(node.Scrape().at(gauge) == 1);
  fs::remove(mode);
  REQUIRE(periodic_pass());
  CHECK(node.Scrape().at(gauge) == 1);  // the last answer stands
  // A read that fails: the last answer stands, and it is counted.
  const std::string errors = "efa_device_plugin_discovery_errors_total{operation=\"netns_mode\"}";
  CHECK(node.Scrape().at(errors) == 0);
  fs::create_directory(mode);
  REQUIRE(periodic_pass());
  REQUIRE(periodic_pass());
  CHECK(node.Scrape().at(gauge) == 1);
  CHECK(node.Scrape().at(errors) >= 2);

  fs::remove(mode);
  std::ofstream(mode) << "Y\n";
  REQUIRE(periodic_pass());
  CHECK(node.Scrape().at(gauge) == 0);
}

TEST_CASE(
    "The daemon binary says once that the RDMA namespace mode cannot be read, counts each "
    "failed read and says when it reads again",
    "[monitor]") {
  TestNode node({.machine = "p4d.24xlarge",
                 .run = DaemonRun::kBinary,
                 .flags = {"--rescan-interval", "100ms", "--probe-address", ""},
                 .monitor = true,
                 .wait_serving = true});
  const fs::path mode = node.sim().path() / "sys/module/ib_core/parameters/netns_mode";
  fs::create_directories(mode);  // a directory: every read fails (EISDIR)
  const std::string errors = "efa_device_plugin_discovery_errors_total{operation=\"netns_mode\"}";
  REQUIRE(node.WaitScrape([&](const Metrics& m) { return m.count(errors) && m.at(errors) >= 3; }));
  CHECK(node.LogLines("cannot read the RDMA subsystem's network namespace mode: " + mode.string() +
                      ": Is a directory; keeping the last answer (shared)") == 1);
  fs::remove(mode);
  std::ofstream(mode) << "N\n";
  REQUIRE(node.WaitLog("the RDMA subsystem's network namespace mode can be read again"));
  REQUIRE(node.WaitScrape(
      [](const Metrics& m) { return m.at("efa_device_plugin_rdma_netns_exclusive") == 1; }));
  CHECK(node.LogLines("cannot read the RDMA subsystem's network namespace mode") == 1);
}

TEST_CASE("/healthz fails once the owner loop has not run for three rescan intervals and 15 s",
          "[monitor]") {
  MonitoredNode node("p4d.24xlarge", nullptr, MofedPolicy::kWarn, AlignmentMode::kBestEffort,
                     /*fake_clock=*/true);
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(node.Pass(0s));
  HttpReply reply = HttpGet(node.probe_port(), "/healthz");
  CHECK(reply.status == 200);
  CHECK(reply.body == "ok: the owner loop ran 0s ago\n");

  // The loop stalls (nothing wakes it) past 3 x 10 s + 15 s. An event the
  // fake clock does not hold back may still wake it between the two reads
  // (seen once under ASan; which event was not found): then the stall is
  // tried again from that pass.
  bool stalled = false;
  for (int attempt = 0; attempt < 5 && !stalled; ++attempt) {
    const auto beat = node.daemon().heartbeat();
    node.clock().Advance(45100ms);
    reply = HttpGet(node.probe_port(), "/healthz");
    const double age = node.Scrape()["efa_device_plugin_heartbeat_age_seconds"];
    if (node.daemon().heartbeat() != beat) continue;
    stalled = true;
    CHECK(reply.status == 503);
    CHECK(reply.body == "not ok: the owner loop last ran 45.1s ago (limit 45s)\n");
    CHECK(age == Approx(45.1));
  }
  REQUIRE(stalled);

  // A pass, and it is alive again.
  REQUIRE(node.Pass(0s));
  reply = HttpGet(node.probe_port(), "/healthz");
  CHECK(reply.status == 200);
  CHECK(reply.body == "ok: the owner loop ran 0s ago\n");
}

TEST_CASE("Readiness follows serving as configured, not guard findings", "[monitor][concurrency]") {
  GuardStatus clear;
  CHECK(Readiness(true, 4, clear).ok);
  CHECK(Readiness(false, 0, clear).ok);
  ProbeVerdict v = Readiness(false, 4, clear);
  CHECK_FALSE(v.ok);
  CHECK(v.reason == "vpc.amazonaws.com/efa is not registered with the kubelet yet");
  // Standing aside for another device plugin on its socket: the steady
  // state of the chart's pod beside the plugin's host service.
  v = Readiness(false, 4, clear, "vpc.amazonaws.com/efa", /*standing_aside=*/true);
  CHECK(v.ok);
  CHECK(v.reason ==
        "another device plugin serves vpc.amazonaws.com/efa on this node (the plugin's host "
        "service?): standing aside");

  // A MOFED conflict (warn or protect) is logs, metrics and device health.
  GuardStatus mofed;
  mofed.mofed.state = MofedState::kOn;
  mofed.mofed.evidence = {"a", "b"};
  v = Readiness(true, 4, mofed);
  CHECK(v.ok);
  CHECK(v.reason == "vpc.amazonaws.com/efa is registered with the kubelet");
  mofed.efas_held_unhealthy = true;
  CHECK(Readiness(true, 4, mofed).ok);
  CHECK_FALSE(Readiness(false, 4, mofed).ok);  // not registered is still not ready

  // The DRA driver under ignore: serving beside it, as configured.
  GuardStatus dra;
  dra.dra.present = true;
  dra.dra.driver = "dra.net";
  dra.dra.evidence = "sock";
  CHECK(Readiness(true, 4, dra).ok);
  // Under yield: withdrawn and unregistered, as configured.
  dra.withdrawn = true;
  v = Readiness(false, 4, dra);
  CHECK(v.ok);
  CHECK(v.reason ==
        "the EFA DRA driver (dra.net) serves this node's EFAs: vpc.amazonaws.com/efa is "
        "withdrawn, as --dra-policy=yield asks (sock)");
  // Under monitor: a DRA node pool's node, never registered.
  GuardStatus monitor = dra;
  monitor.dra_policy = DraPolicy::kMonitor;
  v = Readiness(false, 4, monitor);
  CHECK(v.ok);
  CHECK(v.reason ==
        "this node's EFAs are handed out by DRA (--dra-policy=monitor): vpc.amazonaws.com/efa is "
        "never registered; their health and traffic are exported (sock)");

  // Sharing renamed the resource: the reasons name the one registered.
  const char* shared = "vpc.amazonaws.com/efa.shared";
  CHECK(Readiness(true, 4, clear, shared).reason ==
        "vpc.amazonaws.com/efa.shared is registered with the kubelet");
  CHECK(Readiness(false, 4, clear, shared).reason ==
        "vpc.amazonaws.com/efa.shared is not registered with the kubelet yet");
  CHECK(Readiness(false, 4, dra, shared).reason ==
        "the EFA DRA driver (dra.net) serves this node's EFAs: vpc.amazonaws.com/efa.shared is "
        "withdrawn, as --dra-policy=yield asks (sock)");
}

namespace {

using SteadyClock = std::chrono::steady_clock;

}  // namespace

TEST_CASE("A flood of idle and slow connections to the metrics address does not delay the probes",
          "[monitor][http]") {
  MonitoredNode node("p4d.24xlarge");
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  // Both probes pass before the flood (the kubelet's initial delay).
  for (const char* path : {"/healthz", "/readyz"}) {
    const auto deadline = SteadyClock::now() + kDeadline;
    while (HttpGet(node.probe_port(), path).status != 200 && SteadyClock::now() < deadline) {
      std::this_thread::sleep_for(10ms);
    }
    REQUIRE(HttpGet(node.probe_port(), path).status == 200);
  }
  // 400 connections, half idle and half trickling a request a byte every
  // 300 ms: each is a descriptor of this process, which also runs the
  // servers, and cpp-httplib's client waits with select(), which cannot
  // watch a descriptor past FD_SETSIZE (1024). (test/integration/
  // http_flood_test.cc floods the daemon's binary with more connections
  // than it has descriptors.)
  efa::testing::ConnectionFlood flood(node.metrics_port(), 400, 300ms);

  httplib::Client client("127.0.0.1", node.probe_port());
  client.set_connection_timeout(1s);
  client.set_read_timeout(1s);
  client.set_write_timeout(1s);
  int probes = 0;
  double worst = 0;
  std::vector<std::string> failures;
  const auto start = SteadyClock::now();
  for (auto next = start; next < start + 5s; next += 100ms) {
    // The schedule of a prober, not a wait for an event.
    std::this_thread::sleep_until(next);
    for (const char* path : {"/healthz", "/readyz"}) {
      const auto sent = SteadyClock::now();
      auto reply = client.Get(path);
      const double took = std::chrono::duration<double>(SteadyClock::now() - sent).count();
      worst = std::max(worst, took);
      ++probes;
      if (!reply || reply->status != 200 || took >= 1.0) {
        failures.push_back(absl::StrCat(path, " at ",
                                        std::chrono::duration<double>(sent - start).count(),
                                        " s: ", reply ? reply->status : 0, " after ", took, " s"));
      }
    }
  }
  INFO("worst probe: " << worst << " s; flood connections made: " << flood.connected()
                       << ", closed by the server: " << flood.closed_by_server());
  CHECK(failures == std::vector<std::string>{});
  CHECK(probes >= 50);
  // The flood was real: every slot connected, and the server closed what
  // passed its cap of 64.
  CHECK(flood.connected() >= 400);
  CHECK(flood.closed_by_server() >= 400 - 64);
}

// The series of a family of the EFAs' counters on the p4d: one per EFA.
std::string EfaSeries(const std::string& counter) {
  std::string out;
  for (const char* labels : {"efa=\"rdmap144s27\",numa_node=\"1\",pci_address=\"0000:90:1b.0\"",
                             "efa=\"rdmap160s27\",numa_node=\"1\",pci_address=\"0000:a0:1b.0\"",
                             "efa=\"rdmap16s27\",numa_node=\"0\",pci_address=\"0000:10:1b.0\"",
                             "efa=\"rdmap32s27\",numa_node=\"0\",pci_address=\"0000:20:1b.0\""}) {
    out += absl::StrCat("  efa_device_plugin_efa_", counter, "_total{", labels, "}\n");
  }
  return out;
}

// What the Python prometheus_client parser reads in the exposition of a
// registered p4d node after one granted and one refused Allocate: every
// family the daemon exports, its type, HELP text and series (a counter's
// family name is without _total, as the parser reports it).
// The names and HELP texts are pinned because dashboards and alerts read
// them: those the daemon exported before it moved to prometheus-cpp, read
// the same way from that exposition, and the families added since
// (checkpoint_entries_skipped, watches_unavailable, efa_allocations and the EFAs' own counters:
// the p4d's 4 EFAs, no container series since this kubelet serves no
// pod-resources).
const std::string kExposition =
    std::string() +
    "efa_device_plugin_alignment_decisions counter \"GetPreferredAllocation decisions: "
    "targeted (the container's accelerators were known), predicted (none known yet), degraded "
    "(pod-resources failed).\"\n"
    "  efa_device_plugin_alignment_decisions_total{decision=\"degraded\"}\n"
    "  efa_device_plugin_alignment_decisions_total{decision=\"predicted\"}\n"
    "  efa_device_plugin_alignment_decisions_total{decision=\"targeted\"}\n"
    "efa_device_plugin_alignment_judgments counter \"Containers holding EFAs and accelerators, "
    "judged once after admission.\"\n"
    "  efa_device_plugin_alignment_judgments_total{result=\"aligned\"}\n"
    "  efa_device_plugin_alignment_judgments_total{result=\"unaligned\"}\n"
    "efa_device_plugin_alignment_report_failures counter \"Judgment passes that pod-resources "
    "failed; retried with backoff.\"\n"
    "  efa_device_plugin_alignment_report_failures_total{}\n"
    "efa_device_plugin_allocation_size histogram \"EFAs given to each container by "
    "Allocate.\"\n"
    "  efa_device_plugin_allocation_size_bucket{le=\"*\"}\n"
    "  efa_device_plugin_allocation_size_count{}\n"
    "  efa_device_plugin_allocation_size_sum{}\n"
    "  le: 1 2 4 8 16 32 +Inf\n"
    "efa_device_plugin_allocations counter \"Allocate calls, by gRPC status code.\"\n"
    "  efa_device_plugin_allocations_total{code=\"FAILED_PRECONDITION\"}\n"
    "  efa_device_plugin_allocations_total{code=\"INVALID_ARGUMENT\"}\n"
    "  efa_device_plugin_allocations_total{code=\"OK\"}\n"
    "efa_device_plugin_checkpoint_entries_skipped gauge \"Entries of the kubelet checkpoint "
    "skipped at its latest read because they cannot be parsed (the others are still used).\"\n"
    "  efa_device_plugin_checkpoint_entries_skipped{}\n"
    "efa_device_plugin_container_efa_impaired_remote_conn_events counter \"The efa driver's "
    "impaired_remote_conn_events counter of each EFA a container holds now, labelled with the "
    "container (with sharing, every sharer of an EFA shows the EFA's whole count).\"\n"
    "efa_device_plugin_container_efa_rdma_read_bytes counter \"The efa driver's "
    "rdma_read_bytes counter of each EFA a container holds now, labelled with the container "
    "(with sharing, every sharer of an EFA shows the EFA's whole count).\"\n"
    "efa_device_plugin_container_efa_rdma_write_bytes counter \"The efa driver's "
    "rdma_write_bytes counter of each EFA a container holds now, labelled with the container "
    "(with sharing, every sharer of an EFA shows the EFA's whole count).\"\n"
    "efa_device_plugin_container_efa_recv_bytes counter \"The efa driver's recv_bytes counter "
    "of each EFA a container holds now, labelled with the container (with sharing, every "
    "sharer of an EFA shows the EFA's whole count).\"\n"
    "efa_device_plugin_container_efa_retrans_bytes counter \"The efa driver's "
    "retrans_bytes counter of each EFA a container holds now, labelled with the container "
    "(with sharing, every sharer of an EFA shows the EFA's whole count).\"\n"
    "efa_device_plugin_container_efa_retrans_pkts counter \"The efa driver's "
    "retrans_pkts counter of each EFA a container holds now, labelled with the container "
    "(with sharing, every sharer of an EFA shows the EFA's whole count).\"\n"
    "efa_device_plugin_container_efa_retrans_timeout_events counter \"The efa driver's "
    "retrans_timeout_events counter of each EFA a container holds now, labelled with the "
    "container (with sharing, every sharer of an EFA shows the EFA's whole count).\"\n"
    "efa_device_plugin_container_efa_rx_bytes counter \"The efa driver's rx_bytes counter of "
    "each EFA a container holds now, labelled with the container (with sharing, every sharer "
    "of an EFA shows the EFA's whole count).\"\n"
    "efa_device_plugin_container_efa_send_bytes counter \"The efa driver's send_bytes counter "
    "of each EFA a container holds now, labelled with the container (with sharing, every "
    "sharer of an EFA shows the EFA's whole count).\"\n"
    "efa_device_plugin_container_efa_tx_bytes counter \"The efa driver's tx_bytes counter of "
    "each EFA a container holds now, labelled with the container (with sharing, every sharer "
    "of an EFA shows the EFA's whole count).\"\n"
    "efa_device_plugin_container_efa_unresponsive_remote_events counter \"The efa driver's "
    "unresponsive_remote_events counter of each EFA a container holds now, labelled with the "
    "container (with sharing, every sharer of an EFA shows the EFA's whole count).\"\n"
    "efa_device_plugin_container_idle_efas gauge \"EFAs a running container holds that moved "
    "no bytes for the idle timeout (allocated but unused: NCCL or libfabric may have fallen "
    "back to TCP).\"\n"
    "efa_device_plugin_devices gauge \"EFAs advertised to the kubelet, by health (after the "
    "guards: none while withdrawn, all unhealthy under MOFED protect; 0 when idle).\"\n"
    "  efa_device_plugin_devices{health=\"healthy\"}\n"
    "  efa_device_plugin_devices{health=\"unhealthy\"}\n"
    "efa_device_plugin_discovery_errors counter \"Device discovery's listings (list) and device "
    "reads (read) that failed for a reason that says nothing about the devices (out of "
    "descriptors or memory), and reads of the RDMA subsystem's network namespace mode that "
    "failed (netns_mode); what they hid kept its last known state.\"\n"
    "  efa_device_plugin_discovery_errors_total{operation=\"list\"}\n"
    "  efa_device_plugin_discovery_errors_total{operation=\"netns_mode\"}\n"
    "  efa_device_plugin_discovery_errors_total{operation=\"read\"}\n"
    "efa_device_plugin_dra_checks_incomplete counter \"DRA guard checks that could not list the "
    "plugin registry whole or probe a driver's socket, and kept the previous answer.\"\n"
    "  efa_device_plugin_dra_checks_incomplete_total{}\n"
    "efa_device_plugin_dra_driver_present gauge \"1 while the EFA DRA driver (dra.net) is "
    "registered.\"\n"
    "  efa_device_plugin_dra_driver_present{}\n"
    "efa_device_plugin_efa_advertised_unhealthy gauge \"1 for each EFA advertised Unhealthy to "
    "the kubelet, whatever the cause (gone, device health, MOFED protect); absent while "
    "Healthy.\"\n"
    "efa_device_plugin_efa_allocations counter \"Containers given each physical EFA by "
    "Allocate (with sharing, its replicas' containers).\"\n"
    "  efa_device_plugin_efa_allocations_total{efa=\"rdmap16s27\"}\n"
    "efa_device_plugin_efa_cmds_err counter \"Admin commands that failed. The efa driver's "
    "cmds_err counter.\"\n" +
    EfaSeries("cmds_err") +
    "efa_device_plugin_efa_completed_cmds counter \"Admin commands the device completed. The "
    "efa driver's completed_cmds counter.\"\n" +
    EfaSeries("completed_cmds") +
    "efa_device_plugin_efa_counters_files_unreadable counter \"Counter files not read for a "
    "reason that says nothing about the device (out of descriptors or memory, not a counter); "
    "device health keeps its verdict meanwhile.\"\n"
    "  efa_device_plugin_efa_counters_files_unreadable_total{}\n"
    "efa_device_plugin_efa_counters_holder_errors counter \"Reads of the counters whose question "
    "to pod-resources (which containers hold which EFAs) failed; the containers known before are "
    "kept.\"\n"
    "  efa_device_plugin_efa_counters_holder_errors_total{}\n"
    "efa_device_plugin_efa_counters_reads counter \"Reads of the EFAs' counters (on a scrape, "
    "or for device health; at most one per counterInterval).\"\n"
    "  efa_device_plugin_efa_counters_reads_total{}\n"
    "efa_device_plugin_efa_counters_unavailable gauge \"EFA counters not read at the latest "
    "read: missing (the driver has no such counter, as on older kernels), error (the device "
    "answered the read with an error) or unreadable (not read for a reason that says nothing "
    "about the device: out of descriptors or memory, not a counter).\"\n"
    "  efa_device_plugin_efa_counters_unavailable{efa=\"rdmap144s27\",reason=\"error\"}\n"
    "  efa_device_plugin_efa_counters_unavailable{efa=\"rdmap144s27\",reason=\"missing\"}\n"
    "  efa_device_plugin_efa_counters_unavailable{efa=\"rdmap144s27\",reason=\"unreadable\"}\n"
    "  efa_device_plugin_efa_counters_unavailable{efa=\"rdmap160s27\",reason=\"error\"}\n"
    "  efa_device_plugin_efa_counters_unavailable{efa=\"rdmap160s27\",reason=\"missing\"}\n"
    "  efa_device_plugin_efa_counters_unavailable{efa=\"rdmap160s27\",reason=\"unreadable\"}\n"
    "  efa_device_plugin_efa_counters_unavailable{efa=\"rdmap16s27\",reason=\"error\"}\n"
    "  efa_device_plugin_efa_counters_unavailable{efa=\"rdmap16s27\",reason=\"missing\"}\n"
    "  efa_device_plugin_efa_counters_unavailable{efa=\"rdmap16s27\",reason=\"unreadable\"}\n"
    "  efa_device_plugin_efa_counters_unavailable{efa=\"rdmap32s27\",reason=\"error\"}\n"
    "  efa_device_plugin_efa_counters_unavailable{efa=\"rdmap32s27\",reason=\"missing\"}\n"
    "  efa_device_plugin_efa_counters_unavailable{efa=\"rdmap32s27\",reason=\"unreadable\"}\n"
    "efa_device_plugin_efa_create_qp_err counter \"Queue-pair creations that failed. The efa "
    "driver's create_qp_err counter.\"\n" +
    EfaSeries("create_qp_err") +
    "efa_device_plugin_efa_impaired_remote_conn_events counter \"Connections to remote peers "
    "found impaired. The efa driver's impaired_remote_conn_events counter.\"\n" +
    EfaSeries("impaired_remote_conn_events") +
    "efa_device_plugin_efa_keep_alive_rcvd counter \"Keep-alive events the device sent to the "
    "driver. The efa driver's keep_alive_rcvd counter.\"\n" +
    EfaSeries("keep_alive_rcvd") +
    "efa_device_plugin_efa_no_completion_cmds counter \"Admin commands the device never "
    "completed (the driver then closes its admin queue). The efa driver's no_completion_cmds "
    "counter.\"\n" +
    EfaSeries("no_completion_cmds") +
    "efa_device_plugin_efa_rdma_read_bytes counter \"Bytes this EFA read remotely (RDMA read "
    "requester). The efa driver's rdma_read_bytes counter.\"\n" +
    EfaSeries("rdma_read_bytes") +
    "efa_device_plugin_efa_rdma_read_wr_err counter \"RDMA read work requests that failed. The "
    "efa driver's rdma_read_wr_err counter.\"\n" +
    EfaSeries("rdma_read_wr_err") +
    "efa_device_plugin_efa_rdma_write_bytes counter \"Bytes this EFA wrote remotely (RDMA "
    "write requester). The efa driver's rdma_write_bytes counter.\"\n" +
    EfaSeries("rdma_write_bytes") +
    "efa_device_plugin_efa_rdma_write_wr_err counter \"RDMA write work requests that failed. "
    "The efa driver's rdma_write_wr_err counter.\"\n" +
    EfaSeries("rdma_write_wr_err") +
    "efa_device_plugin_efa_recv_bytes counter \"Bytes of two-sided RECV operations. The efa "
    "driver's recv_bytes counter.\"\n" +
    EfaSeries("recv_bytes") +
    "efa_device_plugin_efa_reg_mr_err counter \"Memory registrations that failed. The efa "
    "driver's reg_mr_err counter.\"\n" +
    EfaSeries("reg_mr_err") +
    "efa_device_plugin_efa_reserved gauge \"1 for each EFA a running container holds under an "
    "earlier configuration (another alignment mode, resource name or replica count): "
    "advertised Unhealthy, so given to no new container, until that container ends; absent "
    "otherwise.\"\n"
    "efa_device_plugin_efa_retrans_bytes counter \"Bytes the EFA sent again (SRD "
    "retransmissions). The efa driver's retrans_bytes counter.\"\n" +
    EfaSeries("retrans_bytes") +
    "efa_device_plugin_efa_retrans_pkts counter \"Packets the EFA sent again (SRD "
    "retransmissions). The efa driver's retrans_pkts counter.\"\n" +
    EfaSeries("retrans_pkts") +
    "efa_device_plugin_efa_retrans_timeout_events counter \"Retransmission timeouts. The efa "
    "driver's retrans_timeout_events counter.\"\n" +
    EfaSeries("retrans_timeout_events") +
    "efa_device_plugin_efa_rx_bytes counter \"Bytes the EFA received (all traffic). The efa "
    "driver's rx_bytes counter.\"\n" +
    EfaSeries("rx_bytes") +
    "efa_device_plugin_efa_rx_drops counter \"Received packets the EFA dropped. The efa "
    "driver's rx_drops counter.\"\n" +
    EfaSeries("rx_drops") +
    "efa_device_plugin_efa_send_bytes counter \"Bytes of two-sided SEND operations. The efa "
    "driver's send_bytes counter.\"\n" +
    EfaSeries("send_bytes") +
    "efa_device_plugin_efa_submitted_cmds counter \"Admin commands submitted to the device. "
    "The efa driver's submitted_cmds counter.\"\n" +
    EfaSeries("submitted_cmds") +
    "efa_device_plugin_efa_tx_bytes counter \"Bytes the EFA sent (all traffic). The efa "
    "driver's tx_bytes counter.\"\n" +
    EfaSeries("tx_bytes") +
    "efa_device_plugin_efa_unhealthy_by_counters gauge \"1 for each EFA device health holds "
    "Unhealthy, by reason: keep_alive (keep_alive_rcvd stopped) or admin_errors (admin "
    "commands failing); only with deviceHealth on.\"\n"
    "efa_device_plugin_efa_unresponsive_remote_events counter \"Remote peers that stopped "
    "responding. The efa driver's unresponsive_remote_events counter.\"\n" +
    EfaSeries("unresponsive_remote_events") +
    "efa_device_plugin_efas_expected gauge \"EFAs the node should have (expectedEfaCount, else "
    "the instance type's count); absent when unknown.\"\n"
    "  efa_device_plugin_efas_expected{}\n"
    "efa_device_plugin_efas_found gauge \"EFAs found on the node by the last scan.\"\n"
    "  efa_device_plugin_efas_found{}\n"
    "efa_device_plugin_efas_held_unhealthy gauge \"1 while MOFED policy protect reports every "
    "EFA Unhealthy.\"\n"
    "  efa_device_plugin_efas_held_unhealthy{}\n"
    "efa_device_plugin_guard_checks counter \"Guard checks run.\"\n"
    "  efa_device_plugin_guard_checks_total{}\n"
    "efa_device_plugin_heartbeat_age_seconds gauge \"Seconds since the owner loop's last pass "
    "(see /healthz).\"\n"
    "  efa_device_plugin_heartbeat_age_seconds{}\n"
    "efa_device_plugin_http_accept_pauses counter \"Pauses of 100 ms in accepting HTTP "
    "connections, by listener, because accept() found no descriptor or memory left (EMFILE, "
    "ENFILE, ENOBUFS, ENOMEM).\"\n"
    "  efa_device_plugin_http_accept_pauses_total{listener=\"metrics\"}\n"
    "  efa_device_plugin_http_accept_pauses_total{listener=\"probe\"}\n"
    "efa_device_plugin_http_connections_dropped counter \"HTTP connections closed without an "
    "answer, by listener (metrics, probe) and reason: limit (accepted while "
    "metricsMaxConnections or probeMaxConnections, or half of them from the same client, were "
    "open; closed at once), timeout (not answered within httpRequestTimeout of connecting).\"\n"
    "  efa_device_plugin_http_connections_dropped_total{listener=\"metrics\",reason=\"limit\"}\n"
    "  efa_device_plugin_http_connections_dropped_total{listener=\"metrics\",reason=\"timeout\"}\n"
    "  efa_device_plugin_http_connections_dropped_total{listener=\"probe\",reason=\"limit\"}\n"
    "  efa_device_plugin_http_connections_dropped_total{listener=\"probe\",reason=\"timeout\"}\n"
    "efa_device_plugin_info gauge \"1, labelled with the plugin's version and mode (serving: the "
    "device-plugin API is served; idle: no EFA on the node yet).\"\n"
    "  efa_device_plugin_info{mode=\"serving\",version=\"" EFA_VERSION
    "\"}\n"
    "efa_device_plugin_kubelet_restarts counter \"Kubelet restarts seen (kubelet.sock "
    "re-created).\"\n"
    "  efa_device_plugin_kubelet_restarts_total{}\n"
    "efa_device_plugin_late_binding counter \"Late binding: EFAs bound at PreStartContainer, or "
    "for a container that no call will come for before it starts (bound), kept for a restarted "
    "container (kept), failures to bind (failed), bindings released (released), recovered from "
    "the CDI dir at start (recovered), release "
    "passes the kubelet's records could not decide (undecided), and reads of the CDI dir that "
    "were not whole (recover_incomplete; retried, the daemon registers only after a whole "
    "one).\"\n"
    "  efa_device_plugin_late_binding_total{event=\"bound\"}\n"
    "  efa_device_plugin_late_binding_total{event=\"failed\"}\n"
    "  efa_device_plugin_late_binding_total{event=\"kept\"}\n"
    "  efa_device_plugin_late_binding_total{event=\"recover_incomplete\"}\n"
    "  efa_device_plugin_late_binding_total{event=\"recovered\"}\n"
    "  efa_device_plugin_late_binding_total{event=\"released\"}\n"
    "  efa_device_plugin_late_binding_total{event=\"undecided\"}\n"
    "efa_device_plugin_late_bound_unserved_name gauge \"Running containers late-bound under the "
    "EFA resource name the daemon no longer serves (sharing's rename changed it): they keep "
    "their EFAs while they run, but the kubelet cannot restart them.\"\n"
    "  efa_device_plugin_late_bound_unserved_name{}\n"
    "efa_device_plugin_mofed_checks_incomplete counter \"MOFED guard checks that stopped at a "
    "bound (the time box, the cap on nvidia-device-plugin processes read, a file's size) or for "
    "want of descriptors or memory, and kept the previous verdict.\"\n"
    "  efa_device_plugin_mofed_checks_incomplete_total{}\n"
    "efa_device_plugin_mofed_state gauge \"1 for the NVIDIA MOFED guard's current state (off, "
    "on, unknown); all 0 with the policy off.\"\n"
    "  efa_device_plugin_mofed_state{state=\"off\"}\n"
    "  efa_device_plugin_mofed_state{state=\"on\"}\n"
    "  efa_device_plugin_mofed_state{state=\"unknown\"}\n"
    "efa_device_plugin_rdma_netns_exclusive gauge \"1 while the RDMA subsystem is in exclusive "
    "network namespace mode (ib_core netns_mode N): containers outside the host's network "
    "namespace cannot open their EFAs, and EFAs a DRA driver moves into pods are out of the "
    "daemon's sight.\"\n"
    "  efa_device_plugin_rdma_netns_exclusive{}\n"
    "efa_device_plugin_registered gauge \"1 while vpc.amazonaws.com/efa is registered.\"\n"
    "  efa_device_plugin_registered{}\n"
    "efa_device_plugin_registrations counter \"Successful registrations with the kubelet.\"\n"
    "  efa_device_plugin_registrations_total{}\n"
    "efa_device_plugin_rpc_duration_seconds histogram \"Time spent in the device-plugin RPC "
    "handlers, by method.\"\n"
    "  efa_device_plugin_rpc_duration_seconds_bucket{method=\"Allocate\",le=\"*\"}\n"
    "  "
    "efa_device_plugin_rpc_duration_seconds_bucket{method=\"GetDevicePluginOptions\",le=\"*\"}\n"
    "  "
    "efa_device_plugin_rpc_duration_seconds_bucket{method=\"GetPreferredAllocation\",le=\"*\"}\n"
    "  efa_device_plugin_rpc_duration_seconds_bucket{method=\"PreStartContainer\",le=\"*\"}\n"
    "  efa_device_plugin_rpc_duration_seconds_count{method=\"Allocate\"}\n"
    "  efa_device_plugin_rpc_duration_seconds_count{method=\"GetDevicePluginOptions\"}\n"
    "  efa_device_plugin_rpc_duration_seconds_count{method=\"GetPreferredAllocation\"}\n"
    "  efa_device_plugin_rpc_duration_seconds_count{method=\"PreStartContainer\"}\n"
    "  efa_device_plugin_rpc_duration_seconds_sum{method=\"Allocate\"}\n"
    "  efa_device_plugin_rpc_duration_seconds_sum{method=\"GetDevicePluginOptions\"}\n"
    "  efa_device_plugin_rpc_duration_seconds_sum{method=\"GetPreferredAllocation\"}\n"
    "  efa_device_plugin_rpc_duration_seconds_sum{method=\"PreStartContainer\"}\n"
    "  le: 0.0001 0.00025 0.0005 0.001 0.0025 0.005 0.01 0.025 0.05 0.1 0.25 0.5 1 2.5 +Inf\n"
    "efa_device_plugin_start_time_seconds gauge \"Start of the process, seconds since the Unix "
    "epoch (kept across the hand-over between the daemon and the idle process: a change is a "
    "restart).\"\n"
    "  efa_device_plugin_start_time_seconds{}\n"
    "efa_device_plugin_watches_unavailable gauge \"Directories the daemon cannot watch with "
    "inotify now: the kernel refused the watch or gave no inotify instance (fs.inotify limits). "
    "While above 0 it runs on its timers: the periodic pass looks for what their events would "
    "report.\"\n"
    "  efa_device_plugin_watches_unavailable{}\n"
    "efa_device_plugin_withdrawn gauge \"1 while vpc.amazonaws.com/efa is withdrawn for the "
    "DRA driver (always under draPolicy monitor).\"\n"
    "  efa_device_plugin_withdrawn{}\n";
// Late binding's Allocate gives tokens, not EFAs, so the per-EFA counter
// never has a series and prometheus-cpp leaves its family out.
const std::string kLateBindingExposition = absl::StrReplaceAll(
    kExposition, {{"efa_device_plugin_efa_allocations counter \"Containers given each physical EFA "
                   "by Allocate (with sharing, its replicas' containers).\"\n"
                   "  efa_device_plugin_efa_allocations_total{efa=\"rdmap16s27\"}\n",
                   ""}});

TEST_CASE("Every metric keeps its name, type, labels and HELP text for a Prometheus parser",
          "[monitor][metrics]") {
  for (AlignmentMode mode : {AlignmentMode::kBestEffort, AlignmentMode::kLateBinding}) {
    CAPTURE(static_cast<int>(mode));
    MonitoredNode node("p4d.24xlarge", nullptr, MofedPolicy::kWarn, mode);
    REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
    CHECK(Allocate(node.kubelet(), {"rdmap16s27"}).ok());
    CHECK(Allocate(node.kubelet(), {"nope"}).error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    REQUIRE(node.WaitScrape(
        Has({{"efa_device_plugin_allocations_total{code=\"OK\"}", 1},
             {"efa_device_plugin_allocations_total{code=\"INVALID_ARGUMENT\"}", 1}})));
    const auto summary = SummarizeExposition(node.Get("/metrics").body);
    REQUIRE(summary.exit_status == 0);
    CHECK(summary.text ==
          (mode == AlignmentMode::kLateBinding ? kLateBindingExposition : kExposition));
  }
}
