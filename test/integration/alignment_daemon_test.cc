// Alignment end to end: the daemon, the fake kubelet admitting pods one
// resource at a time in a chosen or random order, and a fake GPU or Neuron
// plugin, all over real unix sockets. Prints the alignment rates.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "plugin/alignment/alignment.h"
#include "plugin/daemon.h"
#include "test/fake_kubelet/fake_accelerator_plugin.h"
#include "test/fake_kubelet/fake_kubelet.h"
#include "test/sim/sim_root.h"
#include "test/support/devices.h"
#include "test/support/test_node.h"
#include "topology/efa_discovery.h"
#include "topology/hwloc_loader.h"
#include "topology/replica_id.h"

using namespace std::chrono_literals;
using efa::plugin::Daemon;
using efa::plugin::DaemonOptions;
using efa::sim::SimRoot;
using efa::testing::AcceleratorKind;
using efa::testing::FakeAcceleratorPlugin;
using efa::testing::FakeKubelet;
using efa::testing::TestNode;
using efa::testing::TestNodeOptions;

namespace {

using efa::testing::kDeadline;
using efa::testing::kEfa;

using Order = efa::testing::AdmitOrder;

// A node with the machine's GPUs or Neuron devices behind a fake plugin, the
// daemon (`replicas` device IDs per EFA) registered beside it.
TestNodeOptions AlignedNode(const std::string& machine, AcceleratorKind kind, int replicas = 1,
                            bool fake_clock = false) {
  return {.machine = machine,
          .fake_clock = fake_clock,
          .accelerators = kind,
          .replicas = replicas,
          .wait_serving = true};
}

// Whether the container's EFAs (replica IDs counted as their EFA) are
// aligned with its accelerators.
bool Aligned(TestNode& node, const std::string& uid) {
  std::vector<std::string> efas;
  for (const auto& id : node.kubelet().container_devices(uid, "main", kEfa)) {
    auto replica = efa::topology::ParseReplicaId(id);
    efas.push_back(replica ? replica->ibdev : id);
  }
  return node.Aligned(uid, efas);
}

// Admits pods of `accels` accelerators + `efas` EFAs until the node is
// full, `rounds` times over (removing them between rounds); returns how
// many were aligned out of how many.
std::pair<int, int> Run(TestNode& node, int accels, int efas, Order order, int rounds,
                        unsigned seed) {
  return node.AdmitRounds({accels, efas, order, rounds, seed},
                          [&](const std::string& uid, const auto&) { return Aligned(node, uid); });
}

void Report(const char* what, std::pair<int, int> result) {
  std::printf("alignment %-40s %3d/%3d = %5.1f%%\n", what, result.first, result.second,
              result.second ? 100.0 * result.first / result.second : 0.0);
}

}  // namespace

TEST_CASE("Best effort aligns every container whose GPUs come first (p5)",
          "[alignment][daemon][concurrency]") {
  TestNode node(AlignedNode("p5.48xlarge", AcceleratorKind::kNvidiaGpu));
  auto one = Run(node, 1, 4, Order::kAcceleratorFirst, 3, 1);
  Report("p5 1 GPU + 4 EFA, GPU first", one);
  CHECK(one.second == 24);
  CHECK(one.first == one.second);
  auto two = Run(node, 2, 8, Order::kAcceleratorFirst, 3, 1);
  Report("p5 2 GPU + 8 EFA, GPU first", two);
  CHECK(two.second == 12);
  CHECK(two.first == two.second);
  // The daemon's own after-the-fact report agrees.
  REQUIRE(node.daemon().alignment_stats()->WaitForJudgedForTest(36, kDeadline));
  auto counts = node.daemon().alignment_stats()->Get();
  CHECK(counts.aligned == 36);
  CHECK(counts.unaligned == 0);
  CHECK(counts.targeted == 36);
}

TEST_CASE("Best effort aligns at least 95% over random orders (p5)",
          "[alignment][daemon][concurrency]") {
  TestNode node(AlignedNode("p5.48xlarge", AcceleratorKind::kNvidiaGpu));
  auto efa_first = Run(node, 1, 4, Order::kEfaFirst, 3, 7);
  Report("p5 1 GPU + 4 EFA, EFA first", efa_first);
  CHECK(efa_first.first * 100 >= efa_first.second * 95);
  auto random = Run(node, 1, 4, Order::kRandom, 5, 42);
  Report("p5 1 GPU + 4 EFA, random order", random);
  CHECK(random.second == 40);
  CHECK(random.first * 100 >= random.second * 95);
  auto random2 = Run(node, 2, 8, Order::kRandom, 5, 43);
  Report("p5 2 GPU + 8 EFA, random order", random2);
  CHECK(random2.first * 100 >= random2.second * 95);
}

TEST_CASE("Best effort aligns Neuron devices through the AWS table (trn2)",
          "[alignment][daemon][concurrency]") {
  TestNode node(AlignedNode("trn2.48xlarge", AcceleratorKind::kNeuron));
  auto first = Run(node, 1, 1, Order::kAcceleratorFirst, 2, 1);
  Report("trn2 1 Neuron + 1 EFA, Neuron first", first);
  CHECK(first.second == 32);
  CHECK(first.first == first.second);
  auto random = Run(node, 1, 1, Order::kRandom, 2, 5);
  Report("trn2 1 Neuron + 1 EFA, random order", random);
}

TEST_CASE("On p6e-gb200 each GPU gets the EFAs that carry its traffic and then its NUMA node's",
          "[alignment][daemon][concurrency]") {
  // GPU g's traffic goes through network cards 4g+1 and 4g+3 (EC2 user
  // guide, EFA for P6e-GB200): the EFAs behind its switch in the simulated
  // machine. The even cards' EFAs share no PCI level with any GPU: only
  // their NUMA node relates them to one.
  const std::map<std::string, std::set<std::string>> cards = {
      {"0000:15:00.0", {"rdmap19s0", "rdmap20s0"}},
      {"0000:55:00.0", {"rdmap83s0", "rdmap84s0"}},
      {"0000:95:00.0", {"rdmap147s0", "rdmap148s0"}},
      {"0000:d5:00.0", {"rdmap211s0", "rdmap212s0"}}};
  const std::map<std::string, std::set<std::string>> numa_only = {
      {"0000:15:00.0", {"rdmap48s1", "rdmap48s2", "rdmap112s1", "rdmap112s2"}},
      {"0000:55:00.0", {"rdmap48s1", "rdmap48s2", "rdmap112s1", "rdmap112s2"}},
      {"0000:95:00.0", {"rdmap176s1", "rdmap176s2", "rdmap240s1", "rdmap240s2"}},
      {"0000:d5:00.0", {"rdmap176s1", "rdmap176s2", "rdmap240s1", "rdmap240s2"}}};
  TestNode node(AlignedNode("p6e-gb200.36xlarge", AcceleratorKind::kNvidiaGpu));
  const auto gpus = efa::topology::ReadNvidiaGpus(node.sim().path() / "proc", nullptr);
  auto gpu_of = [&](const std::string& uid) {
    const auto ids = node.kubelet().container_devices(uid, "main", "nvidia.com/gpu");
    REQUIRE(ids.size() == 1);
    for (const auto& gpu : gpus) {
      if (gpu.uuid == ids[0]) return gpu.pci.ToString();
    }
    FAIL("no GPU " << ids[0]);
    return std::string();
  };
  const int efas = GENERATE(2, 4);
  std::set<std::string> seen_gpus, seen_efas;
  for (int pod = 1; pod <= 4; ++pod) {
    const std::string uid = absl::StrCat("u", pod);
    REQUIRE(node.kubelet()
                .AdmitContainer(absl::StrCat("train-", pod), "default", uid, "main",
                                {{"nvidia.com/gpu", 1}, {kEfa, efas}})
                .ok());
    const std::string gpu = gpu_of(uid);
    INFO("GPU " << gpu << ", " << efas << " EFAs");
    seen_gpus.insert(gpu);
    const auto got = node.kubelet().container_devices(uid, "main", kEfa);
    REQUIRE(got.size() == static_cast<size_t>(efas));
    std::set<std::string> got_set(got.begin(), got.end());
    seen_efas.insert(got.begin(), got.end());
    // Its own two cards always; beyond them, EFAs of its NUMA node that no
    // other GPU sits beside.
    for (const std::string& card : cards.at(gpu)) CHECK(got_set.count(card) == 1);
    for (const std::string& efa : got) {
      CHECK((cards.at(gpu).count(efa) == 1 || numa_only.at(gpu).count(efa) == 1));
    }
    CHECK(Aligned(node, uid));
  }
  CHECK(seen_gpus.size() == 4);
  CHECK(seen_efas.size() == static_cast<size_t>(4 * efas));
}

TEST_CASE("A running GPU-only pod never attracts another pod's EFAs",
          "[alignment][daemon][concurrency]") {
  TestNode node(AlignedNode("p5.48xlarge", AcceleratorKind::kNvidiaGpu));
  // GPU 53 (the lowest) goes to a running GPU-only pod.
  REQUIRE(node.kubelet()
              .AdmitContainer("gpu-only", "default", "u1", "main", {{"nvidia.com/gpu", 1}})
              .ok());
  // A GPU + EFA pod whose EFAs come first must not be aligned with GPU 53:
  // its GPU will be 64, and so its EFAs 60-63.
  REQUIRE(node.kubelet()
              .AdmitContainer("train", "default", "u2", "main", {{kEfa, 4}, {"nvidia.com/gpu", 1}})
              .ok());
  CHECK(node.kubelet().container_devices("u2", "main", kEfa) ==
        std::vector<std::string>{"rdmap96s0", "rdmap97s0", "rdmap98s0", "rdmap99s0"});
  CHECK(Aligned(node, "u2"));
  auto counts = node.daemon().alignment_stats()->Get();
  CHECK(counts.targeted == 0);
  CHECK(counts.predicted == 1);
}

TEST_CASE("With pod-resources down or rate-limited, allocations succeed and are reported",
          "[alignment][daemon][concurrency]") {
  TestNode node(AlignedNode("p5.48xlarge", AcceleratorKind::kNvidiaGpu));
  SECTION("down") { node.kubelet().StopPodResources(); }
  SECTION("rate-limited") { node.kubelet().SetPodResourcesExhausted(true); }
  SECTION("slow") { node.kubelet().SetPodResourcesDelay(2s); }
  auto admitted = node.kubelet().AdmitContainer("p", "default", "u1", "main",
                                                {{"nvidia.com/gpu", 1}, {kEfa, 4}});
  REQUIRE(admitted.ok());
  CHECK(node.kubelet().container_devices("u1", "main", kEfa).size() == 4);
  CHECK(node.daemon().alignment_stats()->Get().degraded == 1);
}

TEST_CASE("A failing alignment report is retried less and less often",
          "[alignment][daemon][concurrency]") {
  TestNode node(AlignedNode("p5.48xlarge", AcceleratorKind::kNvidiaGpu, 1, /*fake_clock=*/true));
  node.kubelet().SetPodResourcesExhausted(true);
  REQUIRE(node.kubelet()
              .AdmitContainer("p", "default", "u1", "main", {{"nvidia.com/gpu", 1}, {kEfa, 4}})
              .ok());
  auto failed = [&] { return node.daemon().alignment_stats()->Get().report_failed; };
  const int before = failed();
  // A minute in half-second steps: retried every 500 ms that would be 120
  // tries; doubling up to 30 s, 7 plus the periodic passes' 6.
  for (int step = 0; step < 120; ++step) {
    REQUIRE(node.Pass(500ms));
  }
  const int tries = failed() - before;
  INFO(tries << " failed judgment passes in a minute");
  CHECK(tries <= 16);
  CHECK(tries >= 5);
}

TEST_CASE("Sharing: with 4 replicas a p5 runs 8 GPU pods and 16 EFA-only pods at once, aligned",
          "[sharing][alignment][daemon][concurrency]") {
  TestNode node(AlignedNode("p5.48xlarge", AcceleratorKind::kNvidiaGpu, /*replicas=*/4));
  FakeKubelet& kubelet = node.kubelet();
  const auto advertised = kubelet.devices(kEfa);
  REQUIRE(advertised.size() == 128);
  CHECK(advertised[0].id() == "rdmap79s0::0");
  CHECK(advertised[3].id() == "rdmap79s0::3");
  CHECK(advertised[4].id() == "rdmap80s0::0");
  std::map<std::string, std::string> uverbs;  // ibdev -> host path
  for (const auto& d : efa::topology::DiscoverEfaDevices(node.sim().roots()).devices) {
    uverbs[d.ibdev] = d.uverbs_path;
  }
  std::mt19937 rng(11);
  std::map<std::string, int> uses;  // physical EFA -> containers
  int gpu_pods = 0, aligned = 0;
  // Two EFA-only pods, then a GPU pod (its resources in random order).
  for (int i = 0; i < 24; ++i) {
    const bool gpu = i % 3 == 2;
    std::vector<std::pair<std::string, int>> requests = {{kEfa, gpu ? 4 : 1}};
    if (gpu) requests.push_back({node.accelerator_resource(), 1});
    if (rng() & 1) std::reverse(requests.begin(), requests.end());
    const std::string uid = absl::StrCat("uid-", i);
    auto admitted =
        kubelet.AdmitContainer(absl::StrCat("pod-", i), "default", uid, "main", requests);
    REQUIRE(admitted.ok());
    for (const auto& a : admitted->allocations) {
      if (a.resource != kEfa) continue;
      // Distinct EFAs, each given once: its device node and its name in the env.
      std::set<std::string> efas, nodes, paths;
      for (const auto& id : a.device_ids) {
        auto replica = efa::topology::ParseReplicaId(id);
        REQUIRE(replica);
        efas.insert(replica->ibdev);
        nodes.insert(uverbs.at(replica->ibdev));
        ++uses[replica->ibdev];
      }
      CHECK(efas.size() == a.device_ids.size());
      for (const auto& spec : a.response.devices()) paths.insert(spec.host_path());
      CHECK(paths == nodes);
      CHECK(a.response.devices_size() == static_cast<int>(efas.size()));
      std::vector<std::string> env = absl::StrSplit(a.response.envs().at("EFA_DEVICES"), ',');
      CHECK(std::set<std::string>(env.begin(), env.end()) == efas);
    }
    if (gpu) {
      ++gpu_pods;
      aligned += Aligned(node, uid) ? 1 : 0;
    }
  }
  Report("p5 sharing x4: 1 GPU + 4 EFA among EFA-only", {aligned, gpu_pods});
  CHECK(gpu_pods == 8);
  CHECK(aligned == 8);
  // 48 replicas spread over all 32 EFAs: none shared by more than 2.
  CHECK(uses.size() == 32);
  for (const auto& [efa, n] : uses) CHECK(n <= 2);
}
