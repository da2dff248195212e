// The EFAs' counters read from a simulated node's sysfs, with time given by
// the test: read at most once per interval, missing files counted, idle
// EFAs of a container, and device health with its hold-down.
#include "plugin/ops/efa_counter_monitor.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "spdlog/spdlog.h"
#include "test/sim/sim_root.h"
#include "test/support/descriptor_table_full.h"
#include "test/support/fake_clock.h"
#include "test/support/log_capture.h"
#include "test/support/sanitized.h"
#include "topology/efa_discovery.h"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using namespace efa::plugin;
using efa::sim::SimRoot;
using efa::testing::LogCapture;

namespace {

// The p4d's EFAs, in PCI order.
constexpr char kEfa0[] = "rdmap16s27";
constexpr char kEfa1[] = "rdmap32s27";
constexpr char kEfa2[] = "rdmap144s27";

// A monitor of a simulated p4d whose clock the test moves.
struct Node {
  explicit Node(EfaCounterMonitorOptions options = {}) : sim("p4d.24xlarge") {
    options.sysfs_root = sim.sys();
    options.clock = &clock;
    options.holders = [this]() -> absl::StatusOr<std::vector<EfaHolder>> {
      if (!holders_error.ok()) return holders_error;
      return holders;
    };
    options.on_health_change = [this] { ++health_changes; };
    monitor = std::make_unique<EfaCounterMonitor>(std::move(options));
    monitor->SetDevices(efa::topology::DiscoverEfaDevices(sim.roots()).devices);
  }
  const EfaCounterSnapshot::Efa& Efa(const EfaCounterSnapshot& s, const std::string& ibdev) {
    for (const auto& e : s.efas) {
      if (e.device.ibdev == ibdev) return e;
    }
    throw std::runtime_error("no EFA " + ibdev);
  }

  SimRoot sim;
  efa::testing::FakeClock clock;
  std::vector<EfaHolder> holders;
  absl::Status holders_error;  // not OK: listing them fails so
  int health_changes = 0;
  std::unique_ptr<EfaCounterMonitor> monitor;
};

// Makes `counter` a file that opens but whose read() fails with EIO, as a
// driver's get_hw_stats failing does: /proc/self/mem at address 0.
void ReadFailsWithEio(const fs::path& counter) {
  fs::remove(counter);
  fs::create_symlink("/proc/self/mem", counter);
}

EfaCounterMonitorOptions Health(std::chrono::milliseconds keep_alive, int admin_errors,
                                std::chrono::milliseconds hold_down) {
  EfaCounterMonitorOptions o;
  o.interval = 10s;
  o.health = {true, keep_alive, admin_errors, hold_down};
  return o;
}

}  // namespace

TEST_CASE("EFA counters are read at most once per interval, for the present EFAs only",
          "[counters]") {
  EfaCounterMonitorOptions options;
  options.interval = 10s;
  Node node(options);
  auto devices = efa::topology::DiscoverEfaDevices(node.sim.roots()).devices;
  REQUIRE(devices.size() == 4);
  devices.pop_back();  // gone from the latest scan
  node.monitor->SetDevices(devices);
  node.sim.SetCounter(kEfa0, "tx_bytes", 4096);
  node.sim.SetCounter(kEfa0, "keep_alive_rcvd", 7);

  auto first = node.monitor->Sample();
  CHECK(first->reads == 1);
  REQUIRE(first->efas.size() == 3);
  const auto& efa0 = node.Efa(*first, kEfa0);
  CHECK(efa0.device.pci.ToString() == "0000:10:1b.0");
  CHECK(efa0.counters.Get("tx_bytes") == 4096u);
  CHECK(efa0.counters.Get("keep_alive_rcvd") == 7u);
  CHECK(efa0.counters.Get("rx_bytes") == 0u);
  CHECK(efa0.counters.missing == 0);
  CHECK(efa0.counters.errors.empty());

  // Within the interval: the same read, whatever the files say now.
  node.sim.SetCounter(kEfa0, "tx_bytes", 8192);
  node.clock.Advance(9999ms);
  CHECK(node.monitor->Sample() == first);
  node.clock.Advance(1ms);
  auto second = node.monitor->Sample();
  CHECK(second->reads == 2);
  CHECK(node.Efa(*second, kEfa0).counters.Get("tx_bytes") == 8192u);
}

TEST_CASE(
    "A counter file the driver does not have is counted as missing, a failing read as an error, "
    "a bad one as unreadable",
    "[counters]") {
  Node node;
  // An older kernel without the port counters; garbage and a directory
  // where two counters should be; a read the device answers with EIO.
  fs::remove_all(node.sim.sys() / "class/infiniband" / kEfa1 / "ports/1/hw_counters");
  const fs::path counters = node.sim.sys() / "class/infiniband" / kEfa2 / "hw_counters";
  std::ofstream(counters / "cmds_err") << "many\n";
  fs::remove(counters / "reg_mr_err");
  fs::create_directory(counters / "reg_mr_err");
  const fs::path rx = node.sim.sys() / "class/infiniband" / kEfa2 / "ports/1/hw_counters/rx_bytes";
  ReadFailsWithEio(rx);

  auto s = node.monitor->Sample();
  const auto& efa1 = node.Efa(*s, kEfa1);
  int port_counters = 0;
  for (const auto& c : efa::topology::EfaCounters()) port_counters += c.port ? 1 : 0;
  CHECK(efa1.counters.missing == port_counters);
  CHECK(efa1.counters.errors.empty());
  CHECK_FALSE(efa1.counters.Get("tx_bytes").has_value());
  CHECK(efa1.counters.Get("keep_alive_rcvd") == 0u);

  const auto& efa2 = node.Efa(*s, kEfa2);
  CHECK(efa2.counters.missing == 0);
  CHECK(efa2.counters.errors == std::vector<std::string>{rx.string() + ": Input/output error"});
  CHECK(efa2.counters.unreadable ==
        std::vector<std::string>{
            (counters / "cmds_err").string() + ": expected a counter like \"1234\", got \"many\"",
            (counters / "reg_mr_err").string() + ": Is a directory"});
  CHECK_FALSE(efa2.counters.Get("cmds_err").has_value());
  CHECK(efa2.counters.Get("tx_bytes") == 0u);
  CHECK(s->unreadable_total == 2);
}

TEST_CASE(
    "The network counters are read where the driver has them; an older driver's lack of them is "
    "missing, not an error",
    "[counters]") {
  const std::vector<std::string> network = {"retrans_bytes", "retrans_pkts",
                                            "retrans_timeout_events", "unresponsive_remote_events",
                                            "impaired_remote_conn_events"};
  for (const std::string& name : network) {
    CAPTURE(name);
    const int i = efa::topology::EfaCounterIndex(name);
    REQUIRE(i >= 0);
    const auto& counter = efa::topology::EfaCounters()[static_cast<size_t>(i)];
    CHECK(counter.port);
    CHECK(counter.per_container);
  }
  for (const bool has_network : {true, false}) {
    CAPTURE(has_network);
    auto spec = efa::sim::FindMachine("p4d.24xlarge");
    REQUIRE(spec.ok());
    spec->efa_network_counters = has_network;
    SimRoot sim(*spec);
    if (has_network) {
      uint64_t value = 11;
      for (const std::string& name : network) sim.SetCounter(kEfa0, name, value++);
    } else {
      CHECK_THROWS(sim.SetCounter(kEfa0, "unresponsive_remote_events", 1));
    }
    EfaCounterMonitorOptions options;
    options.sysfs_root = sim.sys();
    EfaCounterMonitor monitor(std::move(options));
    monitor.SetDevices(efa::topology::DiscoverEfaDevices(sim.roots()).devices);
    auto snapshot = monitor.Sample();
    REQUIRE(snapshot->efas.size() == 4);
    for (const auto& efa : snapshot->efas) {
      CAPTURE(efa.device.ibdev);
      CHECK(efa.counters.missing == (has_network ? 0 : 5));
      CHECK(efa.counters.errors.empty());
      CHECK(efa.counters.unreadable.empty());
      CHECK(efa.counters.Get("tx_bytes") == 0u);
      uint64_t value = 11;
      for (const std::string& name : network) {
        CAPTURE(name);
        const std::optional<uint64_t> want =
            !has_network ? std::nullopt
                         : std::optional<uint64_t>(efa.device.ibdev == kEfa0 ? value++ : 0);
        CHECK(efa.counters.Get(name) == want);
      }
    }
  }
}

TEST_CASE("A container's EFAs that move no bytes for the idle timeout are idle, until they do",
          "[counters]") {
  EfaCounterMonitorOptions options;
  options.interval = 1s;
  options.idle_timeout = 10min;
  Node node(options);
  LogCapture log;
  node.holders = {{"default", "train-0", "main", {kEfa0, kEfa1}}};

  auto s = node.monitor->Sample();
  REQUIRE(s->containers.size() == 1);
  CHECK(s->containers[0].holder.Name() == "default/train-0/main");
  CHECK(s->containers[0].idle.empty());
  node.clock.Advance(10min - 1s);
  CHECK(node.monitor->Sample()->containers[0].idle.empty());
  CHECK(log.Take().empty());

  node.clock.Advance(1s);
  CHECK(node.monitor->Sample()->containers[0].idle == std::vector<std::string>{kEfa0, kEfa1});
  CHECK(log.Take() == std::vector<std::string>{
                          "[warning] allocated EFAs idle: possible TCP fallback: pod "
                          "default/train-0 container main: EFAs rdmap16s27,rdmap32s27 (2 of its "
                          "2) moved no bytes for 10m"});
  // Still idle: said once.
  node.clock.Advance(1min);
  CHECK(node.monitor->Sample()->containers[0].idle.size() == 2);
  CHECK(log.Take().empty());

  // One EFA moves bytes (received only); a new container gets an EFA that
  // has been idle all along: it is idle only 10 minutes after it got it.
  node.sim.SetCounter(kEfa1, "rx_bytes", 1);
  node.holders.push_back({"ml", "infer-0", "server", {kEfa2}});
  node.clock.Advance(1min);
  s = node.monitor->Sample();
  REQUIRE(s->containers.size() == 2);
  CHECK(s->containers[0].idle == std::vector<std::string>{kEfa0});
  CHECK(s->containers[1].idle.empty());
  CHECK(log.Take() ==
        std::vector<std::string>{"[info] allocated EFAs moving bytes again: pod default/train-0 "
                                 "container main: EFAs rdmap32s27 (still idle: rdmap16s27)"});
  node.clock.Advance(10min);
  s = node.monitor->Sample();
  CHECK(s->containers[0].idle == std::vector<std::string>{kEfa0, kEfa1});
  CHECK(s->containers[1].idle == std::vector<std::string>{kEfa2});

  // The pod goes: its container's series go with it.
  node.holders.erase(node.holders.begin());
  node.clock.Advance(1s);
  s = node.monitor->Sample();
  REQUIRE(s->containers.size() == 1);
  CHECK(s->containers[0].holder.Name() == "ml/infer-0/server");
}

TEST_CASE("Holders that cannot be listed leave the last known ones, counted and said once",
          "[counters]") {
  EfaCounterMonitorOptions options;
  options.interval = 1s;
  Node node(options);
  LogCapture log;
  node.holders = {{"default", "train-0", "main", {kEfa0}}};
  CHECK(node.monitor->Sample()->containers.size() == 1);
  node.holders_error = absl::UnavailableError("kubelet.sock: List: connection refused");
  std::shared_ptr<const EfaCounterSnapshot> s;
  for (int i = 0; i < 3; ++i) {
    node.clock.Advance(1s);
    s = node.monitor->Sample();
    REQUIRE(s->containers.size() == 1);
    CHECK(s->containers[0].holder.Name() == "default/train-0/main");
  }
  CHECK(s->holder_errors == 3);
  CHECK(log.Take() ==
        std::vector<std::string>{
            "[warning] EFA counters: cannot tell which containers hold EFAs (kubelet.sock: List: "
            "connection refused); using the last known until pod-resources answers (counted in "
            "efa_device_plugin_efa_counters_holder_errors_total)"});
  node.holders_error = absl::OkStatus();
  node.clock.Advance(1s);
  CHECK(node.monitor->Sample()->holder_errors == 3);
  CHECK(log.Take() == std::vector<std::string>{"[info] EFA counters: pod-resources answers again "
                                               "(it failed before: UNAVAILABLE)"});
}

TEST_CASE("keep_alive_rcvd that stops makes an EFA Unhealthy, healthy again after the hold-down",
          "[counters][health]") {
  Node node(Health(60s, 10, 5min));
  LogCapture log;
  node.sim.SetCounter(kEfa0, "keep_alive_rcvd", 1);
  node.monitor->Sample();
  node.clock.Advance(10s);
  node.sim.SetCounter(kEfa0, "keep_alive_rcvd", 2);  // seen advancing
  node.monitor->Sample();
  node.clock.Advance(50s);
  node.monitor->Sample();
  CHECK(node.monitor->HealthProblems().empty());

  node.clock.Advance(10s);  // 60 s since it last advanced
  auto s = node.monitor->Sample();
  const std::string reason =
      "keep_alive_rcvd has not advanced for 1m (stuck at 2): the device stopped sending "
      "keep-alives";
  CHECK(node.monitor->HealthProblems() == std::map<std::string, std::string>{{kEfa0, reason}});
  CHECK(node.Efa(*s, kEfa0).unhealthy_kind == "keep_alive");
  CHECK(node.health_changes == 1);
  CHECK(log.Take() == std::vector<std::string>{
                          "[warning] EFA rdmap16s27 is unhealthy by its counters: " + reason});

  // It resumes, stalls again within the hold-down (still Unhealthy, said
  // once), resumes: Healthy only a whole hold-down after the last problem.
  node.clock.Advance(10s);
  node.sim.SetCounter(kEfa0, "keep_alive_rcvd", 3);
  node.monitor->Sample();
  for (int i = 0; i < 6; ++i) {
    node.clock.Advance(10s);
    node.monitor->Sample();
  }
  CHECK(node.monitor->HealthProblems().size() == 1);  // stalled 60 s again
  node.clock.Advance(10s);
  node.sim.SetCounter(kEfa0, "keep_alive_rcvd", 4);
  node.monitor->Sample();
  const auto resumed = node.clock.Now();
  while (node.clock.Now() < resumed + 5min - 10s) {
    node.clock.Advance(10s);
    node.sim.SetCounter(kEfa0, "keep_alive_rcvd", 5 + (node.clock.Now() - resumed) / 10s);
    node.monitor->Sample();
    REQUIRE(node.monitor->HealthProblems().size() == 1);
  }
  CHECK(node.health_changes == 1);
  CHECK(log.Take().empty());
  node.clock.Advance(10s);
  node.sim.SetCounter(kEfa0, "keep_alive_rcvd", 100);
  node.monitor->Sample();
  CHECK(node.monitor->HealthProblems().empty());
  CHECK(node.health_changes == 2);
  CHECK(log.Take() == std::vector<std::string>{
                          "[info] EFA rdmap16s27 is healthy again by its counters: no problem for "
                          "5m (was: " +
                          reason + ")"});
}

TEST_CASE("A keep_alive_rcvd never seen advancing is not judged", "[counters][health]") {
  Node node(Health(60s, 10, 5min));
  for (int i = 0; i < 10; ++i) {
    node.monitor->Sample();
    node.clock.Advance(1h);
  }
  CHECK(node.monitor->HealthProblems().empty());
  CHECK(node.health_changes == 0);
}

TEST_CASE("Admin commands failing make an EFA Unhealthy", "[counters][health]") {
  Node node(Health(1h, 10, 1min));
  LogCapture log;
  node.monitor->Sample();
  node.sim.SetCounter(kEfa0, "cmds_err", 9);
  node.clock.Advance(10s);
  node.monitor->Sample();
  CHECK(node.monitor->HealthProblems().empty());
  node.sim.SetCounter(kEfa0, "cmds_err", 19);
  node.sim.SetCounter(kEfa1, "no_completion_cmds", 1);
  // The admin queue of kEfa2 is closed: reading its port counters fails
  // (EIO stands in for the driver's ENODEV).
  const fs::path tx = node.sim.sys() / "class/infiniband" / kEfa2 / "ports/1/hw_counters/tx_bytes";
  ReadFailsWithEio(tx);
  node.clock.Advance(10s);
  auto s = node.monitor->Sample();
  CHECK(node.monitor->HealthProblems() ==
        std::map<std::string, std::string>{
            {kEfa0, "admin commands failing: cmds_err rose by 10 since the last read (limit 10)"},
            {kEfa1,
             "admin commands failing: no_completion_cmds rose by 1 (the device left admin "
             "commands unanswered)"},
            {kEfa2, "admin commands failing: the device cannot report its counters (" +
                        tx.string() + ": Input/output error)"}});
  CHECK(node.Efa(*s, kEfa0).unhealthy_kind == "admin_errors");
  CHECK(node.health_changes == 1);
  CHECK(log.Take().size() == 3);  // a warning for each

  // No more errors for the hold-down: kEfa0 and kEfa1 are Healthy again;
  // kEfa2 still cannot report.
  node.clock.Advance(10s);
  node.monitor->Sample();
  node.clock.Advance(1min);
  node.monitor->Sample();
  const auto problems = node.monitor->HealthProblems();
  CHECK(problems.size() == 1);
  CHECK(problems.count(kEfa2) == 1);
  CHECK(node.health_changes == 2);
  CHECK(log.Take() ==
        std::vector<std::string>{
            "[info] EFA rdmap16s27 is healthy again by its counters: no problem for 1m (was: admin "
            "commands failing: cmds_err rose by 10 since the last read (limit 10))",
            "[info] EFA rdmap32s27 is healthy again by its counters: no problem for 1m (was: admin "
            "commands failing: no_completion_cmds rose by 1 (the device left admin commands "
            "unanswered))"});
}

TEST_CASE("Without device health nothing is judged unhealthy", "[counters][health]") {
  EfaCounterMonitorOptions options;
  options.interval = 10s;
  Node node(options);
  node.monitor->Sample();
  node.sim.SetCounter(kEfa0, "no_completion_cmds", 5);
  node.clock.Advance(1h);
  auto s = node.monitor->Sample();
  CHECK(node.monitor->HealthProblems().empty());
  CHECK(node.Efa(*s, kEfa0).unhealthy.empty());
  CHECK(node.health_changes == 0);
}

TEST_CASE("Counter files the daemon cannot read hold no EFA Unhealthy; the device's errors do",
          "[counters][health]") {
  Node node(Health(1h, 10, 1min));
  LogCapture log;
  node.monitor->Sample();
  const fs::path ports = node.sim.sys() / "class/infiniband" / kEfa0 / "ports/1/hw_counters";

  SECTION("a port counter that cannot be parsed") {
    std::ofstream(ports / "tx_bytes") << "garbage\n";
    for (int i = 0; i < 3; ++i) {
      node.clock.Advance(10s);
      auto s = node.monitor->Sample();
      CHECK(node.Efa(*s, kEfa0).counters.unreadable.size() == 1);
      CHECK(s->unreadable_total == i + 1);
    }
    CHECK(node.monitor->HealthProblems().empty());
    CHECK(node.health_changes == 0);
    // Said once while it lasts, and when it ends.
    CHECK(log.Take() ==
          std::vector<std::string>{
              "[warning] EFA counters: 1 counter file(s) not read for a reason that says "
              "nothing about the devices, first " +
              (ports / "tx_bytes").string() +
              ": expected a counter like \"1234\", got \"garbage\"; their EFAs keep their "
              "device health until a read succeeds"});
    node.sim.SetCounter(kEfa0, "tx_bytes", 1);
    node.clock.Advance(10s);
    node.monitor->Sample();
    CHECK(log.Take() == std::vector<std::string>{
                            "[info] EFA counters: every counter file can be read again (was: "
                            "expected a counter like \"1234\", got \"garbage\")"});
  }
  SECTION("out of descriptors") {
    if (efa::testing::kSanitized) {
      WARN("not run under a sanitizer: its runtime needs descriptors while none are left");
      return;
    }
    std::shared_ptr<const EfaCounterSnapshot> s;
    node.clock.Advance(10s);
    {
      efa::testing::DescriptorTableFull full;
      s = node.monitor->Sample();
    }
    const std::string first =
        (node.sim.sys() / "class/infiniband" / kEfa2 / "ports/1/hw_counters/tx_bytes").string() +
        ": Too many open files";
    CHECK(node.Efa(*s, kEfa2).counters.unreadable.front() == first);
    CHECK(node.Efa(*s, kEfa2).counters.errors.empty());
    CHECK(s->unreadable_total == 4 * static_cast<int64_t>(efa::topology::EfaCounters().size()));
    CHECK(node.monitor->HealthProblems().empty());
    CHECK(node.health_changes == 0);
  }
  SECTION("a read the device fails, and no recovery while the files cannot be read") {
    ReadFailsWithEio(ports / "tx_bytes");
    node.clock.Advance(10s);
    node.monitor->Sample();
    REQUIRE(node.monitor->HealthProblems().count(kEfa0) == 1);
    // The device answers again, but another counter cannot be parsed: the
    // hold-down passes without a read that could end the problem.
    node.sim.SetCounter(kEfa0, "tx_bytes", 1);
    std::ofstream(ports / "rx_bytes") << "garbage\n";
    for (int i = 0; i < 10; ++i) {
      node.clock.Advance(10s);
      node.monitor->Sample();
    }
    CHECK(node.monitor->HealthProblems().count(kEfa0) == 1);
    // Readable again: Healthy a whole hold-down later.
    node.sim.SetCounter(kEfa0, "rx_bytes", 1);
    node.clock.Advance(10s);
    node.monitor->Sample();
    CHECK(node.monitor->HealthProblems().count(kEfa0) == 1);
    node.clock.Advance(1min);
    node.monitor->Sample();
    CHECK(node.monitor->HealthProblems().empty());
  }
}

TEST_CASE("DRANET names an EFA by its PCI address", "[counters][dra]") {
  const auto pci = efa::topology::PciAddress::Parse("0000:9a:1b.0");
  REQUIRE(pci);
  CHECK(DraDeviceName(*pci) == "pci-0000-9a-1b-0");
}

TEST_CASE("EFAs held through ResourceClaims are found by their DRA device names",
          "[counters][dra]") {
  EfaCounterMonitorOptions options;
  options.interval = 1s;
  Node node(options);
  LogCapture log;
  const DraDevice efa1{"efas", "ml", "dra.net", "node-a", "pci-0000-20-1b-0"};
  const DraDevice efa2{"efas", "ml", "dra.net", "node-a", "pci-0000-90-1b-0"};
  // During a move: one container by the device plugin, one through a claim
  // (with a GPU of another driver, and an EFA name of no EFA here), one of
  // DRANET's claims, which the kubelet lists without devices.
  node.holders = {
      {"default", "old-0", "main", {kEfa0}},
      {"ml",
       "new-0",
       "main",
       {},
       {efa2,
        {"gpus", "ml", "gpu.nvidia.com", "node-a", "gpu-0"},
        efa1,
        {"efas", "ml", "dra.net", "node-a", "pci-0000-ff-1b-0"}}},
      {"ml", "dranet-0", "main", {}, {{"efa-dranet", "ml", "", "", ""}}},
  };
  auto s = node.monitor->Sample();
  REQUIRE(s->containers.size() == 2);
  CHECK(s->containers[0].holder.Name() == "default/old-0/main");
  CHECK(s->containers[0].holder.efas == std::vector<std::string>{kEfa0});
  CHECK(s->containers[0].holder.dra.empty());
  const EfaHolder& held = s->containers[1].holder;
  CHECK(held.Name() == "ml/new-0/main");
  CHECK(held.efas == std::vector<std::string>{kEfa1, kEfa2});  // in PCI order
  CHECK(held.dra == std::map<std::string, DraDevice>{{kEfa1, efa1}, {kEfa2, efa2}});
  CHECK(log.Take() ==
        std::vector<std::string>{
            "[info] pod ml/dranet-0 container main uses ResourceClaim ml/efa-dranet, which the "
            "kubelet lists without devices (its driver named none when it prepared the claim): "
            "its traffic cannot be told apart from the node's (claimLookup finds its devices)"});
  // Said once while the claim is listed.
  node.clock.Advance(1s);
  CHECK(node.monitor->Sample()->containers.size() == 2);
  CHECK(log.Take().empty());
  // Idle detection covers EFAs held through claims as any other.
  node.clock.Advance(10min);
  s = node.monitor->Sample();
  CHECK(s->containers[1].idle == std::vector<std::string>{kEfa1, kEfa2});
}

// A ResourceClaim as the API server answers GET .../resourceclaims/NAME
// (resource.k8s.io/v1; DRANET's claim for two EFAs).
constexpr char kClaimJson[] = R"({
  "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
  "metadata": {"name": "efa-dranet", "namespace": "ml", "uid": "3c0d7a5e"},
  "spec": {"devices": {"requests": [{"name": "efa",
    "exactly": {"deviceClassName": "efa.networking.k8s.aws", "count": 2}}]}},
  "status": {
    "allocation": {"devices": {"results": [
      {"request": "efa", "driver": "dra.net", "pool": "node-a", "device": "pci-0000-20-1b-0"},
      {"request": "efa", "driver": "dra.net", "pool": "node-a", "device": "pci-0000-90-1b-0"}]},
      "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}},
    "reservedFor": [{"resource": "pods", "name": "dranet-0", "uid": "9f1e"}]}})";

TEST_CASE("A ResourceClaim's devices are its status.allocation's", "[counters][dra]") {
  auto devices = efa::plugin::ClaimAllocation(kClaimJson);
  REQUIRE(devices.ok());
  CHECK(*devices == std::vector<DraDevice>{{"", "", "dra.net", "node-a", "pci-0000-20-1b-0"},
                                           {"", "", "dra.net", "node-a", "pci-0000-90-1b-0"}});
  CHECK(efa::plugin::ClaimAllocation(R"({"kind": "ResourceClaim", "status": {}})")
            .status()
            .message() ==
        "the ResourceClaim has no status.allocation.devices.results (not allocated?): no "
        "allocation");
  CHECK(efa::plugin::ClaimAllocation(R"({"kind": "Status"})").status().message() ==
        "the answer is not a ResourceClaim object");
  CHECK(efa::plugin::ClaimAllocation("<html>").status().message() ==
        "the answer is not a ResourceClaim object");
  // A "kind" that is no string (nlohmann's value() would throw).
  CHECK(efa::plugin::ClaimAllocation(R"({"kind": 7})").status().message() ==
        "the answer is not a ResourceClaim object");
  CHECK(!efa::plugin::ClaimAllocation(
             R"({"kind": "ResourceClaim", "status": {"allocation": {"devices": {"results": [)"
             R"({"driver": "dra.net"}]}}}})")
             .ok());
}

TEST_CASE("A claim listed without devices gets them from the claim lookup, once while listed",
          "[counters][dra]") {
  EfaCounterMonitorOptions options;
  options.interval = 1s;
  options.claim_lookup_time = 700ms;
  std::vector<std::string> asked;
  absl::Status failure;
  std::chrono::milliseconds timeout{};
  options.claim_devices =
      [&](const std::string& ns, const std::string& name,
          std::chrono::milliseconds t) -> absl::StatusOr<std::vector<DraDevice>> {
    asked.push_back(ns + "/" + name);
    timeout = t;
    if (!failure.ok()) return failure;
    if (name != "efa-dranet") return std::vector<DraDevice>{};
    return efa::plugin::ClaimAllocation(kClaimJson);
  };
  Node node(options);
  LogCapture log;
  const DraDevice efa1{"efa-dranet", "ml", "dra.net", "node-a", "pci-0000-20-1b-0"};
  const DraDevice efa2{"efa-dranet", "ml", "dra.net", "node-a", "pci-0000-90-1b-0"};
  // Two containers of one pod share the claim; the lookup is made once.
  node.holders = {
      {"ml", "dranet-0", "main", {}, {{"efa-dranet", "ml", "", "", ""}}},
      {"ml", "dranet-0", "sidecar", {}, {{"efa-dranet", "ml", "", "", ""}}},
  };
  SECTION("looked up once, its EFAs the containers'") {
    auto s = node.monitor->Sample();
    REQUIRE(s->containers.size() == 2);
    for (const auto& c : s->containers) {
      CHECK(c.holder.efas == std::vector<std::string>{kEfa1, kEfa2});
      CHECK(c.holder.dra == std::map<std::string, DraDevice>{{kEfa1, efa1}, {kEfa2, efa2}});
    }
    CHECK(s->claim_lookups == 1);
    CHECK(s->claim_lookup_errors == 0);
    // Within what the read has left of its time for lookups.
    CHECK(timeout > 0ms);
    CHECK(timeout <= 700ms);
    node.clock.Advance(1s);
    CHECK(node.monitor->Sample()->containers.size() == 2);
    CHECK(asked == std::vector<std::string>{"ml/efa-dranet"});
    CHECK(log.Take().empty());
    // Gone from the list, then listed again (a new pod may hold a claim of
    // the same name): asked again.
    const auto held = node.holders;
    node.holders.clear();
    node.clock.Advance(1s);
    CHECK(node.monitor->Sample()->containers.empty());
    node.holders = held;
    node.clock.Advance(1s);
    CHECK(node.monitor->Sample()->containers.size() == 2);
    CHECK(asked == std::vector<std::string>{"ml/efa-dranet", "ml/efa-dranet"});
    // Made again under its name for another pod with no read between (the
    // old pod ended, its claim was deleted): asked again, once for the pod.
    for (auto& h : node.holders) h.pod = "dranet-1";
    node.clock.Advance(1s);
    CHECK(node.monitor->Sample()->containers.size() == 2);
    CHECK(asked.size() == 3);
  }
  SECTION("a failed lookup is counted, said once, ends the read's lookups and is tried again") {
    failure = absl::PermissionDeniedError(
        "GET https://10.100.0.1:443/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/"
        "efa-dranet: HTTP 403: forbidden");
    node.holders.push_back({"ml", "other-0", "main", {}, {{"other", "ml", "", "", ""}}});
    auto s = node.monitor->Sample();
    CHECK(s->containers.empty());
    CHECK(s->claim_lookups == 1);  // the other claim waits for the next read
    CHECK(s->claim_lookup_errors == 1);
    const std::vector<std::string> said = log.Take();
    CHECK(std::count_if(said.begin(), said.end(), [](const std::string& line) {
            return line.find("[warning] claim lookup: GET https://10.100.0.1:443/apis/") == 0;
          }) == 1);
    for (int i = 0; i < 3; ++i) {
      node.clock.Advance(1s);
      s = node.monitor->Sample();
    }
    CHECK(s->claim_lookup_errors == 4);
    CHECK(log.Take().empty());
    failure = absl::OkStatus();
    node.clock.Advance(1s);
    s = node.monitor->Sample();
    CHECK(s->claim_lookups == 6);  // both claims now
    CHECK(s->claim_lookup_errors == 4);
    REQUIRE(s->containers.size() == 2);
    CHECK(s->containers[0].holder.efas == std::vector<std::string>{kEfa1, kEfa2});
    CHECK(log.Take() ==
          std::vector<std::string>{"[info] claim lookup: ResourceClaim ml/efa-dranet looked up "
                                   "(the lookups failed before: PERMISSION_DENIED)"});
  }
  SECTION("a read that may not look up leaves the claim to the next that may, at once") {
    auto s = node.monitor->Sample(/*look_up_claims=*/false);
    CHECK(s->containers.empty());
    CHECK(asked.empty());
    CHECK(node.monitor->Sample(false) == s);  // within the interval: the same read
    s = node.monitor->Sample();               // still within it, but a claim waits
    CHECK(asked == std::vector<std::string>{"ml/efa-dranet"});
    CHECK(s->containers.size() == 2);
    CHECK(node.monitor->Sample() == s);  // nothing waits now
  }
  SECTION("at most kClaimLookupsPerRead claims a read") {
    node.holders.clear();
    for (int i = 0; i < EfaCounterMonitor::kClaimLookupsPerRead + 3; ++i) {
      const std::string pod = "pod-" + std::to_string(i);
      node.holders.push_back({"ml", pod, "main", {}, {{pod, "ml", "", "", ""}}});
    }
    CHECK(node.monitor->Sample()->claim_lookups == EfaCounterMonitor::kClaimLookupsPerRead);
    node.clock.Advance(1s);
    CHECK(node.monitor->Sample()->claim_lookups == EfaCounterMonitor::kClaimLookupsPerRead + 3);
    node.clock.Advance(1s);
    CHECK(node.monitor->Sample()->claim_lookups == EfaCounterMonitor::kClaimLookupsPerRead + 3);
  }
}

TEST_CASE("A read that may not look up claims never waits for a read that is looking one up",
          "[counters][dra][concurrency]") {
  EfaCounterMonitorOptions options;
  options.interval = 1s;
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  options.claim_devices = [&](const std::string&, const std::string&,
                              std::chrono::milliseconds) -> absl::StatusOr<std::vector<DraDevice>> {
    entered.set_value();
    released.wait();
    return std::vector<DraDevice>{};
  };
  Node node(options);
  node.holders = {{"ml", "dranet-0", "main", {}, {{"efa-dranet", "ml", "", "", ""}}}};
  // A scrape's read, held in its lookup.
  auto scrape = std::async(std::launch::async, [&] { return node.monitor->Sample(); });
  REQUIRE(entered.get_future().wait_for(10s) == std::future_status::ready);
  // The owner loop's read answers at once with the latest read (none yet).
  auto owner = std::async(std::launch::async, [&] { return node.monitor->Sample(false); });
  const bool answered = owner.wait_for(10s) == std::future_status::ready;
  release.set_value();
  REQUIRE(answered);
  CHECK(owner.get() == nullptr);
  const auto read = scrape.get();
  REQUIRE(read != nullptr);
  CHECK(read->claim_lookups == 1);
  // Once it is done, the owner's read answers that read (within the interval).
  CHECK(node.monitor->Sample(false) == read);
}
