// Late binding end to end: the daemon in late-binding mode, the fake kubelet
// admitting pods one resource at a time in a chosen or random order and
// calling PreStartContainer (the plugin asks for it), and a fake GPU or
// Neuron plugin, all over real unix sockets. The test plays the container
// runtime: it resolves each container's CDI device through the spec file the
// daemon wrote. Prints the alignment rates.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "plugin/alignment/alignment.h"
#include "plugin/alignment/cdi_spec.h"
#include "plugin/alignment/late_binder.h"
#include "plugin/daemon.h"
#include "plugin/daemon_monitor.h"
#include "test/fake_kubelet/fake_accelerator_plugin.h"
#include "test/fake_kubelet/fake_kubelet.h"
#include "test/sim/sim_root.h"
#include "test/support/devices.h"
#include "test/support/temp_dir.h"
#include "test/support/test_node.h"
#include "topology/efa_discovery.h"
#include "topology/hwloc_loader.h"
#include "topology/replica_id.h"

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using efa::plugin::AlignmentMode;
using efa::plugin::Daemon;
using efa::plugin::DaemonOptions;
using efa::plugin::LateBindingCounts;
using efa::sim::SimRoot;
using efa::testing::AcceleratorKind;
using efa::testing::DaemonRun;
using efa::testing::DirEntries;
using efa::testing::FakeAcceleratorPlugin;
using efa::testing::FakeKubelet;
using efa::testing::ReadFile;
using efa::testing::TestNode;

namespace {

using efa::testing::kEfa;
constexpr char kMain[] = "main";
using efa::testing::kDeadline;

using Order = efa::testing::AdmitOrder;

// A node with the machine's GPUs or Neuron devices behind a fake plugin and
// the daemon in late-binding mode (or `mode`), registered beside it.
class LateNode : public TestNode {
 public:
  // `cdi_dir`: where late binding writes its specs (var/run/cdi of the
  // node when empty); `replicas`: device IDs per EFA (sharing).
  LateNode(const std::string& machine, AcceleratorKind kind, fs::path cdi_dir = {},
           AlignmentMode mode = AlignmentMode::kLateBinding, int replicas = 1)
      : TestNode({.machine = machine,
                  .run = DaemonRun::kLater,
                  // Released on the first look without the container, as the
                  // pods churn here faster than a real node's (the
                  // confirmation has unit tests).
                  .configure =
                      [](DaemonOptions& o) { o.late_release_after = std::chrono::milliseconds(0); },
                  .accelerators = kind,
                  .alignment = mode,
                  .cdi_dir = std::move(cdi_dir),
                  .replicas = replicas}) {
    StartServing();
    inventory_ = efa::topology::DiscoverEfaDevices(sim().roots());
  }

  // A daemon (a new one after StopDaemon: a restart) registered and streaming.
  void StartServing() {
    const int before = kubelet().registrations(kEfa);
    const int messages = kubelet().list_and_watch_messages(kEfa);
    StartDaemon();
    WaitServing(before, messages);
  }

  absl::StatusOr<FakeKubelet::AdmittedContainer> Admit(const std::string& uid, int accels, int efas,
                                                       bool accel_first) {
    std::vector<std::pair<std::string, int>> requests = {{accelerator_resource(), accels},
                                                         {kEfa, efas}};
    if (!accel_first) std::swap(requests[0], requests[1]);
    auto admitted = kubelet().AdmitContainer("pod-" + uid, "default", uid, kMain, requests);
    if (admitted.ok() && late()) CheckAllocateAnswer(uid, *admitted);
    return admitted;
  }

  // The EFA Allocate answer is the claim's CDI device and nothing else.
  void CheckAllocateAnswer(const std::string& uid, const FakeKubelet::AdmittedContainer& c) {
    for (const auto& a : c.allocations) {
      if (a.resource != kEfa) continue;
      REQUIRE(a.response.cdi_devices_size() == 1);
      CHECK(a.response.cdi_devices(0).name() ==
            efa::plugin::CdiDeviceName(efa::plugin::ClaimName(Tokens(uid))));
      CHECK(a.response.devices_size() == 0);
      CHECK(a.response.envs_size() == 0);
    }
  }

  std::vector<std::string> Tokens(const std::string& uid) const {
    return kubelet().container_devices(uid, kMain, kEfa);
  }
  fs::path SpecOf(const std::string& uid) const {
    return cdi_dir() / efa::plugin::CdiSpecFileName(efa::plugin::ClaimName(Tokens(uid)));
  }
  // What the runtime gives the container: the EFAs of its CDI device's spec.
  std::vector<std::string> PhysicalEfas(const std::string& uid) const {
    if (!late()) return Tokens(uid);  // best effort: the IDs are the EFAs
    const std::string claim = efa::plugin::ClaimName(Tokens(uid));
    auto efas = efa::plugin::ParseCdiSpec(ReadFile(SpecOf(uid)), claim, SpecOf(uid).string());
    REQUIRE(efas.ok());
    return *efas;
  }

  bool Aligned(const std::string& uid) {
    auto efas = PhysicalEfas(uid);
    return efas.size() == Tokens(uid).size() && TestNode::Aligned(uid, efas, kMain);
  }

  // No EFA is given to more of `live`'s containers than it has replicas (to
  // two without sharing), nor bound to more claims; no container gets an EFA
  // twice.
  void CheckDisjoint(const std::vector<std::string>& live) const {
    const size_t most = static_cast<size_t>(options().replicas);
    std::map<std::string, std::vector<std::string>> holders;
    for (const auto& uid : live) {
      const auto efas = PhysicalEfas(uid);
      INFO(uid << " holds " << absl::StrJoin(efas, ","));
      CHECK(std::set<std::string>(efas.begin(), efas.end()).size() == efas.size());
      for (const auto& efa : efas) holders[efa].push_back(uid);
    }
    for (const auto& [efa, uids] : holders) {
      INFO(efa << " held by " << absl::StrJoin(uids, ", "));
      CHECK(uids.size() <= most);
    }
    if (!late()) return;
    std::map<std::string, std::vector<std::string>> bound;
    for (const auto& [claim, efas] : daemon().late_binder()->Bindings()) {
      for (const auto& efa : efas) bound[efa].push_back(claim);
    }
    for (const auto& [efa, claims] : bound) {
      INFO(efa << " bound by " << absl::StrJoin(claims, ", "));
      CHECK(claims.size() <= most);
    }
  }

  // Admits pods of `accels` accelerators + `efas` EFAs until the node is
  // full, `rounds` times over (each round checked disjoint, then removed);
  // returns how many were aligned out of how many.
  std::pair<int, int> Run(int accels, int efas, Order order, int rounds, unsigned seed) {
    return AdmitRounds(
        {accels, efas, order, rounds, seed},
        [this](const std::string& uid, const FakeKubelet::AdmittedContainer& admitted) {
          if (late()) CheckAllocateAnswer(uid, admitted);
          REQUIRE(admitted.start_status.ok());
          return Aligned(uid);
        },
        [this](const std::vector<std::string>& uids) { CheckDisjoint(uids); });
  }

  bool late() const { return options().alignment == AlignmentMode::kLateBinding; }
  const efa::plugin::LateBinder& binder() { return *daemon().late_binder(); }
  const efa::topology::Inventory& inventory() const { return inventory_; }

 private:
  efa::topology::Inventory inventory_;
};

void Report(const char* what, std::pair<int, int> result) {
  std::printf("alignment late binding %-34s %3d/%3d = %5.1f%%\n", what, result.first, result.second,
              result.second ? 100.0 * result.first / result.second : 0.0);
}

}  // namespace

TEST_CASE("Late binding asks for PreStartContainer", "[late-binding][daemon][concurrency]") {
  LateNode node("p5.48xlarge", AcceleratorKind::kNvidiaGpu);
  auto options = node.kubelet().options(kEfa);
  REQUIRE(options.has_value());
  CHECK(options->pre_start_required());
  CHECK(options->get_preferred_allocation_available());
  CHECK(node.kubelet().last_request(kEfa)->options().pre_start_required());
}

TEST_CASE("Late binding aligns every p5 1 GPU + 4 EFA container in every order",
          "[late-binding][daemon][concurrency]") {
  LateNode node("p5.48xlarge", AcceleratorKind::kNvidiaGpu);
  auto gpu_first = node.Run(1, 4, Order::kAcceleratorFirst, 3, 1);
  Report("p5 1 GPU + 4 EFA, GPU first", gpu_first);
  auto efa_first = node.Run(1, 4, Order::kEfaFirst, 3, 1);
  Report("p5 1 GPU + 4 EFA, EFA first", efa_first);
  auto random = node.Run(1, 4, Order::kRandom, 5, 42);
  Report("p5 1 GPU + 4 EFA, random order", random);
  for (auto r : {gpu_first, efa_first, random}) CHECK(r.first == r.second);
  CHECK(gpu_first.second == 24);
  CHECK(efa_first.second == 24);
  CHECK(random.second == 40);
  // The daemon's own after-the-fact report agrees.
  auto counts = node.daemon().alignment_stats()->Get();
  CHECK(counts.aligned == 88);
  CHECK(counts.unaligned == 0);
  CHECK(node.binder().counts().bound == 88);
  CHECK(node.binder().counts().failed == 0);
}

TEST_CASE("Late binding aligns every p5 2 GPU + 8 EFA container in every order",
          "[late-binding][daemon][concurrency]") {
  LateNode node("p5.48xlarge", AcceleratorKind::kNvidiaGpu);
  auto gpu_first = node.Run(2, 8, Order::kAcceleratorFirst, 3, 1);
  Report("p5 2 GPU + 8 EFA, GPU first", gpu_first);
  auto efa_first = node.Run(2, 8, Order::kEfaFirst, 3, 1);
  Report("p5 2 GPU + 8 EFA, EFA first", efa_first);
  auto random = node.Run(2, 8, Order::kRandom, 5, 43);
  Report("p5 2 GPU + 8 EFA, random order", random);
  for (auto r : {gpu_first, efa_first, random}) CHECK(r.first == r.second);
  CHECK(gpu_first.second == 12);
  CHECK(efa_first.second == 12);
  CHECK(random.second == 20);
  CHECK(node.daemon().alignment_stats()->Get().unaligned == 0);
}

TEST_CASE("Late binding aligns every trn2 1 Neuron + 1 EFA container in every order",
          "[late-binding][daemon][concurrency]") {
  LateNode node("trn2.48xlarge", AcceleratorKind::kNeuron);
  auto neuron_first = node.Run(1, 1, Order::kAcceleratorFirst, 2, 1);
  Report("trn2 1 Neuron + 1 EFA, Neuron first", neuron_first);
  auto efa_first = node.Run(1, 1, Order::kEfaFirst, 2, 1);
  Report("trn2 1 Neuron + 1 EFA, EFA first", efa_first);
  auto random = node.Run(1, 1, Order::kRandom, 2, 5);
  Report("trn2 1 Neuron + 1 EFA, random order", random);
  for (auto r : {neuron_first, efa_first, random}) {
    CHECK(r.second == 32);
    CHECK(r.first == r.second);
  }
  CHECK(node.daemon().alignment_stats()->Get().unaligned == 0);
}

TEST_CASE("Late binding writes the spec whole, once, and keeps it for a restarted container",
          "[late-binding][daemon][concurrency]") {
  LateNode node("p5.48xlarge", AcceleratorKind::kNvidiaGpu);
  // EFAs first: the kubelet's tokens are the first free ones, whatever the GPU.
  REQUIRE(node.kubelet()
              .AdmitContainer("gpu-only", "default", "u0", kMain, {{"nvidia.com/gpu", 1}})
              .ok());
  auto admitted = node.Admit("u1", 1, 4, /*accel_first=*/false);
  REQUIRE(admitted.ok());
  REQUIRE(admitted->start_status.ok());
  // GPU 0000:53:00.0 went to u0, so u1 has 0000:64:00.0 and the EFAs behind it.
  CHECK(node.kubelet().container_devices("u1", kMain, "nvidia.com/gpu") ==
        std::vector<std::string>{
            efa::sim::SimGpuUuid(*efa::topology::PciAddress::Parse("0000:64:00.0"))});
  const std::vector<std::string> efas = {"rdmap96s0", "rdmap97s0", "rdmap98s0", "rdmap99s0"};
  CHECK(node.PhysicalEfas("u1") == efas);
  CHECK(node.Tokens("u1") != efas);  // the tokens were chosen without the GPU

  std::vector<efa::topology::EfaDevice> devices;
  for (const auto& d : node.inventory().devices) {
    if (std::find(efas.begin(), efas.end(), d.ibdev) != efas.end()) devices.push_back(d);
  }
  const std::string claim = efa::plugin::ClaimName(node.Tokens("u1"));
  const std::string spec = efa::plugin::CdiSpecJson(claim, devices);
  CHECK(ReadFile(node.SpecOf("u1")) == spec);
  CHECK(spec.find("\"hostPath\":\"" + (node.sim().path() / "dev/infiniband/").string()) !=
        std::string::npos);
  // The spec, and beside it what recovering the claim needs.
  CHECK(DirEntries(node.cdi_dir()) ==
        std::vector<std::string>{efa::plugin::CdiSpecFileName(claim),
                                 efa::plugin::ClaimRecordFileName(claim)});
  CHECK((fs::status(node.SpecOf("u1")).permissions() & fs::perms::all) ==
        (fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
         fs::perms::others_read));

  // PreStartContainer again (the container restarted): same EFAs, same file.
  REQUIRE(node.kubelet().StartContainer("u1", kMain).ok());
  CHECK(node.binder().counts().kept == 1);
  CHECK(node.binder().counts().bound == 1);
  CHECK(ReadFile(node.SpecOf("u1")) == spec);
  // A spec deleted behind its back is written again.
  fs::remove(node.SpecOf("u1"));
  REQUIRE(node.kubelet().StartContainer("u1", kMain).ok());
  CHECK(ReadFile(node.SpecOf("u1")) == spec);
  CHECK(node.binder().counts().kept == 2);
}

TEST_CASE("Late binding's own spec writes run no guard check",
          "[late-binding][daemon][guards][concurrency]") {
  LateNode node("p5.48xlarge", AcceleratorKind::kNvidiaGpu);
  REQUIRE(node.Admit("u1", 1, 4, true).ok());
  auto checks = [&] { return node.daemon().guard_status().checks; };
  const int before = checks();
  // Each restart of the container writes its deleted spec again.
  for (int i = 0; i < 5; ++i) {
    fs::remove(node.SpecOf("u1"));
    REQUIRE(node.kubelet().StartContainer("u1", kMain).ok());
    REQUIRE(fs::exists(node.SpecOf("u1")));
  }
  // Another file in that dir is the guard's business; the daemon handles
  // inotify events in order, so once its check shows the others were seen.
  std::ofstream(node.cdi_dir() / "other.json") << "{}";
  REQUIRE(node.daemon().WaitForGuardStatusForTest(
      [&](const efa::plugin::GuardStatus& g) { return g.checks > before; }, kDeadline));
  CHECK(checks() <= before + 2);  // the other file, and a periodic pass at most
}

TEST_CASE("Late binding releases a binding when its pod leaves the checkpoint",
          "[late-binding][daemon][concurrency]") {
  LateNode node("p5.48xlarge", AcceleratorKind::kNvidiaGpu);
  REQUIRE(node.Admit("u1", 1, 4, true).ok());
  REQUIRE(node.Admit("u2", 1, 4, false).ok());
  const fs::path spec1 = node.SpecOf("u1");
  REQUIRE(fs::exists(spec1));
  REQUIRE(node.kubelet().RemovePod("u1").ok());
  REQUIRE(node.binder().WaitForCountsForTest(
      [](const LateBindingCounts& c) { return c.released >= 1; }, kDeadline));
  CHECK_FALSE(fs::exists(spec1));
  CHECK(fs::exists(node.SpecOf("u2")));
  CHECK(node.binder().Bindings().size() == 1);
  CHECK(node.binder().BoundEfas(node.Tokens("u2")) == node.PhysicalEfas("u2"));

  efa::plugin::MonitorOptions monitor_options;
  monitor_options.sysfs_root = node.sim().sys();  // never the host's
  efa::plugin::DaemonMonitor monitor(monitor_options);
  monitor.Watch(&node.daemon());
  const std::string metrics = monitor.Metrics().body;
  for (const char* line : {"efa_device_plugin_late_binding_total{event=\"bound\"} 2\n",
                           "efa_device_plugin_late_binding_total{event=\"released\"} 1\n",
                           "efa_device_plugin_late_binding_total{event=\"failed\"} 0\n"}) {
    INFO(metrics);
    CHECK(metrics.find(line) != std::string::npos);
  }
}

TEST_CASE(
    "Late binding releases a deleted pod's binding on a quiet node, where the kubelet keeps its "
    "checkpoint entries until it next writes the file",
    "[late-binding][daemon][concurrency]") {
  LateNode node("p5.48xlarge", AcceleratorKind::kNvidiaGpu);
  node.StopDaemon();
  node.options().late_recheck_every = std::chrono::milliseconds(200);
  node.StartServing();
  REQUIRE(node.Admit("u1", 1, 4, true).ok());
  REQUIRE(node.Admit("u2", 1, 4, false).ok());
  const fs::path spec1 = node.SpecOf("u1");
  REQUIRE(fs::exists(spec1));
  // As the kubelet: the file keeps u1's entries until its next write, and
  // no admission comes to write it.
  REQUIRE(node.kubelet().RemovePod("u1", FakeKubelet::CheckpointWrite::kAsKubelet).ok());
  REQUIRE(node.binder().WaitForCountsForTest(
      [](const LateBindingCounts& c) { return c.released >= 1; }, kDeadline));
  CHECK_FALSE(fs::exists(spec1));
  CHECK(fs::exists(node.SpecOf("u2")));
  CHECK(node.binder().BoundEfas(node.Tokens("u2")) == node.PhysicalEfas("u2"));
}

TEST_CASE("Late binding releases bindings although a checkpoint entry cannot be parsed",
          "[late-binding][daemon][concurrency]") {
  LateNode node("p5.48xlarge", AcceleratorKind::kNvidiaGpu);
  // Another resource's entry the plugin cannot parse: once, it made the
  // whole checkpoint unreadable and no binding was ever released again.
  node.kubelet().AddCheckpointEntryForTest(
      R"({"PodUID":"x","ContainerName":"c","ResourceName":"example.com/widget",)"
      R"("DeviceIDs":{"0":["w0"]},"AllocResp":"%%"})");
  REQUIRE(node.Admit("u1", 1, 4, true).ok());
  REQUIRE(node.Admit("u2", 1, 4, false).ok());
  REQUIRE(node.binder().Bindings().size() == 2);
  const fs::path spec1 = node.SpecOf("u1");
  REQUIRE(node.kubelet().RemovePod("u1").ok());
  REQUIRE(node.binder().WaitForCountsForTest(
      [](const LateBindingCounts& c) { return c.released >= 1; }, kDeadline));
  CHECK_FALSE(fs::exists(spec1));
  CHECK(node.binder().BoundEfas(node.Tokens("u2")) == node.PhysicalEfas("u2"));
  CHECK(node.daemon().checkpoint_entries_skipped() == 1);
  efa::plugin::MonitorOptions monitor_options;
  monitor_options.sysfs_root = node.sim().sys();  // never the host's
  efa::plugin::DaemonMonitor monitor(monitor_options);
  monitor.Watch(&node.daemon());
  CHECK(monitor.Metrics().body.find("efa_device_plugin_checkpoint_entries_skipped 1\n") !=
        std::string::npos);

  // With pod-resources down the checkpoint alone decides: the skipped entry
  // is another resource's, no container of u2's binding.
  node.kubelet().StopPodResources();
  REQUIRE(node.kubelet().RemovePod("u2").ok());
  CHECK(node.binder().WaitForCountsForTest(
      [](const LateBindingCounts& c) { return c.released >= 2; }, kDeadline));
  CHECK(node.binder().Bindings().empty());
}

TEST_CASE("Late bindings survive a daemon restart and are never given twice",
          "[late-binding][daemon][concurrency]") {
  LateNode node("p5.48xlarge", AcceleratorKind::kNvidiaGpu);
  std::vector<std::string> live;
  for (int i = 0; i < 4; ++i) {
    const std::string uid = absl::StrCat("before-", i);
    REQUIRE(node.Admit(uid, 1, 4, i % 2 == 0).ok());
    live.push_back(uid);
  }
  const auto bindings = node.binder().Bindings();
  REQUIRE(bindings.size() == 4);

  node.StopDaemon();
  // A spec that does not parse and a write a crash interrupted: cleaned up;
  // another vendor's spec is left alone.
  const fs::path broken = node.cdi_dir() / "vpc.amazonaws.com-efa_claim-0000000000000000.json";
  std::ofstream(broken) << "{\"cdiVersion\":";
  const fs::path partial = node.cdi_dir() / ".vpc.amazonaws.com-efa_claim-1.json.Ab12Cd.tmp";
  std::ofstream(partial) << "{";
  const fs::path other = node.cdi_dir() / "example.com-thing.json";
  std::ofstream(other) << "{}";
  node.StartServing();
  CHECK(node.binder().counts().recovered == 4);
  CHECK(node.binder().Bindings() == bindings);
  CHECK_FALSE(fs::exists(broken));
  CHECK_FALSE(fs::exists(partial));
  CHECK(fs::exists(other));

  // New pods never get a recovered binding's EFAs.
  for (int i = 0; i < 4; ++i) {
    const std::string uid = absl::StrCat("after-", i);
    auto admitted = node.Admit(uid, 1, 4, i % 2 == 1);
    REQUIRE(admitted.ok());
    REQUIRE(admitted->start_status.ok());
    CHECK(node.Aligned(uid));
    live.push_back(uid);
  }
  node.CheckDisjoint(live);
  // A container bound before the restart starts again: it keeps its EFAs
  // (its owner is recovered with the binding).
  REQUIRE(node.kubelet().StartContainer("before-0", kMain).ok());
  CHECK(node.PhysicalEfas("before-0") ==
        bindings.at(efa::plugin::ClaimName(node.Tokens("before-0"))));
  CHECK(node.binder().counts().kept == 1);
  node.CheckDisjoint(live);
  CHECK(node.binder().counts().failed == 0);
}

namespace {

// Each running container's EFAs, as the runtime gave them at its start.
using Holdings = std::map<std::string, std::vector<std::string>>;

bool Disjoint(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  return std::none_of(a.begin(), a.end(),
                      [&](const auto& x) { return std::find(b.begin(), b.end(), x) != b.end(); });
}

void CheckApart(const Holdings& held) {
  std::map<std::string, std::string> holder;
  for (const auto& [uid, efas] : held) {
    for (const auto& efa : efas) {
      INFO(efa << " is held by " << holder[efa] << " and " << uid);
      CHECK(holder[efa].empty());
      holder[efa] = uid;
    }
  }
}

}  // namespace

TEST_CASE("A switch from late binding to best effort keeps bound EFAs from new pods until they end",
          "[late-binding][daemon][upgrade]") {
  LateNode node("p5.48xlarge", AcceleratorKind::kNvidiaGpu);
  Holdings held;
  // GPU 0 taken: each late container's EFAs are beside its GPU, not those
  // its IDs name (a binding of the EFAs its own IDs name is not withheld:
  // the kubelet counts those IDs held). Two: their tokens and their EFAs
  // together leave at least 16 EFAs free.
  REQUIRE(
      node.kubelet()
          .AdmitContainer("pod-gpu", "default", "gpu", kMain, {{node.accelerator_resource(), 1}})
          .ok());
  for (int i = 0; i < 2; ++i) {
    const std::string uid = absl::StrCat("late-", i);
    REQUIRE(node.Admit(uid, 1, 4, i % 2 == 0).ok());
    held[uid] = node.PhysicalEfas(uid);
  }
  node.StopDaemon();
  node.options().alignment = AlignmentMode::kBestEffort;
  node.StartServing();
  // The bound EFAs are advertised Unhealthy: the kubelet gives them to no
  // new pod.
  std::set<std::string> bound;
  for (const auto& [uid, efas] : held) bound.insert(efas.begin(), efas.end());
  REQUIRE(bound.size() == 8);
  for (const auto& d : node.kubelet().devices(kEfa)) {
    CHECK(d.health() == (bound.count(d.id()) ? "Unhealthy" : "Healthy"));
  }
  CHECK(node.daemon().reserved_efas() == bound);
  // Pods admitted best effort get others; the late containers restart with
  // their specs.
  for (int i = 0; i < 4; ++i) {
    const std::string uid = absl::StrCat("best-", i);
    auto admitted = node.Admit(uid, 1, 4, true);
    REQUIRE(admitted.ok());
    REQUIRE(admitted->start_status.ok());
    held[uid] = node.Tokens(uid);  // best effort: the IDs are the EFAs
  }
  CheckApart(held);
  REQUIRE(node.kubelet().StartContainer("late-0", kMain).ok());
  for (int i = 0; i < 2; ++i) {
    CHECK(fs::exists(node.cdi_dir() / efa::plugin::CdiSpecFileName(efa::plugin::ClaimName(
                                          node.Tokens(absl::StrCat("late-", i))))));
  }
  // A late pod ends: its binding is released and its EFAs advertised again.
  const int messages = node.kubelet().list_and_watch_messages(kEfa);
  REQUIRE(node.kubelet().RemovePod("late-1").ok());
  REQUIRE(node.kubelet().WaitForListAndWatchMessages(kEfa, messages + 1, kDeadline));
  for (const auto& efa : held["late-1"]) bound.erase(efa);
  CHECK(node.daemon().reserved_efas() == bound);
  for (const auto& d : node.kubelet().devices(kEfa)) {
    CHECK(d.health() == (bound.count(d.id()) ? "Unhealthy" : "Healthy"));
  }
  CHECK(node.binder().counts().released == 1);
}

TEST_CASE(
    "After a switch to best effort, a container that never started is bound only to EFAs whose "
    "IDs the kubelet holds",
    "[late-binding][daemon][upgrade]") {
  LateNode node("p5.48xlarge", AcceleratorKind::kNvidiaGpu);
  // GPU 0 taken: late-0 gets the next GPU and the EFAs beside it, while its
  // IDs are the first free ones. late-1, admitted but not started (its
  // image still pulling), gets the third GPU and the next IDs: they name
  // late-0's EFAs.
  REQUIRE(
      node.kubelet()
          .AdmitContainer("pod-gpu", "default", "gpu", kMain, {{node.accelerator_resource(), 1}})
          .ok());
  REQUIRE(node.Admit("late-0", 1, 4, true).ok());
  REQUIRE(node.kubelet()
              .AdmitContainer("pod-late-1", "default", "late-1", kMain,
                              {{node.accelerator_resource(), 1}, {kEfa, 4}}, {.start = false})
              .ok());
  const std::vector<std::string> bound0 = node.PhysicalEfas("late-0");
  const std::vector<std::string> named = node.Tokens("late-1");
  REQUIRE(!Disjoint(named, bound0));
  node.StopDaemon();
  node.options().alignment = AlignmentMode::kBestEffort;
  node.StartServing();
  // The daemon binds late-1 before its start. The kubelet gives every EFA
  // whose ID no container holds to the next pod it admits, by ID, before it
  // hears that the EFA is taken: late-1 may take only EFAs its own IDs or
  // late-0's name (late-0's are free: it holds others), not those beside
  // its GPU.
  REQUIRE(node.binder().WaitForCountsForTest(
      [](const LateBindingCounts& c) { return c.bound == 1; }, kDeadline));
  const auto bound1 = node.binder().BoundEfas(named);
  REQUIRE(bound1.has_value());
  std::vector<std::string> held_ids = node.Tokens("late-0");
  held_ids.insert(held_ids.end(), named.begin(), named.end());
  for (const std::string& efa : *bound1) {
    INFO(efa << " of late-1's " << absl::StrJoin(*bound1, ","));
    CHECK(!Disjoint({efa}, held_ids));
  }
  CHECK(Disjoint(*bound1, bound0));
  // Best-effort pods fill the node: each is admitted (none refused by an
  // Allocate naming an EFA taken meanwhile), and all hold EFAs apart.
  Holdings held = {{"late-0", bound0}, {"late-1", *bound1}};
  for (int i = 0; i < 5; ++i) {
    const std::string uid = absl::StrCat("best-", i);
    auto admitted = node.Admit(uid, 1, 4, true);
    REQUIRE(admitted.ok());
    held[uid] = node.Tokens(uid);
  }
  CheckApart(held);
}

TEST_CASE("A switch from best effort to late binding never binds the EFAs held by ID",
          "[late-binding][daemon][upgrade]") {
  LateNode node("p5.48xlarge", AcceleratorKind::kNvidiaGpu, {}, AlignmentMode::kBestEffort);
  Holdings held;
  for (int i = 0; i < 4; ++i) {
    const std::string uid = absl::StrCat("best-", i);
    REQUIRE(node.Admit(uid, 1, 4, true).ok());
    held[uid] = node.Tokens(uid);
  }
  node.StopDaemon();
  node.options().alignment = AlignmentMode::kLateBinding;
  node.StartServing();
  CHECK(node.daemon().reserved_efas().empty());
  for (int i = 0; i < 4; ++i) {
    const std::string uid = absl::StrCat("late-", i);
    auto admitted = node.Admit(uid, 1, 4, i % 2 == 0);
    REQUIRE(admitted.ok());
    REQUIRE(admitted->start_status.ok());
    held[uid] = node.PhysicalEfas(uid);
  }
  CheckApart(held);
  // A best-effort container's restart (PreStartContainer now) binds nothing.
  REQUIRE(node.kubelet().StartContainer("best-0", kMain).ok());
  CHECK_FALSE(node.binder().BoundEfas(node.Tokens("best-0")).has_value());
  CHECK(node.binder().Bindings().size() == 4);
}

TEST_CASE("Late binding in an unwritable CDI dir fails PreStartContainer naming the path",
          "[late-binding][daemon][concurrency]") {
  // A file where the directory should be: refused even to root.
  SimRoot scratch("no-efa");
  const fs::path not_a_dir = scratch.path() / "cdi";
  std::ofstream(not_a_dir) << "x";
  const std::vector<std::string> entries = DirEntries(scratch.path());
  LateNode node("p5.48xlarge", AcceleratorKind::kNvidiaGpu, not_a_dir);
  auto admitted = node.Admit("u1", 1, 4, true);
  REQUIRE(admitted.ok());  // admitted, but not started
  const auto tokens = node.Tokens("u1");
  const std::string claim = efa::plugin::ClaimName(tokens);
  std::vector<std::string> quoted;
  for (const auto& id : tokens) quoted.push_back("\"" + id + "\"");
  CHECK(admitted->start_status.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(admitted->start_status.message() ==
        "device plugin PreStartContainer rpc failed with err: rpc error: code = "
        "FailedPrecondition desc = cannot write the CDI spec of " +
            claim + " (kubelet devices " + absl::StrJoin(quoted, ", ") + ") to " +
            (not_a_dir / efa::plugin::CdiSpecFileName(claim)).string() + ": " + not_a_dir.string() +
            ": Not a directory");
  // Nothing half-written, nothing bound.
  CHECK(DirEntries(scratch.path()) == entries);
  CHECK(ReadFile(not_a_dir) == "x");
  CHECK(node.binder().Bindings().empty());
  CHECK(node.binder().counts().failed == 1);
}

namespace {

struct ChurnResult {
  int aligned = 0;
  int total = 0;  // containers with EFAs
  int moved = 0;  // of which bound to EFAs other than their kubelet IDs
};

// Pods of 1 or 2 GPUs with 4 EFAs each, and GPU-only pods, come and go in
// random order: the kubelet's EFA IDs soon differ from the EFAs beside the
// GPUs, and the GPU plugin no longer hands out what prediction expects.
ChurnResult Churn(LateNode& node) {
  std::mt19937 rng(2024);
  std::vector<std::string> live, with_efas;
  ChurnResult r;
  for (int step = 0; step < 120; ++step) {
    if (live.empty() || rng() % 5 < 3) {
      const int gpus = rng() % 3 == 0 ? 2 : 1;
      const bool gpu_only = rng() % 4 == 0;
      const std::string uid = absl::StrCat("churn-", step);
      auto admitted = node.Admit(uid, gpus, gpu_only ? 0 : 4 * gpus, rng() & 1);
      if (!admitted.ok()) continue;  // full
      REQUIRE(admitted->start_status.ok());
      live.push_back(uid);
      if (gpu_only) continue;
      with_efas.push_back(uid);
      ++r.total;
      r.aligned += node.Aligned(uid) ? 1 : 0;
      auto tokens = node.Tokens(uid);
      auto efas = node.PhysicalEfas(uid);
      std::sort(tokens.begin(), tokens.end());
      std::sort(efas.begin(), efas.end());
      r.moved += tokens != efas ? 1 : 0;
    } else {
      const size_t victim = rng() % live.size();
      REQUIRE(node.kubelet().RemovePod(live[victim]).ok());
      std::erase(with_efas, live[victim]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(victim));
    }
    node.CheckDisjoint(with_efas);
  }
  return r;
}

}  // namespace

TEST_CASE("Late binding never binds one EFA to two live containers through pod churn",
          "[late-binding][daemon][concurrency]") {
  LateNode node("p5.48xlarge", AcceleratorKind::kNvidiaGpu);
  const ChurnResult r = Churn(node);
  Report("p5 churn (1-2 GPUs, GPU-only pods)", {r.aligned, r.total});
  std::printf("late binding churn: %d of %d containers got EFAs other than their kubelet IDs\n",
              r.moved, r.total);
  CHECK(r.total >= 30);
  CHECK(r.moved > 0);
  CHECK(r.aligned == r.total);
  CHECK(node.binder().counts().failed == 0);
}

TEST_CASE("Best effort through the same churn, for comparison",
          "[alignment][daemon][concurrency]") {
  LateNode node("p5.48xlarge", AcceleratorKind::kNvidiaGpu, {}, AlignmentMode::kBestEffort);
  const ChurnResult r = Churn(node);
  std::printf("alignment best effort %-35s %3d/%3d = %5.1f%%\n",
              "p5 churn (1-2 GPUs, GPU-only pods)", r.aligned, r.total,
              r.total ? 100.0 * r.aligned / r.total : 0.0);
  CHECK(r.total >= 30);
  CHECK(r.moved == 0);  // the kubelet's IDs are the EFAs
}

TEST_CASE(
    "Sharing with late binding: 4 replicas on a p5 bind 8 GPU pods and 16 EFA-only pods, "
    "each EFA once per container",
    "[late-binding][sharing][daemon][concurrency]") {
  LateNode node("p5.48xlarge", AcceleratorKind::kNvidiaGpu, {}, AlignmentMode::kLateBinding,
                /*replicas=*/4);
  REQUIRE(node.kubelet().devices(kEfa).size() == 128);
  std::map<std::string, const efa::topology::EfaDevice*> by_ibdev;
  for (const auto& d : node.inventory().devices) by_ibdev[d.ibdev] = &d;
  // The container's spec gives each of its EFAs' device nodes, once.
  auto check_spec = [&](const std::string& uid) {
    const auto efas = node.PhysicalEfas(uid);
    std::vector<efa::topology::EfaDevice> devices;
    for (const auto& efa : efas) {
      REQUIRE(by_ibdev.count(efa) == 1);  // a physical EFA, not a replica ID
      devices.push_back(*by_ibdev.at(efa));
    }
    CHECK(ReadFile(node.SpecOf(uid)) ==
          efa::plugin::CdiSpecJson(efa::plugin::ClaimName(node.Tokens(uid)), devices));
  };
  std::mt19937 rng(11);
  std::vector<std::string> live;
  std::map<std::string, std::vector<std::string>> holders;  // EFA -> containers
  int gpu_pods = 0, aligned = 0;
  // Two EFA-only pods, then a GPU pod (its resources in random order).
  for (int i = 0; i < 24; ++i) {
    const bool gpu = i % 3 == 2;
    const std::string uid = absl::StrCat("uid-", i);
    auto admitted = node.Admit(uid, gpu ? 1 : 0, gpu ? 4 : 1, rng() & 1);
    REQUIRE(admitted.ok());
    REQUIRE(admitted->start_status.ok());
    live.push_back(uid);
    const auto efas = node.PhysicalEfas(uid);
    CHECK(efas.size() == node.Tokens(uid).size());
    check_spec(uid);
    for (const auto& efa : efas) holders[efa].push_back(uid);
    if (gpu) {
      ++gpu_pods;
      aligned += node.Aligned(uid) ? 1 : 0;
    }
  }
  Report("p5 sharing x4: 1 GPU + 4 EFA among EFA-only", {aligned, gpu_pods});
  CHECK(gpu_pods == 8);
  CHECK(aligned == 8);
  node.CheckDisjoint(live);
  // 48 claims spread over all 32 EFAs: none shared by more than 2, and the
  // sharers of one EFA all get its device node.
  CHECK(holders.size() == 32);
  int shared = 0;
  for (const auto& [efa, uids] : holders) {
    CHECK(uids.size() <= 2);
    if (uids.size() < 2) continue;
    ++shared;
    for (const auto& uid : uids) {
      CHECK(ReadFile(node.SpecOf(uid))
                .find("\"hostPath\":\"" + by_ibdev.at(efa)->uverbs_path + "\"") !=
            std::string::npos);
    }
  }
  CHECK(shared == 16);
  REQUIRE(node.daemon().alignment_stats()->WaitForJudgedForTest(8, kDeadline));
  CHECK(node.daemon().alignment_stats()->Get().aligned == 8);
  CHECK(node.daemon().alignment_stats()->Get().unaligned == 0);

  // 40 replica IDs of the 80 left: more than the EFAs, so some name one EFA
  // twice; the container gets every EFA, each once.
  auto big = node.Admit("big", 0, 40, true);
  REQUIRE(big.ok());
  REQUIRE(big->start_status.ok());
  std::set<std::string> token_efas;
  for (const auto& id : node.Tokens("big")) {
    auto replica = efa::topology::ParseReplicaId(id);
    REQUIRE(replica);
    token_efas.insert(replica->ibdev);
  }
  CHECK(token_efas.size() < 40);
  const auto efas = node.PhysicalEfas("big");
  CHECK(efas.size() == 32);
  check_spec("big");
  live.push_back("big");
  node.CheckDisjoint(live);
  CHECK(node.binder().counts().bound == 25);
  CHECK(node.binder().counts().failed == 0);
}

TEST_CASE(
    "Late binding: a container's EFA traffic is that of the EFAs bound to it, not of the "
    "kubelet's IDs",
    "[late-binding][counters][daemon][concurrency]") {
  LateNode node("p5.48xlarge", AcceleratorKind::kNvidiaGpu);
  // A GPU-only pod holds the lowest GPU. The next container's EFAs come
  // first: the kubelet's IDs are the policy's (beside the lowest GPU), its
  // binding is beside the GPU it gets next.
  REQUIRE(node.kubelet()
              .AdmitContainer("gpu-only", "default", "g", kMain, {{"nvidia.com/gpu", 1}})
              .ok());
  auto admitted = node.Admit("u1", 1, 4, /*accel_first=*/false);
  REQUIRE(admitted.ok());
  REQUIRE(admitted->start_status.ok());
  auto sorted = [](std::vector<std::string> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  const std::vector<std::string> bound = sorted(node.PhysicalEfas("u1"));
  REQUIRE(bound != sorted(node.Tokens("u1")));

  const auto snapshot = node.daemon().efa_counters().Sample();
  std::vector<std::string> held;
  for (const auto& c : snapshot->containers) {
    if (c.holder.Name() == "default/pod-u1/main") held = sorted(c.holder.efas);
  }
  CHECK(held == bound);
}
