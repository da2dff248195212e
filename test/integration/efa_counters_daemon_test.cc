// The daemon binary on a simulated p4d whose EFA counters the test moves,
// against the fake kubelet (device plugin and pod-resources APIs over real
// unix sockets), scraped over real HTTP: per-EFA and per-container traffic,
// idle EFAs and device health from the counters.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "test/fake_kubelet/fake_kubelet.h"
#include "test/plugin/guard_fakes.h"
#include "test/sim/sim_root.h"
#include "test/support/devices.h"
#include "test/support/scrape.h"
#include "test/support/temp_dir.h"
#include "test/support/test_node.h"
#include "test/support/tls_server.h"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using efa::sim::SimRoot;
using efa::testing::DaemonRun;
using efa::testing::FakeKubelet;
using efa::testing::HealthOf;
using efa::testing::Metrics;
using efa::testing::TestNode;
using efa::testing::TestNodeOptions;

namespace {

using efa::testing::kDeadline;
using efa::testing::kEfa;
// The p4d's EFAs in PCI order, with their series' device labels.
const std::vector<std::string> kEfas = {"rdmap16s27", "rdmap32s27", "rdmap144s27", "rdmap160s27"};
const std::map<std::string, std::string> kEfaLabels = {
    {"rdmap16s27", "efa=\"rdmap16s27\",pci_address=\"0000:10:1b.0\",numa_node=\"0\""},
    {"rdmap32s27", "efa=\"rdmap32s27\",pci_address=\"0000:20:1b.0\",numa_node=\"0\""},
    {"rdmap144s27", "efa=\"rdmap144s27\",pci_address=\"0000:90:1b.0\",numa_node=\"1\""},
    {"rdmap160s27", "efa=\"rdmap160s27\",pci_address=\"0000:a0:1b.0\",numa_node=\"1\""}};

std::string Series(const std::string& name, const std::string& labels) {
  return absl::StrCat("efa_device_plugin_", name, "{", labels, "}");
}
std::string ContainerLabels(const std::string& pod, const std::string& efa) {
  return absl::StrCat("namespace=\"default\",pod=\"", pod, "\",container=\"main\",",
                      kEfaLabels.at(efa));
}

// `ids` in PCI order.
std::vector<std::string> PciOrder(std::vector<std::string> ids) {
  auto rank = [](const std::string& id) { return std::find(kEfas.begin(), kEfas.end(), id); };
  std::sort(ids.begin(), ids.end(),
            [&](const std::string& a, const std::string& b) { return rank(a) < rank(b); });
  return ids;
}

// A simulated p4d (or `machine`), the fake kubelet and the daemon binary
// with `flags`, logging at info, serving /metrics on a free loopback port;
// registered.
TestNodeOptions CounterNode(const std::vector<std::string>& flags,
                            const std::function<void(SimRoot&)>& prepare = nullptr,
                            const std::string& machine = "p4d.24xlarge") {
  std::vector<std::string> args{"--probe-address", ""};
  args.insert(args.end(), flags.begin(), flags.end());
  return {.machine = machine,
          .prepare = prepare,
          .run = DaemonRun::kBinary,
          .flags = args,
          .monitor = true,
          .wait_serving = true};
}

// Keep-alives are judged once seen advancing: waits for two reads of
// `efa`'s keep_alive_rcvd that differ.
bool WaitKeepAlivesAdvancing(const TestNode& node, const std::string& efa) {
  const std::string series = Series("efa_keep_alive_rcvd_total", kEfaLabels.at(efa));
  double seen = 0;
  return node.WaitScrape([&](const Metrics& m) {
    seen = m.count(series) ? m.at(series) : 0;
    return seen > 0;
  }) && node.WaitScrape([&](const Metrics& m) { return m.count(series) && m.at(series) > seen; });
}

// The EFAs of an admitted container of one pod.
std::vector<std::string> Admit(TestNode& node, const std::string& pod, int efas) {
  auto admitted =
      node.kubelet().AdmitContainer(pod, "default", "uid-" + pod, "main", {{kEfa, efas}});
  REQUIRE(admitted.ok());
  return PciOrder(admitted->allocations.at(0).device_ids);
}

// Waits until the kubelet's latest list shows each EFA of `want` with its
// health.
bool WaitHealth(TestNode& node, const std::map<std::string, std::string>& want) {
  return node.kubelet().WaitForDevices(
      kEfa,
      [&](const std::vector<v1beta1::Device>& devices) {
        for (const auto& [id, h] : want) {
          if (HealthOf(devices, id) != h) return false;
        }
        return true;
      },
      kDeadline);
}

// The simulated driver of the node's EFAs: raises a counter of each running
// EFA every 20 ms, as a device posting keep-alives or moving bytes does.
class Ticker {
 public:
  Ticker(SimRoot& sim, std::string counter, std::vector<std::string> efas)
      : sim_(sim), counter_(std::move(counter)), efas_(std::move(efas)) {
    thread_ = std::thread([this] {
      for (uint64_t value = 1; !stop_; ++value) {
        for (size_t i = 0; i < efas_.size(); ++i) {
          if (!paused_[i]) sim_.SetCounter(efas_[i], counter_, value);
        }
        std::this_thread::sleep_for(20ms);  // the device's pace, not a wait
      }
    });
  }
  ~Ticker() {
    stop_ = true;
    thread_.join();
  }
  void Pause(size_t i, bool paused) { paused_[i] = paused; }

 private:
  SimRoot& sim_;
  const std::string counter_;
  const std::vector<std::string> efas_;
  std::atomic<bool> paused_[4] = {};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

TEST_CASE(
    "The daemon binary reads the EFA counters only when scraped, serves them per EFA and per "
    "container, and counts a missing counter file",
    "[counters][daemon][process][concurrency]") {
  // rdmap160s27's driver has no port counters (an older kernel).
  TestNode node(CounterNode({"--counter-interval", "1h"}, [](SimRoot& sim) {
    fs::remove_all(sim.sys() / "class/infiniband/rdmap160s27/ports/1/hw_counters");
  }));
  node.sim().SetCounter("rdmap16s27", "tx_bytes", 4096);
  node.sim().SetCounter("rdmap16s27", "rx_bytes", 1024);
  node.sim().SetCounter("rdmap32s27", "rdma_write_bytes", 65536);
  const std::vector<std::string> held = Admit(node, "train-0", 2);

  // The first read is the first scrape's, although the daemon has run.
  const Metrics m = node.Scrape();
  CHECK(m.at("efa_device_plugin_efa_counters_reads_total") == 1);
  CHECK(m.at(Series("efa_tx_bytes_total", kEfaLabels.at("rdmap16s27"))) == 4096);
  CHECK(m.at(Series("efa_rx_bytes_total", kEfaLabels.at("rdmap16s27"))) == 1024);
  CHECK(m.at(Series("efa_rdma_write_bytes_total", kEfaLabels.at("rdmap32s27"))) == 65536);
  CHECK(m.at(Series("efa_keep_alive_rcvd_total", kEfaLabels.at("rdmap144s27"))) == 0);
  // Traffic of the container's EFAs, labelled with the container.
  REQUIRE(held.size() == 2);
  for (const std::string& efa : held) {
    CAPTURE(efa);
    for (const char* name :
         {"efa_tx_bytes_total", "efa_rx_bytes_total", "efa_rdma_write_bytes_total"}) {
      CHECK(m.at(Series(absl::StrCat("container_", name), ContainerLabels("train-0", efa))) ==
            m.at(Series(name, kEfaLabels.at(efa))));
    }
  }
  CHECK(m.at(Series("container_idle_efas",
                    "namespace=\"default\",pod=\"train-0\",container=\"main\"")) == 0);
  // The missing port counters: counted, absent, nothing else affected.
  CHECK(m.at(Series("efa_counters_unavailable", "efa=\"rdmap160s27\",reason=\"missing\"")) == 14);
  CHECK(m.at(Series("efa_counters_unavailable", "efa=\"rdmap160s27\",reason=\"error\"")) == 0);
  CHECK(m.at(Series("efa_counters_unavailable", "efa=\"rdmap16s27\",reason=\"missing\"")) == 0);
  CHECK(m.count(Series("efa_tx_bytes_total", kEfaLabels.at("rdmap160s27"))) == 0);
  CHECK(m.at(Series("efa_keep_alive_rcvd_total", kEfaLabels.at("rdmap160s27"))) == 0);
  CHECK(m.at("efa_device_plugin_devices{health=\"healthy\"}") == 4);

  // Within the interval a scrape is answered from the last read.
  node.sim().SetCounter("rdmap16s27", "tx_bytes", 8192);
  const Metrics again = node.Scrape();
  CHECK(again.at("efa_device_plugin_efa_counters_reads_total") == 1);
  CHECK(again.at(Series("efa_tx_bytes_total", kEfaLabels.at("rdmap16s27"))) == 4096);
}

// The efa driver's network counters (r2.17.0 and later).
const std::vector<std::string> kNetworkCounters = {
    "retrans_bytes", "retrans_pkts", "retrans_timeout_events", "unresponsive_remote_events",
    "impaired_remote_conn_events"};

// The series of `m` whose name is `name` (any labels).
int SeriesOf(const Metrics& m, const std::string& name) {
  const std::string prefix = absl::StrCat("efa_device_plugin_", name, "{");
  int n = 0;
  for (const auto& [series, value] : m) n += series.rfind(prefix, 0) == 0 ? 1 : 0;
  return n;
}

TEST_CASE(
    "The daemon binary serves the efa driver's network counters per EFA and per container that "
    "holds the EFA",
    "[counters][daemon][process]") {
  TestNode node(CounterNode({"--counter-interval", "1h"}));
  const std::vector<std::string> held = Admit(node, "train-0", 2);
  REQUIRE(held.size() == 2);
  // A value of its own for each counter of each EFA: a series of one EFA
  // (or one counter) shown as another's would differ.
  std::map<std::pair<std::string, std::string>, uint64_t> set;
  uint64_t value = 100;
  for (const std::string& efa : kEfas) {
    for (const std::string& name : kNetworkCounters) {
      node.sim().SetCounter(efa, name, value);
      set[{efa, name}] = value++;
    }
  }

  const Metrics m = node.Scrape();
  for (const std::string& name : kNetworkCounters) {
    CAPTURE(name);
    const std::string per_efa = absl::StrCat("efa_", name, "_total");
    const std::string per_container = absl::StrCat("container_efa_", name, "_total");
    CHECK(SeriesOf(m, per_efa) == 4);
    for (const std::string& efa : kEfas) {
      CAPTURE(efa);
      const std::string series = Series(per_efa, kEfaLabels.at(efa));
      REQUIRE(m.count(series) == 1);
      CHECK(m.at(series) == static_cast<double>(set.at({efa, name})));
    }
    // Only the container's two EFAs, under its labels.
    CHECK(SeriesOf(m, per_container) == 2);
    for (const std::string& efa : held) {
      CAPTURE(efa);
      const std::string series = Series(per_container, ContainerLabels("train-0", efa));
      REQUIRE(m.count(series) == 1);
      CHECK(m.at(series) == static_cast<double>(set.at({efa, name})));
    }
  }
  for (const std::string& efa : kEfas) {
    CHECK(m.at(Series("efa_counters_unavailable",
                      absl::StrCat("efa=\"", efa, "\",reason=\"missing\""))) == 0);
  }
}

TEST_CASE(
    "On an efa driver without the network counters the daemon binary serves none of them, per "
    "EFA or per container, and reports no error",
    "[counters][daemon][process]") {
  // The built-in g5.48xlarge runs a driver before r2.17.0.
  TestNode node(CounterNode({"--counter-interval", "1h"}, nullptr, "g5.48xlarge"));
  const std::string efa = "rdmap0s21";
  const std::string efa_labels = "efa=\"rdmap0s21\",pci_address=\"0000:00:15.0\",numa_node=\"-1\"";
  REQUIRE_THROWS(node.sim().SetCounter(efa, "unresponsive_remote_events", 1));
  node.sim().SetCounter(efa, "tx_bytes", 4096);
  REQUIRE(Admit(node, "train-0", 1) == std::vector<std::string>{efa});

  const Metrics m = node.Scrape();
  for (const std::string& name : kNetworkCounters) {
    CAPTURE(name);
    CHECK(SeriesOf(m, absl::StrCat("efa_", name, "_total")) == 0);
    CHECK(SeriesOf(m, absl::StrCat("container_efa_", name, "_total")) == 0);
  }
  // The rest as on any node: the EFA's and the container's traffic.
  CHECK(m.at(Series("efa_tx_bytes_total", efa_labels)) == 4096);
  CHECK(m.at(Series("container_efa_tx_bytes_total",
                    absl::StrCat("namespace=\"default\",pod=\"train-0\",container=\"main\",",
                                 efa_labels))) == 4096);
  // Counted as missing files, never as the device's errors.
  CHECK(m.at(Series("efa_counters_unavailable", "efa=\"rdmap0s21\",reason=\"missing\"")) == 5);
  CHECK(m.at(Series("efa_counters_unavailable", "efa=\"rdmap0s21\",reason=\"error\"")) == 0);
  CHECK(m.at(Series("efa_counters_unavailable", "efa=\"rdmap0s21\",reason=\"unreadable\"")) == 0);
  CHECK(m.at("efa_device_plugin_devices{health=\"healthy\"}") == 1);
  // Nothing logged of them: no counter file named, no read problem.
  CHECK(node.LogLines("hw_counters") == 0);
  CHECK(node.LogLines("EFA counters") == 0);
}

TEST_CASE("A running pod's EFAs that move no bytes are reported idle once, until bytes move",
          "[counters][daemon][process][concurrency]") {
  TestNode node(CounterNode({"--counter-interval", "100ms", "--idle-timeout", "1s"}));
  const std::vector<std::string> held = Admit(node, "train-0", 2);
  REQUIRE(held.size() == 2);
  const std::string idle =
      Series("container_idle_efas", "namespace=\"default\",pod=\"train-0\",container=\"main\"");
  REQUIRE(node.WaitScrape([&](const Metrics& m) { return m.count(idle) && m.at(idle) == 2; }));
  const std::string warning = absl::StrCat(
      "allocated EFAs idle: possible TCP fallback: pod default/train-0 container main: EFAs ",
      absl::StrJoin(held, ","), " (2 of its 2) moved no bytes for 1s");
  CHECK(node.LogLines(warning) == 1);

  {
    // Traffic on the first EFA: it is no longer idle, the other still is.
    Ticker traffic(node.sim(), "tx_bytes", {held[0]});
    const std::string tx =
        Series("container_efa_tx_bytes_total", ContainerLabels("train-0", held[0]));
    CHECK(node.WaitScrape([&](const Metrics& m) {
      return m.count(idle) && m.at(idle) == 1 && m.count(tx) && m.at(tx) > 0;
    }));
    CHECK(
        node.WaitLog(absl::StrCat("allocated EFAs moving bytes again: pod default/train-0 "
                                  "container main: EFAs ",
                                  held[0], " (still idle: ", held[1], ")")));
  }
  CHECK(node.LogLines(warning) == 1);

  // The pod goes: so do its series.
  REQUIRE(node.kubelet().RemovePod("uid-train-0").ok());
  CHECK(node.WaitScrape([&](const Metrics& m) { return m.count(idle) == 0; }));
}

TEST_CASE(
    "With device health on, an EFA whose keep-alives stop or whose admin commands fail is "
    "Unhealthy until it has recovered for the hold-down",
    "[counters][health][daemon][process][concurrency]") {
  TestNode node(CounterNode({"--device-health", "--device-health-keep-alive-timeout", "2s",
                             "--device-health-hold-down", "1s", "--counter-interval", "100ms"}));
  Ticker keep_alive(node.sim(), "keep_alive_rcvd", kEfas);
  const std::map<std::string, std::string> all_healthy = {{"rdmap16s27", "Healthy"},
                                                          {"rdmap32s27", "Healthy"},
                                                          {"rdmap144s27", "Healthy"},
                                                          {"rdmap160s27", "Healthy"}};
  REQUIRE(WaitHealth(node, all_healthy));
  REQUIRE(WaitKeepAlivesAdvancing(node, "rdmap16s27"));

  // The first EFA's keep-alives stop. No scrape: the daemon reads by itself.
  keep_alive.Pause(0, true);
  auto want = all_healthy;
  want["rdmap16s27"] = "Unhealthy";
  CHECK(WaitHealth(node, want));
  CHECK(node.WaitLog(
      "EFA rdmap16s27 is unhealthy by its counters: keep_alive_rcvd has not advanced for 2s"));
  const Metrics m = node.Scrape();
  CHECK(m.at(Series("efa_unhealthy_by_counters", "efa=\"rdmap16s27\",reason=\"keep_alive\"")) == 1);
  CHECK(m.at("efa_device_plugin_devices{health=\"unhealthy\"}") == 1);
  keep_alive.Pause(0, false);
  CHECK(WaitHealth(node, all_healthy));
  CHECK(node.WaitLog("EFA rdmap16s27 is healthy again by its counters: no problem for 1s"));

  // Ten admin commands of the second EFA fail at once.
  node.sim().SetCounter("rdmap32s27", "cmds_err", 10);
  want = all_healthy;
  want["rdmap32s27"] = "Unhealthy";
  CHECK(WaitHealth(node, want));
  CHECK(WaitHealth(node, all_healthy));
  CHECK(node.LogLines("EFA rdmap32s27 is unhealthy by its counters: admin commands failing: "
                      "cmds_err rose by 10 since the last read (limit 10)") == 1);
  CHECK(node.LogLines("EFA rdmap32s27 is healthy again by its counters") == 1);
  // Each change said once; the other EFAs were never judged unhealthy.
  CHECK(node.LogLines("EFA rdmap16s27 is unhealthy by its counters") == 1);
  CHECK(node.LogLines("EFA rdmap144s27 is unhealthy") == 0);
  CHECK(node.LogLines("EFA rdmap160s27 is unhealthy") == 0);
}

TEST_CASE(
    "On a node moving to DRA the daemon binary yields and still serves every EFA's counters, per "
    "pod for EFAs held by the device plugin and through ResourceClaims",
    "[counters][daemon][process][dra]") {
  TestNode node(CounterNode({"--counter-interval", "1h"}));
  fs::create_directories(node.kubelet_dir() / "plugins_registry");
  efa::testing::FakeDraDriver dranet(node.kubelet_dir() / "plugins_registry");
  // Before the move: a pod of the device plugin. Then dra.net registers:
  // the daemon withdraws the resource (no device left for the kubelet to
  // give) but the running pod keeps its EFAs.
  const std::vector<std::string> old_efas = Admit(node, "old-0", 2);
  dranet.Start();
  REQUIRE(node.kubelet().WaitForDevices(
      kEfa, [](const std::vector<v1beta1::Device>& d) { return d.empty(); }, kDeadline));
  // DRA gives the other two EFAs to a pod's claim, named as DRANET names
  // them; a pod of DRANET itself holds a claim the kubelet lists without
  // devices (DRANET's NodePrepareResources names none).
  std::vector<std::string> free_efas;
  for (const std::string& efa : kEfas) {
    if (std::find(old_efas.begin(), old_efas.end(), efa) == old_efas.end()) {
      free_efas.push_back(efa);
    }
  }
  const std::map<std::string, std::string> dra_names = {{"rdmap16s27", "pci-0000-10-1b-0"},
                                                        {"rdmap32s27", "pci-0000-20-1b-0"},
                                                        {"rdmap144s27", "pci-0000-90-1b-0"},
                                                        {"rdmap160s27", "pci-0000-a0-1b-0"}};
  FakeKubelet::PreparedClaim claim{"efas", "ml", {{"dra.net", {}}}};
  for (const std::string& efa : free_efas) {
    claim.drivers["dra.net"].push_back({"node-a", dra_names.at(efa), {}});
  }
  REQUIRE(node.kubelet().PrepareClaim("new-0", "ml", "uid-new-0", claim, {"main"}).ok());
  const FakeKubelet::PreparedClaim dranet_claim{"efa-dranet", "ml", {{"dra.net", {}}}};
  REQUIRE(
      node.kubelet().PrepareClaim("dranet-0", "ml", "uid-dranet-0", dranet_claim, {"main"}).ok());
  uint64_t value = 1000;
  for (const std::string& efa : kEfas) node.sim().SetCounter(efa, "tx_bytes", value++);

  const Metrics m = node.Scrape();
  CHECK(m.at("efa_device_plugin_withdrawn") == 1);
  CHECK(m.at("efa_device_plugin_devices{health=\"healthy\"}") == 0);
  // Every EFA's own counters, withdrawn or not.
  CHECK(SeriesOf(m, "efa_tx_bytes_total") == 4);
  for (size_t i = 0; i < kEfas.size(); ++i) {
    CHECK(m.at(Series("efa_tx_bytes_total", kEfaLabels.at(kEfas[i]))) == 1000 + i);
  }
  // Per pod: the device plugin's pod as before, the claim's pod with the
  // claim's and the device's names; nothing for the claim without devices.
  CHECK(SeriesOf(m, "container_efa_tx_bytes_total") == 4);
  for (const std::string& efa : old_efas) {
    CHECK(m.count(Series("container_efa_tx_bytes_total", ContainerLabels("old-0", efa))) == 1);
  }
  for (const std::string& efa : free_efas) {
    const std::string labels = absl::StrCat(
        "namespace=\"ml\",pod=\"new-0\",container=\"main\",", kEfaLabels.at(efa),
        ",dra_claim_name=\"efas\",dra_claim_namespace=\"ml\",dra_driver_name=\"dra.net\","
        "dra_pool_name=\"node-a\",dra_device_name=\"",
        dra_names.at(efa), "\"");
    CAPTURE(labels);
    REQUIRE(m.count(Series("container_efa_tx_bytes_total", labels)) == 1);
    const auto at = std::find(kEfas.begin(), kEfas.end(), efa) - kEfas.begin();
    CHECK(m.at(Series("container_efa_tx_bytes_total", labels)) == 1000 + at);
  }
  CHECK(node.LogLines(
            "uses ResourceClaim ml/efa-dranet, which the kubelet lists without devices") == 1);
}

TEST_CASE(
    "With claimLookup the daemon binary finds a DRANET claim's EFAs in the API server, and "
    "waits out a refusal",
    "[counters][daemon][process][dra][concurrency]") {
  efa::testing::TempDir dir;
  efa::testing::TlsServer api(dir.path());
  const auto token = dir.path() / "token";
  std::ofstream(token) << "efa-token";
  const std::string path = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/efa-dranet";
  api.Answer(path, 403,
             R"({"kind":"Status","message":"resourceclaims.resource.k8s.io \"efa-dranet\" is )"
             R"(forbidden"})");
  TestNode node(
      CounterNode({"--counter-interval", "100ms", "--claim-lookup", "--api-server", api.address(),
                   "--api-token-file", token.string(), "--api-ca-file", api.ca_file().string()}));
  // DRANET's claim: the kubelet lists it without devices.
  const FakeKubelet::PreparedClaim claim{"efa-dranet", "ml", {{"dra.net", {}}}};
  REQUIRE(node.kubelet().PrepareClaim("dranet-0", "ml", "uid-dranet-0", claim, {"main"}).ok());
  const std::string lookups = "efa_device_plugin_claim_lookups_total";
  const std::string errors = "efa_device_plugin_claim_lookup_errors_total";
  REQUIRE(node.WaitScrape([&](const Metrics& m) { return m.count(errors) && m.at(errors) >= 2; }));
  CHECK(SeriesOf(node.Scrape(), "container_efa_tx_bytes_total") == 0);
  CHECK(node.LogLines("claim lookup: GET https://" + api.address() + path +
                      ": HTTP 403: resourceclaims.resource.k8s.io \"efa-dranet\" is forbidden") ==
        1);
  CHECK(api.Authorizations().front() == "Bearer efa-token");

  // Allowed now: the claim's two EFAs, named as DRANET names them.
  api.Answer(path, 200, R"({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
    "metadata": {"name": "efa-dranet", "namespace": "ml"},
    "status": {"allocation": {"devices": {"results": [
      {"request": "efa", "driver": "dra.net", "pool": "node-a", "device": "pci-0000-10-1b-0"},
      {"request": "efa", "driver": "dra.net", "pool": "node-a", "device": "pci-0000-20-1b-0"}]}}}})");
  node.sim().SetCounter("rdmap16s27", "tx_bytes", 7);
  node.sim().SetCounter("rdmap32s27", "tx_bytes", 9);
  const std::map<std::string, std::pair<std::string, double>> held = {
      {"rdmap16s27", {"pci-0000-10-1b-0", 7}}, {"rdmap32s27", {"pci-0000-20-1b-0", 9}}};
  auto labels = [&](const std::string& efa) {
    return absl::StrCat("namespace=\"ml\",pod=\"dranet-0\",container=\"main\",", kEfaLabels.at(efa),
                        ",dra_claim_name=\"efa-dranet\",dra_claim_namespace=\"ml\","
                        "dra_driver_name=\"dra.net\",dra_pool_name=\"node-a\",dra_device_name=\"",
                        held.at(efa).first, "\"");
  };
  REQUIRE(node.WaitScrape(
      [&](const Metrics& m) { return SeriesOf(m, "container_efa_tx_bytes_total") == 2; }));
  const Metrics m = node.Scrape();
  for (const auto& [efa, named] : held) {
    CAPTURE(labels(efa));
    REQUIRE(m.count(Series("container_efa_tx_bytes_total", labels(efa))) == 1);
    CHECK(m.at(Series("container_efa_tx_bytes_total", labels(efa))) == named.second);
  }
  // Looked up once more after the refusals, then known while listed.
  const double asked = m.at(lookups);
  CHECK(asked == m.at(errors) + 1);
  CHECK(node.WaitScrape([&](const Metrics& later) {
    return later.at("efa_device_plugin_efa_counters_reads_total") >=
           m.at("efa_device_plugin_efa_counters_reads_total") + 3;
  }));
  CHECK(node.Scrape().at(lookups) == asked);
  CHECK(node.LogLines("claim lookup: ResourceClaim ml/efa-dranet looked up") == 1);
}

TEST_CASE(
    "With claimLookup and an API server that never answers every scrape is answered whole "
    "within httpRequestTimeout",
    "[counters][daemon][process][dra]") {
  efa::testing::TempDir dir;
  efa::testing::TlsServer ca(dir.path());  // its CA file only
  efa::testing::SilentListener api;        // connects, never answers
  const auto token = dir.path() / "token";
  std::ofstream(token) << "efa-token";
  // A p5: its answer (32 EFAs' counters) is many times the 16 KiB the
  // HTTP server writes at once, so a late answer would be cut.
  TestNode node(
      CounterNode({"--counter-interval", "100ms", "--http-request-timeout", "1500ms",
                   "--claim-lookup", "--api-server", "127.0.0.1:" + std::to_string(api.port),
                   "--api-token-file", token.string(), "--api-ca-file", ca.ca_file().string()},
                  nullptr, "p5.48xlarge"));
  const FakeKubelet::PreparedClaim claim{"efa-dranet", "ml", {{"dra.net", {}}}};
  REQUIRE(node.kubelet().PrepareClaim("dranet-0", "ml", "uid-dranet-0", claim, {"main"}).ok());
  const std::string errors = "efa_device_plugin_claim_lookup_errors_total";
  double failed = 0;
  // Each scrape comes over 100 ms after the last: its read looks the
  // claim up, which waits out the lookups' share of the request timeout.
  for (int i = 0; i < 4; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const efa::testing::HttpReply reply = efa::testing::HttpGet(node.metrics_port(), "/metrics");
    const auto took = std::chrono::steady_clock::now() - start;
    REQUIRE(reply.status == 200);
    CHECK(reply.body.size() > 16 * 1024);
    CHECK(took < std::chrono::milliseconds(1500));
    const Metrics m = efa::testing::ParseMetrics(reply.body);
    REQUIRE(m.count(errors) == 1);
    CHECK(m.at(errors) >= failed);
    failed = m.at(errors);
  }
  CHECK(failed >= 3);
  CHECK(node.LogLines("claim lookup: GET https://127.0.0.1:" + std::to_string(api.port)) == 1);
}

TEST_CASE(
    "The kubelet's pod status shows a removed EFA and one its counters hold Unhealthy in the "
    "container holding it, by device IDs that survive the daemon's restart, the removed one too",
    "[counters][health][daemon][process][status]") {
  const std::vector<std::string> flags = {"--device-health",
                                          "--device-health-keep-alive-timeout",
                                          "2s",
                                          "--device-health-hold-down",
                                          "1h",
                                          "--counter-interval",
                                          "100ms"};
  TestNode node(CounterNode(flags));
  Ticker keep_alive(node.sim(), "keep_alive_rcvd", kEfas);
  REQUIRE(WaitKeepAlivesAdvancing(node, kEfas[1]));
  const std::vector<std::string> train = Admit(node, "train-0", 2);
  const std::vector<std::string> infer = Admit(node, "infer-0", 2);
  REQUIRE(train == std::vector<std::string>{kEfas[0], kEfas[1]});
  REQUIRE(infer == std::vector<std::string>{kEfas[2], kEfas[3]});
  using Status = std::vector<FakeKubelet::ResourceStatus>;
  auto status = [&](const std::string& pod) {
    return node.kubelet().AllocatedResourcesStatus("uid-" + pod, "main");
  };
  CHECK(status("train-0") == Status{{kEfa, {{kEfas[0], "Healthy"}, {kEfas[1], "Healthy"}}}});
  CHECK(status("infer-0") == Status{{kEfa, {{kEfas[2], "Healthy"}, {kEfas[3], "Healthy"}}}});

  // infer-0's second EFA stops sending keep-alives; train-0's first is
  // removed (its verbs device gone).
  keep_alive.Pause(3, true);
  REQUIRE(WaitHealth(node, {{kEfas[3], "Unhealthy"}}));
  keep_alive.Pause(0, true);  // no driver to count them once it is gone
  fs::remove(node.sim().sys() / "class/infiniband" / kEfas[0]);
  REQUIRE(WaitHealth(node, {{kEfas[0], "Unhealthy"}}));
  const Status train_status{{kEfa, {{kEfas[0], "Unhealthy"}, {kEfas[1], "Healthy"}}}};
  const Status infer_status{{kEfa, {{kEfas[2], "Healthy"}, {kEfas[3], "Unhealthy"}}}};
  CHECK(status("train-0") == train_status);
  CHECK(status("infer-0") == infer_status);

  // The daemon restarts. Its device IDs are the EFAs' names (not an order
  // or a counter): the EFAs it finds keep theirs, and the removed EFA, which
  // it cannot find, it lists Unhealthy under its name since the kubelet's
  // checkpoint says train-0 holds it (an ID missing from the list would read
  // Healthy). The stalled keep-alives a new process cannot know: judged only
  // once seen advancing (docs/observability.md).
  std::vector<std::string> ids_before;
  for (const auto& d : node.kubelet().devices(kEfa)) ids_before.push_back(d.id());
  REQUIRE(ids_before == kEfas);
  const int messages = node.kubelet().list_and_watch_messages(kEfa);
  REQUIRE(node.KillBinary());
  node.StartBinary({"--metrics-address", "127.0.0.1:0", "--probe-address", "", flags[0], flags[1],
                    flags[2], flags[3], flags[4], flags[5], flags[6]});
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 2, kDeadline));
  // The new process's first list.
  REQUIRE(node.kubelet().WaitForListAndWatchMessages(kEfa, messages + 1, kDeadline));
  std::vector<std::string> ids_after;
  for (const auto& d : node.kubelet().devices(kEfa)) ids_after.push_back(d.id());
  CHECK(ids_after == ids_before);
  CHECK(status("train-0") == train_status);
  CHECK(status("infer-0") == Status{{kEfa, {{kEfas[2], "Healthy"}, {kEfas[3], "Healthy"}}}});
  CHECK(node.LogLines(absl::StrCat("EFA ", kEfas[0],
                                   " is listed Unhealthy: not found since the daemon started, but "
                                   "pod uid-train-0 container \"main\" holds it (kubelet "
                                   "checkpoint)")) == 1);
  // Once no container holds it, it is listed no more.
  REQUIRE(node.kubelet().RemovePod("uid-train-0").ok());
  CHECK(node.kubelet().WaitForDevices(
      kEfa,
      [](const std::vector<v1beta1::Device>& devices) {
        return devices.size() == 3 && HealthOf(devices, kEfas[0]) == "absent";
      },
      kDeadline));
}
