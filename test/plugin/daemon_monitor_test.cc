// /metrics, /healthz and /readyz of a running daemon, fetched over real HTTP
// while the fake kubelet and the simulated node change under it.
#include "plugin/daemon_monitor.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "test/fake_kubelet/fake_kubelet.h"
#include "test/plugin/guard_fakes.h"
#include "test/plugin/http_client.h"
#include "test/sim/sim_root.h"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using namespace efa::plugin;
using efa::sim::SimRoot;
using efa::testing::FakeDraDriver;
using efa::testing::FakeKubelet;
using efa::testing::HttpGet;
using efa::testing::HttpReply;
using efa::testing::ParseMetrics;
using efa::testing::WriteFileAtomically;

namespace {

constexpr char kEfa[] = "vpc.amazonaws.com/efa";
constexpr auto kDeadline = 10s;
using Metrics = std::map<std::string, double>;

// A simulated node with the fake kubelet, the daemon on a thread and its
// monitor serving HTTP on a free loopback port.
class MonitoredNode {
 public:
  explicit MonitoredNode(const std::string& machine,
                         const std::function<void(SimRoot&)>& prepare = nullptr,
                         MofedPolicy mofed_policy = MofedPolicy::kWarn)
      : sim_(machine), kubelet_(sim_.path() / "kubelet/device-plugins") {
    if (prepare) prepare(sim_);
    REQUIRE(kubelet_.Start().ok());
    // Watched only when they exist at start (as on a node).
    fs::create_directories(cdi_dir());
    fs::create_directories(registry());
    DaemonOptions options;
    options.roots = sim_.roots();
    options.kubelet_dir = sim_.path() / "kubelet";
    options.cdi_spec_dirs = {cdi_dir()};
    options.mofed_policy = mofed_policy;
    monitor_ = std::make_unique<DaemonMonitor>(
        MonitorOptions{options.rescan_interval, "", options.roots.sysfs, 0});
    monitor_->Attach(options);
    daemon_ = std::make_unique<Daemon>(options);
    monitor_->Watch(daemon_.get());
    auto http = HttpServer::Start("127.0.0.1:0", monitor_->Routes());
    REQUIRE(http.ok());
    http_ = *std::move(http);
    thread_ = std::thread([this] { daemon_->Run(); });
  }
  ~MonitoredNode() {
    daemon_->Stop();
    thread_.join();
  }

  SimRoot& sim() { return sim_; }
  FakeKubelet& kubelet() { return kubelet_; }
  Daemon& daemon() { return *daemon_; }
  fs::path cdi_dir() const { return sim_.path() / "var/run/cdi"; }
  fs::path registry() const { return sim_.path() / "kubelet/plugins_registry"; }

  HttpReply Get(const std::string& path) { return HttpGet(http_->port(), path); }
  Metrics Scrape() { return ParseMetrics(Get("/metrics").body); }

  // The daemon publishes its state once per loop pass and the RPC metrics
  // after each handler returns: scrape until `want` holds.
  bool WaitMetrics(const std::function<bool(const Metrics&)>& want) {
    const auto deadline = std::chrono::steady_clock::now() + kDeadline;
    while (std::chrono::steady_clock::now() < deadline) {
      if (want(Scrape())) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
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

 private:
  SimRoot sim_;
  FakeKubelet kubelet_;
  std::unique_ptr<DaemonMonitor> monitor_;
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<HttpServer> http_;
  std::thread thread_;
};

// Whether every (series, value) of `want` is in the scrape.
std::function<bool(const Metrics&)> Has(Metrics want) {
  return [want = std::move(want)](const Metrics& m) {
    for (const auto& [series, value] : want) {
      auto it = m.find(series);
      if (it == m.end() || it->second != value) return false;
    }
    return true;
  };
}

grpc::Status Allocate(FakeKubelet& kubelet, std::initializer_list<const char*> ids) {
  v1beta1::AllocateRequest request;
  auto* c = request.add_container_requests();
  for (const char* id : ids) c->add_devices_ids(id);
  v1beta1::AllocateResponse response;
  return kubelet.Allocate(kEfa, request, &response);
}

}  // namespace

TEST_CASE("Metrics follow the devices' health, allocations and kubelet restarts",
          "[monitor][daemon][concurrency]") {
  MonitoredNode node("p4d.24xlarge");
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(node.WaitMetrics(Has({{"efa_device_plugin_devices{health=\"healthy\"}", 4},
                                {"efa_device_plugin_devices{health=\"unhealthy\"}", 0},
                                {"efa_device_plugin_registered", 1},
                                {"efa_device_plugin_registrations_total", 1},
                                {"efa_device_plugin_kubelet_restarts_total", 0},
                                {"efa_device_plugin_efas_found", 4},
                                {"efa_device_plugin_efas_expected", 4}})));
  HttpReply reply = node.Get("/metrics");
  CHECK(reply.status == 200);
  CHECK(reply.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8");
  CHECK(reply.body.find("# TYPE efa_device_plugin_rpc_duration_seconds histogram\n") !=
        std::string::npos);

  // A uverbs node disappears: one device turns Unhealthy.
  fs::remove(node.sim().path() / "dev/infiniband/uverbs1");
  REQUIRE(node.WaitMetrics(Has({{"efa_device_plugin_devices{health=\"healthy\"}", 3},
                                {"efa_device_plugin_devices{health=\"unhealthy\"}", 1},
                                {"efa_device_plugin_efas_found", 4}})));

  // Allocations: one granted (2 EFAs), one refused (the unhealthy device).
  REQUIRE(Allocate(node.kubelet(), {"rdmap16s27", "rdmap144s27"}).ok());
  CHECK(Allocate(node.kubelet(), {"rdmap32s27"}).error_code() ==
        grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(node.WaitMetrics(Has(
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
  CHECK(node.WaitMetrics(Has({{"efa_device_plugin_devices{health=\"healthy\"}", 4},
                              {"efa_device_plugin_devices{health=\"unhealthy\"}", 0},
                              {"efa_device_plugin_registrations_total", 2},
                              {"efa_device_plugin_kubelet_restarts_total", 1}})));
  // Alignment counters are exported (GetPreferredAllocation was not called).
  const Metrics m = node.Scrape();
  CHECK(m.at("efa_device_plugin_alignment_decisions_total{decision=\"targeted\"}") == 0);
  CHECK(m.at("efa_device_plugin_alignment_judgments_total{result=\"unaligned\"}") == 0);
  CHECK(m.at("efa_device_plugin_heartbeat_age_seconds") < 30);
}

TEST_CASE("Readiness and the guard metrics follow the MOFED conflict and the DRA driver",
          "[monitor][daemon][concurrency]") {
  MonitoredNode node("p4d.24xlarge");
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(
      node.WaitReply("/readyz", 200, "ok: vpc.amazonaws.com/efa is registered with the kubelet\n"));
  CHECK(node.Get("/healthz").status == 200);
  CHECK(node.Get("/healthz").body.rfind("ok: the owner loop ran ", 0) == 0);
  CHECK(node.WaitMetrics(Has({{"efa_device_plugin_mofed_state{state=\"off\"}", 1},
                              {"efa_device_plugin_mofed_state{state=\"on\"}", 0},
                              {"efa_device_plugin_dra_driver_present", 0},
                              {"efa_device_plugin_withdrawn", 0}})));

  // The NVIDIA MOFED CDI spec appears (policy warn): a conflict, shown in
  // the metrics; the daemon still serves as configured, so still ready.
  const fs::path spec = node.cdi_dir() / "k8s.device-plugin.nvidia.com-mofed.json";
  WriteFileAtomically(spec,
                      R"({"cdiVersion":"0.5.0","kind":"k8s.device-plugin.nvidia.com/mofed"})");
  REQUIRE(node.daemon().WaitForGuardStatusForTest(
      [](const GuardStatus& s) { return s.mofed.state == MofedState::kOn; }, kDeadline));
  CHECK(node.Get("/readyz").status == 200);
  CHECK(node.Get("/readyz").body == "ok: vpc.amazonaws.com/efa is registered with the kubelet\n");
  CHECK(node.WaitMetrics(Has({{"efa_device_plugin_mofed_state{state=\"off\"}", 0},
                              {"efa_device_plugin_mofed_state{state=\"on\"}", 1},
                              {"efa_device_plugin_efas_held_unhealthy", 0},
                              {"efa_device_plugin_devices{health=\"healthy\"}", 4}})));
  fs::remove(spec);
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
  CHECK(node.WaitMetrics(Has({{"efa_device_plugin_dra_driver_present", 1},
                              {"efa_device_plugin_withdrawn", 1},
                              {"efa_device_plugin_devices{health=\"healthy\"}", 0},
                              {"efa_device_plugin_devices{health=\"unhealthy\"}", 0}})));
  driver.Stop();
  CHECK(
      node.WaitReply("/readyz", 200, "ok: vpc.amazonaws.com/efa is registered with the kubelet\n"));
  CHECK(node.WaitMetrics(Has(
      {{"efa_device_plugin_withdrawn", 0}, {"efa_device_plugin_devices{health=\"healthy\"}", 4}})));
  CHECK(node.Scrape().at("efa_device_plugin_guard_checks_total") >= 4);
}

TEST_CASE("Under policy protect the MOFED metrics and health go on, off and on again",
          "[monitor][daemon][concurrency]") {
  MonitoredNode node("p4d.24xlarge", nullptr, MofedPolicy::kProtect);
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  const fs::path spec = node.cdi_dir() / "k8s.device-plugin.nvidia.com-mofed.json";
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    CHECK(node.WaitMetrics(Has({{"efa_device_plugin_mofed_state{state=\"off\"}", 1},
                                {"efa_device_plugin_efas_held_unhealthy", 0},
                                {"efa_device_plugin_devices{health=\"healthy\"}", 4},
                                {"efa_device_plugin_devices{health=\"unhealthy\"}", 0}})));
    WriteFileAtomically(spec,
                        R"({"cdiVersion":"0.5.0","kind":"k8s.device-plugin.nvidia.com/mofed"})");
    CHECK(node.WaitMetrics(Has({{"efa_device_plugin_mofed_state{state=\"on\"}", 1},
                                {"efa_device_plugin_efas_held_unhealthy", 1},
                                {"efa_device_plugin_devices{health=\"healthy\"}", 0},
                                {"efa_device_plugin_devices{health=\"unhealthy\"}", 4}})));
    // What the kubelet is told agrees with the metric.
    const auto list = node.daemon().advertised();
    for (const auto& d : list.devices()) CHECK(d.health() == "Unhealthy");
    fs::remove(spec);
  }
  CHECK(node.WaitMetrics(Has({{"efa_device_plugin_mofed_state{state=\"off\"}", 1},
                              {"efa_device_plugin_devices{health=\"healthy\"}", 4}})));
  const auto list = node.daemon().advertised();
  CHECK(list.devices_size() == 4);
  for (const auto& d : list.devices()) CHECK(d.health() == "Healthy");
}

TEST_CASE("A node without EFA is ready with nothing to register",
          "[monitor][daemon][concurrency]") {
  MonitoredNode node("no-efa");
  CHECK(node.WaitReply("/readyz", 200, "ok: no EFA on this node, nothing to register\n"));
  CHECK(node.WaitMetrics(Has({{"efa_device_plugin_registered", 0},
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
  CHECK(node.WaitMetrics(Has({{"efa_device_plugin_efas_found", 31},
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

TEST_CASE("Readiness follows serving as configured, not guard findings", "[monitor][concurrency]") {
  GuardStatus clear;
  CHECK(Readiness(true, 4, clear).ok);
  CHECK(Readiness(false, 0, clear).ok);
  ProbeVerdict v = Readiness(false, 4, clear);
  CHECK_FALSE(v.ok);
  CHECK(v.reason == "vpc.amazonaws.com/efa is not registered with the kubelet yet");

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
  dra.dra.evidence = "sock";
  CHECK(Readiness(true, 4, dra).ok);
  // Under yield: withdrawn and unregistered, as configured.
  dra.withdrawn = true;
  v = Readiness(false, 4, dra);
  CHECK(v.ok);
  CHECK(v.reason ==
        "the EFA DRA driver (dra.net) serves this node's EFAs: vpc.amazonaws.com/efa is "
        "withdrawn, as --dra-policy=yield asks (sock)");
}
