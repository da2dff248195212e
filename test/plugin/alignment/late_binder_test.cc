// LateBinder on its own: a simulated p5 with a hand-written kubelet
// checkpoint, PreStartContainer called directly (concurrently too).
#include "plugin/alignment/late_binder.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "plugin/alignment/cdi_spec.h"
#include "test/fake_kubelet/fake_kubelet.h"
#include "test/plugin/guard_fakes.h"
#include "test/sim/machine_spec.h"
#include "test/sim/sim_root.h"
#include "test/support/devices.h"
#include "test/support/fake_clock.h"
#include "test/support/log_capture.h"
#include "test/support/temp_dir.h"
#include "topology/efa_discovery.h"
#include "topology/hwloc_loader.h"
#include "topology/replica_id.h"

namespace fs = std::filesystem;
using namespace efa::plugin;
using efa::testing::FakeCheckpointEntry;

namespace {

using efa::testing::kEfa;
using efa::testing::kGpu;
// p5.48xlarge: each GPU behind its own switch with 4 EFAs.
const std::vector<std::string> kGpus = {"0000:53:00.0", "0000:64:00.0", "0000:75:00.0",
                                        "0000:86:00.0", "0000:97:00.0", "0000:a8:00.0",
                                        "0000:b9:00.0", "0000:ca:00.0"};

std::string Uuid(const std::string& pci) {
  return efa::sim::SimGpuUuid(*efa::topology::PciAddress::Parse(pci));
}

FakeCheckpointEntry Entry(const std::string& uid, const std::string& resource,
                          std::vector<std::string> ids) {
  FakeCheckpointEntry e;
  e.pod_uid = uid;
  e.container = "main";
  e.resource = resource;
  e.device_ids[0] = std::move(ids);
  e.null_alloc_resp = true;
  return e;
}

class Node {
 public:
  // `replicas`: device IDs per EFA (sharing).
  explicit Node(int replicas = 1) : sim_("p5.48xlarge") {
    auto inventory = efa::topology::DiscoverEfaDevices(sim_.roots());
    auto topo = efa::topology::LoadTopology({sim_.path().string(), ""});
    REQUIRE(topo.ok());
    table_ = std::make_shared<efa::topology::DeviceTable>(
        inventory.devices, efa::topology::HostModel::FromHwloc(inventory, topo->get()), replicas);
    for (const auto& d : inventory.devices) efas_.push_back(d.ibdev);
    fs::create_directories(kubelet_dir() / "device-plugins");
  }

  LateBinderOptions Options() const {
    LateBinderOptions o;
    o.clock = clock_.get();
    o.cdi_dir = cdi_dir();
    o.kubelet_dir = kubelet_dir();  // no pod-resources socket there
    o.proc_root = sim_.path() / "proc";
    o.replicas = table_->replicas;
    return o;
  }
  // The EFAs' devices, in the order of `ibdevs`.
  std::vector<efa::topology::EfaDevice> Devices(const std::vector<std::string>& ibdevs) const {
    std::vector<efa::topology::EfaDevice> out;
    for (const auto& ibdev : ibdevs) out.push_back(*table_->FindPhysical(ibdev));
    return out;
  }
  // The CDI spec the binder wrote for `tokens`.
  std::string Spec(const LateBinder& binder, const std::vector<std::string>& tokens) const {
    std::ifstream in(binder.SpecPath(ClaimName(tokens)));
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  void WriteCheckpoint(const std::vector<FakeCheckpointEntry>& entries) const {
    std::ofstream(kubelet_dir() / "device-plugins/kubelet_internal_checkpoint")
        << efa::testing::FakeCheckpointJson(entries);
  }
  // The EFAs of GPU group `g` (0-7): the 4 behind its switch.
  std::vector<std::string> Group(int g) const {
    return {efas_.begin() + 4 * g, efas_.begin() + 4 * g + 4};
  }

  // Moves the binders' clock on.
  void Advance(std::chrono::milliseconds d) { clock_->Advance(d); }
  // What ReleaseGone returns when it has no release to confirm.
  std::chrono::steady_clock::time_point Recheck() const {
    return clock_->Now() + LateBinderOptions().recheck_every;
  }
  // What ReleaseGone returns when it noted a binding absent just now.
  std::chrono::steady_clock::time_point Confirm() const {
    return clock_->Now() + LateBinderOptions().release_after;
  }

  fs::path cdi_dir() const { return sim_.path() / "cdi"; }
  fs::path kubelet_dir() const { return sim_.path() / "kubelet"; }
  const efa::topology::DeviceTable& table() const { return *table_; }

 private:
  efa::sim::SimRoot sim_;
  std::shared_ptr<efa::topology::DeviceTable> table_;
  std::vector<std::string> efas_;  // PCI order
  std::shared_ptr<efa::testing::FakeClock> clock_ =
      std::make_shared<efa::testing::FakeClock>(efa::testing::FakeClock::duration::zero());
};

}  // namespace

TEST_CASE("Concurrent PreStartContainer calls bind each container beside its GPU, apart",
          "[late-binding][concurrency]") {
  Node node;
  // Container i holds GPU i, and the kubelet's tokens of group 7 - i.
  std::vector<FakeCheckpointEntry> entries;
  for (int i = 0; i < 8; ++i) {
    const std::string uid = absl::StrCat("uid-", i);
    entries.push_back(Entry(uid, kGpu, {Uuid(kGpus[i])}));
    entries.push_back(Entry(uid, kEfa, node.Group(7 - i)));
  }
  node.WriteCheckpoint(entries);
  LateBinder binder(node.Options());
  std::vector<absl::Status> results(8);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] { results[i] = binder.PreStart(node.table(), node.Group(7 - i)); });
  }
  for (auto& t : threads) t.join();
  std::set<std::string> seen;
  for (int i = 0; i < 8; ++i) {
    INFO("container " << i);
    CHECK(results[i].ok());
    CHECK(binder.BoundEfas(node.Group(7 - i)) == node.Group(i));
    for (const auto& efa : node.Group(i)) CHECK(seen.insert(efa).second);
  }
  CHECK(binder.counts().bound == 8);
  int specs = 0;
  for (const auto& e : fs::directory_iterator(node.cdi_dir())) {
    specs += !ClaimOfSpecFile(e.path().filename().string()).empty();
  }
  CHECK(specs == 8);
}

TEST_CASE("IDs the kubelet gives a new pod are bound afresh, the old pod's spec replaced",
          "[late-binding][concurrency]") {
  Node node;
  const auto tokens = node.Group(0);
  node.WriteCheckpoint({Entry("old", kGpu, {Uuid(kGpus[2])}), Entry("old", kEfa, tokens)});
  LateBinder binder(node.Options());
  REQUIRE(binder.PreStart(node.table(), tokens).ok());
  CHECK(binder.BoundEfas(tokens) == node.Group(2));
  // The old pod is gone; a new one got the same EFA IDs and another GPU.
  node.WriteCheckpoint({Entry("new", kGpu, {Uuid(kGpus[5])}), Entry("new", kEfa, tokens)});
  REQUIRE(binder.PreStart(node.table(), tokens).ok());
  CHECK(binder.BoundEfas(tokens) == node.Group(5));
  CHECK(binder.counts().bound == 2);
  CHECK(binder.counts().kept == 0);
  auto efas = ParseCdiSpec(
      [&] {
        std::ifstream in(binder.SpecPath(ClaimName(tokens)));
        return std::string(std::istreambuf_iterator<char>(in), {});
      }(),
      ClaimName(tokens), "spec");
  REQUIRE(efas.ok());
  CHECK(*efas == node.Group(5));
}

TEST_CASE("Without a checkpoint or pod-resources, PreStartContainer binds by the policy alone",
          "[late-binding][concurrency]") {
  Node node;
  LateBinder binder(node.Options());
  const std::vector<std::string> tokens = {node.Group(3)[0], node.Group(6)[1]};
  REQUIRE(binder.PreStart(node.table(), tokens).ok());
  CHECK(binder.BoundEfas(tokens)->size() == 2);
  // Without a checkpoint nothing is released.
  binder.ReleaseGone();
  CHECK(binder.Bindings().size() == 1);
}

TEST_CASE("PreStartContainer fails naming the claim when too few EFAs are free",
          "[late-binding][concurrency]") {
  Node node;
  LateBinder binder(node.Options());
  std::vector<FakeCheckpointEntry> entries;
  // 30 of the 32 EFAs are bound to one container; another asks for 4.
  std::vector<std::string> big, small;
  for (int g = 0; g < 8; ++g) {
    for (const auto& id : node.Group(g)) (big.size() < 30 ? big : small).push_back(id);
  }
  // IDs no binding holds (a binding that held one would be gone: the
  // kubelet gives an ID to one live container at a time).
  small.push_back("lost-0");
  small.push_back("lost-1");
  node.WriteCheckpoint({Entry("big", kEfa, big), Entry("small", kEfa, small)});
  REQUIRE(binder.PreStart(node.table(), big).ok());
  absl::Status status = binder.PreStart(node.table(), small);
  CHECK(status.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(status.message() ==
        absl::StrCat("cannot bind ", ClaimName(small), " (kubelet devices \"", small[0], "\", \"",
                     small[1], "\", \"", small[2], "\", \"", small[3],
                     "\"): 4 EFAs wanted, 2 healthy and free (30 held by other containers)"));
  CHECK(binder.counts().failed == 1);
  CHECK_FALSE(fs::exists(binder.SpecPath(ClaimName(small))));
}

TEST_CASE("Recovery keeps two specs that bind one EFA, and reports it",
          "[late-binding][concurrency]") {
  Node node;
  fs::create_directories(node.cdi_dir());
  std::vector<efa::topology::EfaDevice> a = {node.table().devices[0], node.table().devices[1]};
  std::vector<efa::topology::EfaDevice> b = {node.table().devices[1], node.table().devices[2]};
  std::ofstream(node.cdi_dir() / CdiSpecFileName("claim-a")) << CdiSpecJson("claim-a", a);
  std::ofstream(node.cdi_dir() / CdiSpecFileName("claim-b")) << CdiSpecJson("claim-b", b);
  LateBinder binder(node.Options());
  REQUIRE(binder.Recover().ok());
  CHECK(binder.counts().recovered == 2);
  auto bindings = binder.Bindings();
  CHECK(bindings.at("claim-a") == std::vector<std::string>{a[0].ibdev, a[1].ibdev});
  CHECK(bindings.at("claim-b") == std::vector<std::string>{b[0].ibdev, b[1].ibdev});
  // Neither is in the (empty) checkpoint: both go, with their files, once
  // a second look confirms it.
  node.WriteCheckpoint({});
  CHECK(binder.ReleaseGone().has_value());
  node.Advance(LateBinderOptions().release_after);
  CHECK_FALSE(binder.ReleaseGone().has_value());
  CHECK(binder.Bindings().empty());
  CHECK(binder.counts().released == 2);
  CHECK(fs::is_empty(node.cdi_dir()));
}

namespace {

fs::path binder_spec(const Node& node, const std::vector<std::string>& ids) {
  return node.cdi_dir() / CdiSpecFileName(ClaimName(ids));
}

}  // namespace

TEST_CASE("Two record-less specs binding one EFA are not both adopted by new pods",
          "[late-binding][upgrade]") {
  Node node;
  fs::create_directories(node.cdi_dir());
  // Left behind by a daemon that wrote no records (gone containers' specs,
  // a read-only CDI dir); the kubelet gives their IDs to two new pods.
  const std::vector<std::string> ids_a = {node.Group(0)[0]}, ids_b = {node.Group(1)[0]};
  const std::vector<efa::topology::EfaDevice> a = node.Devices({node.Group(5)[0]});
  const std::vector<efa::topology::EfaDevice> b = node.Devices({node.Group(5)[0]});
  std::ofstream(binder_spec(node, ids_a)) << CdiSpecJson(ClaimName(ids_a), a);
  std::ofstream(binder_spec(node, ids_b)) << CdiSpecJson(ClaimName(ids_b), b);
  node.WriteCheckpoint({Entry("new-a", kEfa, ids_a), Entry("new-b", kEfa, ids_b)});
  LateBinder binder(node.Options());
  REQUIRE(binder.Recover().ok());
  REQUIRE(binder.PreStart(node.table(), ids_a).ok());
  REQUIRE(binder.PreStart(node.table(), ids_b).ok());
  // new-a keeps the spec its IDs name; new-b's is released, and it is
  // bound afresh: the EFA is in one binding.
  CHECK(binder.BoundEfas(ids_a) == std::vector<std::string>{node.Group(5)[0]});
  REQUIRE(binder.BoundEfas(ids_b).has_value());
  const auto b_now = *binder.BoundEfas(ids_b);
  CHECK(std::find(b_now.begin(), b_now.end(), node.Group(5)[0]) == b_now.end());
}

TEST_CASE("Recovery refuses a spec over its size bound, naming it, and keeps the others",
          "[late-binding]") {
  Node node;
  fs::create_directories(node.cdi_dir());
  std::vector<efa::topology::EfaDevice> a = {node.table().devices[0]};
  std::ofstream(node.cdi_dir() / CdiSpecFileName("claim-a")) << CdiSpecJson("claim-a", a);
  // Named as ours, but far larger than any spec we write (a few hundred
  // bytes): not read past its bound.
  const fs::path big = node.cdi_dir() / CdiSpecFileName("claim-b");
  std::ofstream(big) << CdiSpecJson("claim-b", a) << std::string(64 << 10, ' ');
  efa::testing::LogCapture log;
  LateBinder binder(node.Options());
  REQUIRE(binder.Recover().ok());
  CHECK(binder.counts().recovered == 1);
  CHECK(binder.Bindings().count("claim-a") == 1);
  CHECK(binder.Bindings().count("claim-b") == 0);
  const std::vector<std::string> lines = log.Take();
  CHECK(std::find(lines.begin(), lines.end(),
                  "[error] late binding: cannot recover a binding from " + big.string() +
                      ": larger than 64 KiB; removed it: its EFAs are unknown and its container "
                      "gets new ones at its next start") != lines.end());
  CHECK_FALSE(fs::exists(big));
}

TEST_CASE("A restarted kubelet's empty pod-resources List releases no binding it checkpointed",
          "[late-binding][concurrency]") {
  Node node;
  // A running container and an init container (which List never shows).
  FakeCheckpointEntry init = Entry("uid-1", kEfa, node.Group(1));
  init.container = "init";
  node.WriteCheckpoint(
      {Entry("uid-0", kGpu, {Uuid(kGpus[0])}), Entry("uid-0", kEfa, node.Group(0)), init});
  LateBinder binder(node.Options());
  REQUIRE(binder.PreStart(node.table(), node.Group(0)).ok());
  REQUIRE(binder.PreStart(node.table(), node.Group(1)).ok());
  const auto bound = binder.Bindings();
  // The kubelet restarted: pod-resources answers, with no pod yet, while
  // its checkpoint holds both containers.
  efa::testing::FakeKubelet kubelet(efa::testing::FakeKubelet::ForKubeletDir(node.kubelet_dir()));
  REQUIRE(kubelet.Start().ok());
  for (int look = 0; look < 3; ++look) {
    CHECK(binder.ReleaseGone() == node.Recheck());
    node.Advance(std::chrono::minutes(1));
  }
  CHECK(binder.Bindings() == bound);
  CHECK(binder.counts().released == 0);
  for (const auto& [claim, efas] : bound) CHECK(fs::exists(binder.SpecPath(claim)));
  // Their EFAs are not free: a new container gets others.
  const std::vector<std::string> next = {"new-0", "new-1", "new-2", "new-3"};
  REQUIRE(binder.PreStart(node.table(), next).ok());
  const auto got = binder.BoundEfas(next);
  REQUIRE(got.has_value());
  for (const std::string& efa : *got) {
    for (const auto& [claim, efas] : bound) {
      CHECK(std::find(efas.begin(), efas.end(), efa) == efas.end());
    }
  }
}

TEST_CASE("A binding is released after two looks without its container, release_after apart",
          "[late-binding][concurrency]") {
  Node node;
  node.WriteCheckpoint({Entry("uid-0", kEfa, node.Group(0)), Entry("uid-1", kEfa, node.Group(1))});
  LateBinder binder(node.Options());
  REQUIRE(binder.PreStart(node.table(), node.Group(0)).ok());
  REQUIRE(binder.PreStart(node.table(), node.Group(1)).ok());
  const auto after = LateBinderOptions().release_after;
  node.WriteCheckpoint({Entry("uid-1", kEfa, node.Group(1))});  // uid-0 deleted
  auto due = binder.ReleaseGone();
  REQUIRE(due.has_value());
  node.Advance(after - std::chrono::milliseconds(1));
  CHECK(binder.ReleaseGone() == due);
  CHECK(binder.Bindings().size() == 2);
  // Back in the kubelet's records (a read in between was wrong): the
  // confirmation starts over.
  node.WriteCheckpoint({Entry("uid-0", kEfa, node.Group(0)), Entry("uid-1", kEfa, node.Group(1))});
  CHECK(binder.ReleaseGone() == node.Recheck());
  node.WriteCheckpoint({Entry("uid-1", kEfa, node.Group(1))});
  CHECK(binder.ReleaseGone() == node.Confirm());
  node.Advance(after - std::chrono::milliseconds(1));
  binder.ReleaseGone();
  CHECK(binder.Bindings().size() == 2);
  node.Advance(std::chrono::milliseconds(1));
  CHECK(binder.ReleaseGone() == node.Recheck());  // uid-1's remains
  CHECK(binder.Bindings().size() == 1);
  CHECK_FALSE(fs::exists(binder.SpecPath(ClaimName(node.Group(0)))));
  CHECK(binder.counts().released == 1);
}

TEST_CASE(
    "Bound containers the checkpoint holds and List lacks ask the kubelet once to rewrite its "
    "checkpoint",
    "[late-binding][concurrency]") {
  Node node;
  node.WriteCheckpoint({Entry("uid-0", kEfa, node.Group(0)), Entry("uid-1", kEfa, node.Group(1))});
  int refreshes = 0;
  LateBinderOptions options = node.Options();
  options.refresh_checkpoint = [&refreshes] { ++refreshes; };
  options.pod_resources.burst = 100;  // every pass asks List
  LateBinder binder(options);
  REQUIRE(binder.PreStart(node.table(), node.Group(0)).ok());
  // Without pod-resources nothing is asked: the checkpoint alone decides.
  CHECK(binder.ReleaseGone() == node.Recheck());
  CHECK(refreshes == 0);
  // List answers without uid-0 (deleted, or an init container).
  efa::testing::FakeKubelet kubelet(efa::testing::FakeKubelet::ForKubeletDir(node.kubelet_dir()));
  REQUIRE(kubelet.Start().ok());
  node.WriteCheckpoint({Entry("uid-0", kEfa, node.Group(0)), Entry("uid-1", kEfa, node.Group(1))});
  CHECK(binder.ReleaseGone() == node.Recheck());
  CHECK(refreshes == 1);
  // The same set again (an init container's entry stays for its pod's life).
  node.Advance(std::chrono::minutes(1));
  CHECK(binder.ReleaseGone() == node.Recheck());
  CHECK(refreshes == 1);
  // Another bound container in the same state: asked again.
  REQUIRE(binder.PreStart(node.table(), node.Group(1)).ok());
  CHECK(binder.ReleaseGone() == node.Recheck());
  CHECK(refreshes == 2);
  CHECK(binder.Bindings().size() == 2);
}

TEST_CASE("The kubelet giving a binding's IDs to another container releases it at once",
          "[late-binding][concurrency]") {
  Node node;
  LateBinder binder(node.Options());
  REQUIRE(binder.PreStart(node.table(), node.Group(0)).ok());
  std::vector<std::string> reused = {node.Group(0)[0], node.Group(0)[1]};
  REQUIRE(binder.PreStart(node.table(), reused).ok());
  CHECK(binder.Bindings().size() == 1);
  CHECK(binder.counts().released == 1);
  CHECK_FALSE(fs::exists(binder.SpecPath(ClaimName(node.Group(0)))));
}

TEST_CASE(
    "A checkpoint with a skipped EFA entry releases nothing; another resource's does not stop it",
    "[late-binding][concurrency]") {
  Node node;
  node.WriteCheckpoint({Entry("uid-0", kEfa, node.Group(0))});
  LateBinder binder(node.Options());
  REQUIRE(binder.PreStart(node.table(), node.Group(0)).ok());
  // An entry of `resource` whose AllocResp is not base64.
  auto write_with = [&](const std::string& resource) {
    std::string json = efa::testing::FakeCheckpointJson({});
    const std::string empty = "\"PodDeviceEntries\":[]";
    const size_t at = json.find(empty);
    REQUIRE(at != std::string::npos);
    json.replace(at, empty.size(),
                 absl::StrCat("\"PodDeviceEntries\":[{\"PodUID\":\"x\",\"ContainerName\":\"c\","
                              "\"ResourceName\":\"",
                              resource, "\",\"DeviceIDs\":{\"0\":[\"a\"]},\"AllocResp\":\"%%\"}]"));
    std::ofstream(node.kubelet_dir() / "device-plugins/kubelet_internal_checkpoint") << json;
  };
  write_with(kEfa);
  for (int look = 0; look < 3; ++look) {
    CHECK(binder.ReleaseGone() == node.Recheck());
    node.Advance(std::chrono::minutes(1));
  }
  CHECK(binder.Bindings().size() == 1);
  CHECK(binder.counts().undecided == 3);
  write_with("example.com/widget");
  CHECK(binder.ReleaseGone() == node.Confirm());
  node.Advance(std::chrono::minutes(1));
  binder.ReleaseGone();
  CHECK(binder.Bindings().empty());
}

namespace {

// Replica IDs `first`..`first + n - 1` of EFA `ibdev`.
std::vector<std::string> Replicas(const std::string& ibdev, int first, int n) {
  std::vector<std::string> ids;
  for (int r = first; r < first + n; ++r) ids.push_back(efa::topology::ReplicaId(ibdev, r));
  return ids;
}

}  // namespace

TEST_CASE("Sharing: a claim of replica IDs binds distinct physical EFAs, each once in its spec",
          "[late-binding][sharing][concurrency]") {
  Node node(/*replicas=*/4);
  // The kubelet's tokens: all four replicas of one EFA far from the GPU,
  // and for a second container six replicas of two EFAs.
  const auto four = Replicas(node.Group(5)[0], 0, 4);
  auto six = Replicas(node.Group(6)[0], 0, 4);
  for (const auto& id : Replicas(node.Group(6)[1], 0, 2)) six.push_back(id);
  node.WriteCheckpoint({Entry("a", kGpu, {Uuid(kGpus[2])}), Entry("a", kEfa, four),
                        Entry("b", kGpu, {Uuid(kGpus[3])}), Entry("b", kEfa, six)});
  LateBinder binder(node.Options());
  REQUIRE(binder.PreStart(node.table(), four).ok());
  // Four different EFAs beside the GPU, named physically, each device once.
  CHECK(binder.BoundEfas(four) == node.Group(2));
  CHECK(node.Spec(binder, four) == CdiSpecJson(ClaimName(four), node.Devices(node.Group(2))));
  auto parsed = ParseCdiSpec(node.Spec(binder, four), ClaimName(four), "spec");
  REQUIRE(parsed.ok());
  CHECK(*parsed == node.Group(2));

  // Six: the four beside the GPU and two more, all different.
  REQUIRE(binder.PreStart(node.table(), six).ok());
  const auto bound = *binder.BoundEfas(six);
  CHECK(bound.size() == 6);
  CHECK(std::set<std::string>(bound.begin(), bound.end()).size() == 6);
  for (const auto& efa : node.Group(3)) {
    CHECK(std::find(bound.begin(), bound.end(), efa) != bound.end());
  }
  CHECK(node.Spec(binder, six) == CdiSpecJson(ClaimName(six), node.Devices(bound)));
  for (const auto& [claim, efas] : binder.Bindings()) {
    for (const auto& efa : efas) CHECK(node.table().FindPhysical(efa) != nullptr);
  }
}

TEST_CASE("Sharing: the binder takes the least shared EFAs beside the GPU, up to the replicas",
          "[late-binding][sharing][concurrency]") {
  Node node(/*replicas=*/2);
  // Five containers beside GPU 3, one after another (a hand-written
  // checkpoint: the binder does not care that they share the GPU).
  // Their tokens: d asks for four, two replicas each of two EFAs.
  const std::map<std::string, std::vector<std::string>> claims = {
      {"a", Replicas(node.Group(0)[0], 0, 1)},
      {"b", Replicas(node.Group(0)[1], 0, 1)},
      {"c", Replicas(node.Group(0)[2], 0, 2)},
      {"d",
       {efa::topology::ReplicaId(node.Group(0)[3], 0),
        efa::topology::ReplicaId(node.Group(0)[3], 1),
        efa::topology::ReplicaId(node.Group(1)[1], 0),
        efa::topology::ReplicaId(node.Group(1)[1], 1)}},
      {"e", Replicas(node.Group(1)[0], 0, 2)}};
  std::vector<FakeCheckpointEntry> entries;
  for (const auto& [uid, ids] : claims) {
    entries.push_back(Entry(uid, kGpu, {Uuid(kGpus[3])}));
    entries.push_back(Entry(uid, kEfa, ids));
  }
  node.WriteCheckpoint(entries);
  auto tokens = [&](const std::string& uid) { return claims.at(uid); };
  LateBinder binder(node.Options());
  const auto g = node.Group(3);
  // Unshared EFAs first, in PCI order.
  REQUIRE(binder.PreStart(node.table(), tokens("a")).ok());
  CHECK(binder.BoundEfas(tokens("a")) == std::vector<std::string>{g[0]});
  REQUIRE(binder.PreStart(node.table(), tokens("b")).ok());
  CHECK(binder.BoundEfas(tokens("b")) == std::vector<std::string>{g[1]});
  REQUIRE(binder.PreStart(node.table(), tokens("c")).ok());
  CHECK(binder.BoundEfas(tokens("c")) == std::vector<std::string>{g[2], g[3]});
  // Four: the switch's four EFAs, each a second time (distinct EFAs beside
  // the GPU before any further away).
  REQUIRE(binder.PreStart(node.table(), tokens("d")).ok());
  CHECK(binder.BoundEfas(tokens("d")) == g);
  // The switch is full (2 replicas each): two other EFAs, not a third
  // claim on any of the switch's.
  REQUIRE(binder.PreStart(node.table(), tokens("e")).ok());
  const auto e = *binder.BoundEfas(tokens("e"));
  CHECK(e.size() == 2);
  for (const auto& efa : e) CHECK(std::find(g.begin(), g.end(), efa) == g.end());

  // a and d share g[0]: both specs give its device node.
  const std::string uverbs = "\"hostPath\":\"" + node.table().FindPhysical(g[0])->uverbs_path;
  CHECK(node.Spec(binder, tokens("a")).find(uverbs) != std::string::npos);
  CHECK(node.Spec(binder, tokens("d")).find(uverbs) != std::string::npos);
  CHECK(node.Spec(binder, tokens("c")).find(uverbs) == std::string::npos);
  std::map<std::string, int> uses;
  for (const auto& [claim, efas] : binder.Bindings()) {
    for (const auto& efa : efas) ++uses[efa];
  }
  for (const auto& efa : g) CHECK(uses[efa] == 2);
  CHECK(binder.counts().bound == 5);
}

TEST_CASE("Sharing: EFA-only claims fill every EFA once before any twice, and never beyond",
          "[late-binding][sharing][concurrency]") {
  Node node(/*replicas=*/2);
  LateBinder binder(node.Options());  // no checkpoint: the policy places them
  std::vector<std::string> efas;
  for (int g = 0; g < 8; ++g) {
    for (const auto& efa : node.Group(g)) efas.push_back(efa);
  }
  auto uses = [&] {
    std::map<std::string, int> out;
    for (const auto& [claim, bound] : binder.Bindings()) {
      for (const auto& efa : bound) ++out[efa];
    }
    return out;
  };
  // 32 claims of one replica each: every EFA once.
  for (const auto& efa : efas) REQUIRE(binder.PreStart(node.table(), {efa + "::0"}).ok());
  CHECK(uses().size() == 32);
  for (const auto& [efa, n] : uses()) CHECK(n == 1);
  // 32 more, concurrently: every EFA twice.
  std::vector<absl::Status> results(32);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 8 * t; i < 8 * t + 8; ++i) {
        results[i] = binder.PreStart(node.table(), {efas[i] + "::1"});
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& r : results) CHECK(r.ok());
  CHECK(uses().size() == 32);
  for (const auto& [efa, n] : uses()) CHECK(n == 2);
  // Every replica is bound: a 65th claim (a lost binding's) gets none.
  const std::vector<std::string> extra = {"rdmap79s0::lost", "rdmap80s0::lost"};
  absl::Status status = binder.PreStart(node.table(), extra);
  CHECK(status.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(status.message() ==
        absl::StrCat("cannot bind ", ClaimName(extra),
                     " (kubelet devices \"rdmap79s0::lost\", \"rdmap80s0::lost\"): "
                     "2 EFAs wanted, 0 healthy and free (32 held by other "
                     "containers)"));
  CHECK(binder.counts().bound == 64);
  CHECK(binder.counts().failed == 1);
}

namespace {

// An entry whose Allocate answer gave device nodes by ID (best effort),
// to be shared by `replicas` containers (0: an answer that does not say, a
// daemon's older than EFA_SHARING_REPLICAS).
FakeCheckpointEntry ByIdEntry(const std::string& uid, const std::string& resource,
                              const std::vector<std::string>& ids, int replicas = 0) {
  FakeCheckpointEntry e = Entry(uid, resource, ids);
  e.null_alloc_resp = false;
  if (replicas > 0) (*e.alloc_resp.mutable_envs())[kEnvSharingReplicas] = absl::StrCat(replicas);
  for (const std::string& id : ids) {
    const auto replica = efa::topology::ParseReplicaId(id);
    auto* spec = e.alloc_resp.add_devices();
    spec->set_host_path("/dev/infiniband/uverbs-" + (replica ? replica->ibdev : id));
    spec->set_container_path(spec->host_path());
  }
  return e;
}

bool Disjoint(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  return std::none_of(a.begin(), a.end(),
                      [&](const auto& x) { return std::find(b.begin(), b.end(), x) != b.end(); });
}

}  // namespace

TEST_CASE("A binding made under one EFA resource name is kept while served under the other",
          "[late-binding][upgrade]") {
  Node node;
  node.WriteCheckpoint(
      {Entry("uid-0", kGpu, {Uuid(kGpus[0])}), Entry("uid-0", kEfa, node.Group(0))});
  {
    LateBinder before(node.Options());
    REQUIRE(before.PreStart(node.table(), node.Group(0)).ok());
  }
  // helm upgrade --set sharing.replicas=2,sharing.renameByDefault=true: the
  // kubelet keeps the running container under the old name.
  LateBinderOptions options = node.Options();
  options.resource_name = kSharedResourceName;
  options.replicas = 2;
  LateBinder after(options);
  REQUIRE(after.Recover().ok());
  for (int look = 0; look < 3; ++look) {
    after.ReleaseGone();
    node.Advance(LateBinderOptions().release_after);
  }
  CHECK(after.Bindings().size() == 1);
  CHECK(after.counts().released == 0);
  CHECK(fs::exists(after.SpecPath(ClaimName(node.Group(0)))));
  // Said: the kubelet cannot restart it (no plugin of the old name).
  CHECK(after.BoundUnderOtherName() == 1);
}

TEST_CASE("Late binding never binds the EFAs a best-effort container holds by ID",
          "[late-binding][upgrade]") {
  Node node;
  // Admitted best effort before the switch: it holds group 2 by ID.
  const auto tokens = node.Group(0);
  node.WriteCheckpoint({ByIdEntry("old", kEfa, node.Group(2)), Entry("new", kGpu, {Uuid(kGpus[2])}),
                        Entry("new", kEfa, tokens)});
  LateBinder binder(node.Options());
  REQUIRE(binder.Recover().ok());
  REQUIRE(binder.PreStart(node.table(), tokens).ok());
  const auto got = binder.BoundEfas(tokens);
  REQUIRE(got.has_value());
  CHECK(Disjoint(*got, node.Group(2)));
  // The old container's own restart binds nothing: its Allocate answer
  // gives it group 2 again.
  REQUIRE(binder.PreStart(node.table(), node.Group(2)).ok());
  CHECK_FALSE(binder.BoundEfas(node.Group(2)).has_value());
  CHECK(binder.counts().bound == 1);
}

TEST_CASE("A checkpoint not read whole counts the holders by ID of the latest whole read",
          "[late-binding][upgrade]") {
  Node node;
  const auto tokens = node.Group(0);
  const std::vector<FakeCheckpointEntry> entries = {ByIdEntry("old", kEfa, node.Group(2)),
                                                    Entry("new", kGpu, {Uuid(kGpus[2])}),
                                                    Entry("new", kEfa, tokens)};
  const fs::path checkpoint = node.kubelet_dir() / "device-plugins/kubelet_internal_checkpoint";
  LateBinder binder(node.Options());
  REQUIRE(binder.Recover().ok());
  // Never read whole (EMFILE, a torn write): nothing is bound, for a holder
  // by ID may be what it lacks; the kubelet retries the start.
  std::ofstream(checkpoint) << "{";
  const absl::Status unknown = binder.PreStart(node.table(), tokens);
  CHECK(unknown.code() == absl::StatusCode::kUnavailable);
  CHECK(absl::StrContains(unknown.message(), "hold EFAs by device ID is unknown"));
  CHECK(binder.Bindings().empty());
  node.WriteCheckpoint(entries);
  REQUIRE(binder.PreStart(node.table(), tokens).ok());
  // 24 EFAs left beside the 4 bound and the 4 held by ID: a claim of 28
  // fails while the checkpoint cannot be read, as it would after.
  std::vector<std::string> many;
  for (int g = 0; g < 7; ++g) {
    for (const std::string& efa : node.Group(g)) many.push_back(efa + "-x");
  }
  std::ofstream(checkpoint) << "{";
  const absl::Status refused = binder.PreStart(node.table(), many);
  CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(refused.message(), "28 EFAs wanted, 24 healthy and free"));
  CHECK_FALSE(binder.BoundEfas(many).has_value());
}

TEST_CASE("A container restarted while the checkpoint is unreadable keeps its binding after",
          "[late-binding][sharing]") {
  // Soak seed 1020: uid-1 holds every EFA once (replica 1 of each), uid-2
  // three of them shared (replica 0: its IDs alone do not say it shares).
  Node node(/*replicas=*/2);
  std::vector<std::string> all, ids;
  for (int g = 0; g < 8; ++g) {
    for (const std::string& efa : node.Group(g)) all.push_back(efa + "::1");
  }
  for (const std::string& efa : node.Group(0)) ids.push_back(efa + "::0");
  ids.pop_back();
  node.WriteCheckpoint({Entry("uid-1", kEfa, all), Entry("uid-2", kEfa, ids)});
  LateBinder binder(node.Options());
  REQUIRE(binder.PreStart(node.table(), all).ok());
  REQUIRE(binder.PreStart(node.table(), ids).ok());
  // uid-1 deleted; uid-2's container restarts during a full descriptor
  // table: bound again, its owner unknown.
  std::ofstream(node.kubelet_dir() / "device-plugins/kubelet_internal_checkpoint") << "{";
  REQUIRE(binder.PreStart(node.table(), ids).ok());
  const auto bound = binder.BoundEfas(ids);
  REQUIRE(bound.has_value());
  // Readable again: uid-2 is adopted as the binding's container, not taken
  // for a gone one's spec because uid-1's binding (not released yet) holds
  // its EFAs too.
  node.WriteCheckpoint({Entry("uid-2", kEfa, ids)});
  binder.ReleaseGone();
  CHECK(binder.BoundEfas(ids) == bound);
  CHECK(fs::exists(binder.SpecPath(ClaimName(ids))));
  CHECK(binder.counts().released == 0);
}

TEST_CASE("A container holding EFAs by ID restarted while the checkpoint is unreadable keeps them",
          "[late-binding][upgrade]") {
  // Soak seed 1001 (late binding, step 238): "old" admitted under best
  // effort holds group 2 by ID, every other EFA is held too; the daemon
  // now late-binds ("new") and read the checkpoint whole once; then old's
  // container restarts during a full descriptor table.
  Node node;
  std::vector<FakeCheckpointEntry> entries = {ByIdEntry("old", kEfa, node.Group(2)),
                                              Entry("new", kEfa, node.Group(5))};
  for (int g = 0; g < 8; ++g) {
    if (g != 2 && g != 5) {
      entries.push_back(ByIdEntry("uid-" + std::to_string(g), kEfa, node.Group(g)));
    }
  }
  node.WriteCheckpoint(entries);
  LateBinder binder(node.Options());
  REQUIRE(binder.Recover().ok());
  REQUIRE(binder.PreStart(node.table(), node.Group(5)).ok());  // "new", late-bound
  binder.ReleaseGone();                                        // reads the checkpoint whole
  std::ofstream(node.kubelet_dir() / "device-plugins/kubelet_internal_checkpoint") << "{";
  // Its Allocate answer gives it group 2 again: nothing to bind, nothing
  // refused.
  const absl::Status restarted = binder.PreStart(node.table(), node.Group(2));
  INFO(restarted.message());
  CHECK(restarted.ok());
  CHECK_FALSE(binder.BoundEfas(node.Group(2)).has_value());
  CHECK(binder.counts().kept == 1);
  CHECK(binder.counts().failed == 0);
  CHECK(binder.counts().bound == 1);
}

namespace {

// uid-5, late-bound by a daemon now gone: its tokens name the EFAs beside
// GPU 0 (group 0); it is bound beside GPU 3 (group 3). Returns its tokens.
std::vector<std::string> BindUid5(const Node& node) {
  const std::vector<std::string> tokens = node.Group(0);
  node.WriteCheckpoint({Entry("uid-5", kGpu, {Uuid(kGpus[3])}), Entry("uid-5", kEfa, tokens)});
  LateBinder binder(node.Options());
  REQUIRE(binder.PreStart(node.table(), tokens).ok());
  REQUIRE(binder.BoundEfas(tokens) == node.Group(3));
  return tokens;
}

}  // namespace

TEST_CASE("A binding whose IDs the kubelet gave another pod by ID is released, its EFAs held",
          "[late-binding][upgrade]") {
  Node node;
  const std::vector<std::string> old_tokens = BindUid5(node);
  // Switched to best effort, uid-5 deleted, uid-9 given the same IDs by ID
  // (the kubelet freed them first); then back to late binding.
  node.WriteCheckpoint({ByIdEntry("uid-9", kEfa, old_tokens)});
  LateBinder after(node.Options());
  REQUIRE(after.Recover().ok());
  CHECK(after.Bindings().size() == 1);
  // The next late-bound claim, beside GPU 0, is not given uid-9's EFAs.
  const std::vector<std::string> tokens = node.Group(1);
  node.WriteCheckpoint({ByIdEntry("uid-9", kEfa, old_tokens),
                        Entry("uid-11", kGpu, {Uuid(kGpus[0])}), Entry("uid-11", kEfa, tokens)});
  REQUIRE(after.PreStart(node.table(), tokens).ok());
  CHECK(Disjoint(*after.BoundEfas(tokens), old_tokens));
  // uid-5's binding is released at once, not kept for uid-9.
  CHECK_FALSE(after.BoundEfas(old_tokens).has_value());
  CHECK_FALSE(fs::exists(after.SpecPath(ClaimName(old_tokens))));
}

TEST_CASE("A binding one of whose IDs another pod holds by ID is released at once",
          "[late-binding][upgrade]") {
  Node node;
  const std::vector<std::string> old_tokens = BindUid5(node);
  // uid-5 deleted; under best effort uid-9 is given one of its IDs by ID
  // (and another EFA): uid-5's container is gone, its EFAs free at once.
  node.WriteCheckpoint({ByIdEntry("uid-9", kEfa, {old_tokens[1], node.Group(5)[0]}, 1)});
  LateBinderOptions options = node.Options();
  options.late_binding = false;
  LateBinder after(options);
  REQUIRE(after.Recover().ok());
  REQUIRE(after.Bindings().size() == 1);
  CHECK(after.Reserved().count(node.Group(3)[0]) == 0);
  CHECK(after.Bindings().empty());
  CHECK(after.counts().released == 1);
}

TEST_CASE("A held-by-ID EFA of an exclusive allocation is never shared by late binding",
          "[late-binding][upgrade]") {
  Node node(/*replicas=*/2);
  // Admitted best effort while replicas was 1: "rdmap..." IDs, exclusive.
  std::vector<FakeCheckpointEntry> entries = {ByIdEntry("old", kEfa, node.Group(0))};
  std::vector<std::string> tokens;
  for (int g = 0; g < 8; ++g) {
    for (const auto& efa : node.Group(g)) tokens.push_back(efa + "::0");
  }
  tokens.resize(28);  // the 28 EFAs beside group 0 have room for this claim's 28
  entries.push_back(Entry("new", kSharedResourceName, tokens));
  node.WriteCheckpoint(entries);
  LateBinder binder(node.Options());
  REQUIRE(binder.PreStart(node.table(), tokens).ok());
  CHECK(Disjoint(*binder.BoundEfas(tokens), node.Group(0)));
}

TEST_CASE(
    "A refusal while the checkpoint holds by-ID containers List lacks asks once for a rewrite",
    "[late-binding][upgrade]") {
  Node node;
  // A pod admitted best effort holds every EFA by ID; it was deleted, and
  // its entries stay in the checkpoint until the kubelet writes it again.
  std::vector<std::string> all;
  for (int g = 0; g < 8; ++g) {
    for (const auto& efa : node.Group(g)) all.push_back(efa);
  }
  const std::vector<std::string> tokens = {"t"};
  node.WriteCheckpoint({ByIdEntry("gone", kEfa, all), Entry("new", kEfa, tokens)});
  int refreshes = 0;
  LateBinderOptions options = node.Options();
  options.refresh_checkpoint = [&refreshes] { ++refreshes; };
  options.pod_resources.burst = 100;  // every call asks List
  LateBinder binder(options);
  REQUIRE(binder.Recover().ok());
  // Without pod-resources nothing says the holder is gone: nothing asked.
  CHECK(absl::IsFailedPrecondition(binder.PreStart(node.table(), tokens)));
  CHECK(refreshes == 0);
  efa::testing::FakeKubelet kubelet(efa::testing::FakeKubelet::ForKubeletDir(node.kubelet_dir()));
  REQUIRE(kubelet.Start().ok());
  CHECK(absl::IsFailedPrecondition(binder.PreStart(node.table(), tokens)));
  CHECK(absl::IsFailedPrecondition(binder.PreStart(node.table(), tokens)));
  CHECK(refreshes == 1);
  // Rewritten without it: the next start is bound.
  node.WriteCheckpoint({Entry("new", kEfa, tokens)});
  CHECK(binder.PreStart(node.table(), tokens).ok());
}

TEST_CASE("Sharing: a claim of plain IDs, admitted with one replica per EFA, is bound exclusively",
          "[late-binding][upgrade]") {
  Node node(/*replicas=*/2);
  // One replica of every EFA but group 7's two last is held by ID.
  std::vector<std::string> shared;
  for (int g = 0; g < 8; ++g) {
    for (const auto& efa : node.Group(g)) shared.push_back(efa + "::0");
  }
  shared.resize(30);
  const std::vector<std::string> plain = {"a", "b", "c", "d"};  // admitted before sharing
  const std::vector<std::string> replica = {"a::1", "b::1", "c::1", "d::1"};
  node.WriteCheckpoint({ByIdEntry("old", kEfa, shared, 2), Entry("plain", kEfa, plain),
                        Entry("replica", kEfa, replica)});
  LateBinder binder(node.Options());
  REQUIRE(binder.Recover().ok());
  // Four EFAs no one holds are wanted; two are free.
  CHECK(absl::IsFailedPrecondition(binder.PreStart(node.table(), plain)));
  // A claim of replica IDs shares EFAs with room.
  REQUIRE(binder.PreStart(node.table(), replica).ok());
  CHECK(binder.BoundEfas(replica)->size() == 4);
}

TEST_CASE("Sharing: a container given both replica IDs of an EFA by ID holds it once",
          "[late-binding][upgrade]") {
  Node node(/*replicas=*/2);
  // Admitted best effort with replicas 2: the kubelet gave one container
  // both IDs of each EFA of groups 0-6 (it may: they are distinct IDs). Each
  // of those EFAs has one container on it, room for one more.
  std::vector<std::string> ids;
  for (int g = 0; g < 7; ++g) {
    for (const auto& efa : node.Group(g)) {
      ids.push_back(efa + "::0");
      ids.push_back(efa + "::1");
    }
  }
  const std::vector<std::string> tokens = {"t::0", "t::1", "t::2", "t::3", "t::4", "t::5"};
  node.WriteCheckpoint({ByIdEntry("old", kEfa, ids, 2), Entry("new", kSharedResourceName, tokens)});
  LateBinderOptions options = node.Options();
  options.resource_name = kSharedResourceName;
  LateBinder binder(options);
  REQUIRE(binder.Recover().ok());
  // Six EFAs: group 7's four and two beside the old container, not refused.
  REQUIRE(binder.PreStart(node.table(), tokens).ok());
  CHECK(binder.BoundEfas(tokens)->size() == 6);
}

TEST_CASE(
    "Sharing: an EFA is shared by no more containers than any of its holders was given it for",
    "[late-binding][upgrade]") {
  Node node(/*replicas=*/4);
  // Held by ID under replicas 2 (group 0's EFAs, once each: room for one
  // more under 2, for three under the 4 of now), under 4 (group 1), and by
  // an answer that does not say (group 2: "::0" proves only 1).
  auto ids = [&](int g, int r) {
    std::vector<std::string> out;
    for (const auto& efa : node.Group(g)) out.push_back(efa + "::" + std::to_string(r));
    return out;
  };
  const std::vector<std::string> tokens = {"t::0", "t::1", "t::2", "t::3", "t::4",  "t::5",
                                           "t::6", "t::7", "t::8", "t::9", "t::10", "t::11"};
  node.WriteCheckpoint({ByIdEntry("by-2", kEfa, ids(0, 0), 2),
                        ByIdEntry("also-by-2", kEfa, ids(0, 1), 2),
                        ByIdEntry("by-4", kEfa, ids(1, 0), 4), ByIdEntry("unsaid", kEfa, ids(2, 0)),
                        Entry("new", kEfa, tokens)});
  LateBinder binder(node.Options());
  REQUIRE(binder.Recover().ok());
  // Group 0 has its 2 holders, group 2's holder may be alone: 20 EFAs.
  REQUIRE(binder.PreStart(node.table(), tokens).ok());
  const auto got = *binder.BoundEfas(tokens);
  CHECK(got.size() == 12);
  CHECK(Disjoint(got, node.Group(0)));
  CHECK(Disjoint(got, node.Group(2)));
}

TEST_CASE("Sharing: a binding made under 2 replicas takes no third claim after a restart under 4",
          "[late-binding][upgrade]") {
  Node node(/*replicas=*/2);
  Node four(/*replicas=*/4);  // the same machine, sharing's replicas raised
  auto tokens = [](const std::string& prefix, int n) {
    std::vector<std::string> out;
    for (int r = 0; r < n; ++r) out.push_back(prefix + "::" + std::to_string(r));
    return out;
  };
  {
    LateBinder before(node.Options());
    REQUIRE(before.PreStart(node.table(), tokens("a", 32)).ok());  // every EFA once
  }
  LateBinderOptions options = node.Options();
  options.replicas = 4;
  LateBinder after(options);
  REQUIRE(after.Recover().ok());
  REQUIRE(after.PreStart(four.table(), tokens("b", 32)).ok());  // every EFA twice
  CHECK(absl::IsFailedPrecondition(after.PreStart(four.table(), tokens("c", 1))));
}

TEST_CASE("Without late binding, an EFA held under fewer replicas than now is withheld",
          "[late-binding][upgrade]") {
  Node node(/*replicas=*/4);
  node.WriteCheckpoint({ByIdEntry("by-2", kEfa, {node.Group(0)[0] + "::1"}, 2),
                        ByIdEntry("by-4", kEfa, {node.Group(1)[0] + "::3"}, 4),
                        ByIdEntry("unsaid", kEfa, {node.Group(2)[0] + "::1"}),
                        ByIdEntry("plain", kEfa, {node.Group(3)[0]}, 1)});
  LateBinderOptions options = node.Options();
  options.late_binding = false;
  LateBinder binder(options);
  const auto reserved = binder.Reserved();
  CHECK(reserved.size() == 3);
  CHECK(reserved.count(node.Group(0)[0]) == 1);
  CHECK(reserved.count(node.Group(2)[0]) == 1);
  CHECK(reserved.count(node.Group(3)[0]) == 1);
  CHECK(reserved.at(node.Group(0)[0]) ==
        absl::StrCat("held by pod by-2 as ", kEfa, " device ", node.Group(0)[0],
                     "::1 (an earlier configuration) until its containers end"));
}

TEST_CASE("Two late-bound containers given the same IDs under both names keep apart specs",
          "[late-binding][upgrade]") {
  Node node(/*replicas=*/2);
  // Late-bound under the shared name (renamed); then the rename is undone
  // and the kubelet gives the same strings under vpc.amazonaws.com/efa.
  const std::vector<std::string> ids = {node.Group(0)[0] + "::0", node.Group(0)[1] + "::0"};
  node.WriteCheckpoint({Entry("a", kGpu, {Uuid(kGpus[3])}), Entry("a", kSharedResourceName, ids)});
  LateBinderOptions shared = node.Options();
  shared.resource_name = kSharedResourceName;
  {
    LateBinder before(shared);
    REQUIRE(before.PreStart(node.table(), ids).ok());
  }
  const fs::path spec_a = node.cdi_dir() / CdiSpecFileName(ClaimName(ids, kSharedResourceName));
  const std::string a_before = efa::testing::ReadFile(spec_a);
  REQUIRE_FALSE(a_before.empty());
  node.WriteCheckpoint({Entry("a", kGpu, {Uuid(kGpus[3])}), Entry("a", kSharedResourceName, ids),
                        Entry("b", kGpu, {Uuid(kGpus[6])}), Entry("b", kEfa, ids)});
  LateBinder after(node.Options());
  REQUIRE(after.Recover().ok());
  REQUIRE(after.PreStart(node.table(), ids).ok());
  CHECK(after.Bindings().size() == 2);
  // a's spec is as it was; b's is its own.
  CHECK(efa::testing::ReadFile(spec_a) == a_before);
  CHECK(fs::exists(node.cdi_dir() / CdiSpecFileName(ClaimName(ids))));
}

TEST_CASE("A claim is bound when a container holds the same IDs by ID under the other name",
          "[late-binding][upgrade]") {
  Node node(/*replicas=*/2);
  // Admitted best effort with replicas 2 under the first name; then helm
  // upgrade --set alignment.mode=late-binding,sharing.renameByDefault=true:
  // the kubelet counts each name's IDs apart and gives the same strings to
  // a new container under the new name. Same IDs, another claim name.
  const std::vector<std::string> ids = {node.Group(0)[0] + "::0", node.Group(0)[1] + "::0"};
  node.WriteCheckpoint({ByIdEntry("a-old", kEfa, ids), Entry("b-new", kSharedResourceName, ids)});
  LateBinderOptions options = node.Options();
  options.resource_name = kSharedResourceName;
  LateBinder binder(options);
  REQUIRE(binder.Recover().ok());
  REQUIRE(binder.PreStart(node.table(), ids).ok());
  // Bound, its spec written: not taken for the old container's by-ID hold.
  CHECK(binder.counts().bound == 1);
  CHECK(binder.counts().kept == 0);
  REQUIRE(binder.BoundEfas(ids).has_value());
  CHECK(fs::exists(binder.SpecPath(ClaimName(ids, kSharedResourceName))));
  // The old container still holds one replica of each of its EFAs: a claim
  // wanting every replica of them cannot have them.
  std::vector<std::string> all;
  for (int g = 0; g < 8; ++g) {
    for (const auto& efa : node.Group(g)) all.push_back(efa + "::1");
  }
  node.WriteCheckpoint({ByIdEntry("a-old", kEfa, ids), Entry("b-new", kSharedResourceName, ids),
                        ByIdEntry("c-old", kEfa, all), Entry("d-new", kSharedResourceName, all)});
  REQUIRE(binder.PreStart(node.table(), all).ok());
  REQUIRE(binder.BoundEfas(all).has_value());
  CHECK(Disjoint(*binder.BoundEfas(all), {node.Group(0)[0], node.Group(0)[1]}));
}

TEST_CASE("Without late binding, bindings of an earlier configuration are kept and reserved",
          "[late-binding][upgrade]") {
  Node node;
  // uid-1's IDs name the EFAs bound for it: the kubelet counts them held,
  // so they need no reserving.
  node.WriteCheckpoint({Entry("uid-0", kGpu, {Uuid(kGpus[3])}), Entry("uid-0", kEfa, node.Group(0)),
                        Entry("uid-1", kGpu, {Uuid(kGpus[5])}),
                        Entry("uid-1", kEfa, node.Group(5))});
  {
    LateBinder before(node.Options());
    REQUIRE(before.PreStart(node.table(), node.Group(0)).ok());
    REQUIRE(before.BoundEfas(node.Group(0)) == node.Group(3));
    REQUIRE(before.PreStart(node.table(), node.Group(5)).ok());
    REQUIRE(before.BoundEfas(node.Group(5)) == node.Group(5));
  }
  LateBinderOptions options = node.Options();
  options.late_binding = false;  // helm upgrade --set alignment.mode=best-effort
  LateBinder after(options);
  REQUIRE(after.Recover().ok());
  const auto reserved = after.Reserved();
  CHECK(after.Bindings().size() == 2);
  REQUIRE(reserved.size() == 4);
  for (const auto& efa : node.Group(3)) {
    CHECK(reserved.at(efa) == absl::StrCat("bound by late binding to ", ClaimName(node.Group(0)),
                                           " of pod uid-0 (an earlier configuration) until its "
                                           "containers end"));
  }
  // Its container ends: released, and nothing is reserved any more.
  node.WriteCheckpoint({});
  after.ReleaseGone();
  node.Advance(LateBinderOptions().release_after);
  after.ReleaseGone();
  CHECK(after.Bindings().empty());
  CHECK(after.Reserved().empty());
  CHECK(fs::is_empty(node.cdi_dir()));
}

TEST_CASE("Without late binding, EFAs held by ID under another name or replica count are reserved",
          "[late-binding][upgrade]") {
  Node node;
  std::vector<std::string> shared = {node.Group(1)[0] + "::1", node.Group(1)[1] + "::0"};
  node.WriteCheckpoint(
      {ByIdEntry("same", kEfa, node.Group(0)), ByIdEntry("renamed", kSharedResourceName, shared)});
  LateBinderOptions options = node.Options();
  options.late_binding = false;
  int refreshes = 0;
  options.refresh_checkpoint = [&refreshes] { ++refreshes; };
  options.pod_resources.burst = 100;  // every look asks List
  LateBinder binder(options);
  const auto reserved = binder.Reserved();
  // Group 0 is held under the IDs advertised now: the kubelet counts it.
  CHECK(reserved.size() == 2);
  CHECK(reserved.count(node.Group(1)[0]) == 1);
  CHECK(reserved.count(node.Group(1)[1]) == 1);
  CHECK(refreshes == 0);  // no pod-resources to tell
  // List answers without "renamed": its pod may be deleted, its entries
  // left until the kubelet writes the checkpoint again. Asked once.
  efa::testing::FakeKubelet kubelet(efa::testing::FakeKubelet::ForKubeletDir(node.kubelet_dir()));
  REQUIRE(kubelet.Start().ok());
  CHECK(binder.Reserved() == reserved);
  CHECK(binder.Reserved() == reserved);
  CHECK(refreshes == 1);
  // A checkpoint that cannot be read is no proof the holders are gone.
  std::ofstream(node.kubelet_dir() / "device-plugins/kubelet_internal_checkpoint") << "{\"Data\":";
  CHECK(binder.Reserved() == reserved);
  node.WriteCheckpoint({});
  CHECK(binder.Reserved().empty());
}

TEST_CASE("A binding recovered after a restart keeps its owner: its container's restart keeps it",
          "[late-binding][upgrade]") {
  Node node;
  node.WriteCheckpoint(
      {Entry("uid-0", kGpu, {Uuid(kGpus[4])}), Entry("uid-0", kEfa, node.Group(0))});
  {
    LateBinder before(node.Options());
    REQUIRE(before.PreStart(node.table(), node.Group(0)).ok());
  }
  SECTION("from the record written beside the spec") {}
  SECTION("from the checkpoint, for a spec an older release wrote alone") {
    fs::remove(node.cdi_dir() / ClaimRecordFileName(ClaimName(node.Group(0))));
  }
  LateBinder after(node.Options());
  REQUIRE(after.Recover().ok());
  // The container restarts after the daemon did: same EFAs.
  REQUIRE(after.PreStart(node.table(), node.Group(0)).ok());
  CHECK(after.BoundEfas(node.Group(0)) == node.Group(4));
  CHECK(after.counts().kept == 1);
  CHECK(after.counts().bound == 0);
  // The pod is deleted and the kubelet gives its IDs to a new pod: taken
  // over at once, bound beside the new pod's GPU.
  node.WriteCheckpoint({Entry("uid-1", kGpu, {Uuid(kGpus[6])}),
                        Entry("uid-1", kEfa, {node.Group(0)[0], node.Group(0)[1]})});
  REQUIRE(after.PreStart(node.table(), {node.Group(0)[0], node.Group(0)[1]}).ok());
  CHECK_FALSE(after.BoundEfas(node.Group(0)).has_value());
  CHECK(after.counts().released == 1);
}

TEST_CASE("An init and an app container given the same IDs share one binding placed for both",
          "[late-binding][upgrade]") {
  Node node;
  // The app container reuses the init container's EFAs and GPU 0
  // (devicesToReuse) and has GPU 5 besides; "download" sorts first.
  FakeCheckpointEntry init_gpu = Entry("uid-0", kGpu, {Uuid(kGpus[0])});
  FakeCheckpointEntry init_efa = Entry("uid-0", kEfa, node.Group(0));
  init_gpu.container = init_efa.container = "download";
  FakeCheckpointEntry app_gpu = Entry("uid-0", kGpu, {Uuid(kGpus[0]), Uuid(kGpus[5])});
  FakeCheckpointEntry app_efa = Entry("uid-0", kEfa, node.Group(0));
  app_gpu.container = app_efa.container = "train";
  node.WriteCheckpoint({init_gpu, init_efa, app_gpu, app_efa});
  LateBinder binder(node.Options());
  REQUIRE(binder.PreStart(node.table(), node.Group(0)).ok());  // the init container
  const auto bound = binder.BoundEfas(node.Group(0));
  REQUIRE(bound.has_value());
  CHECK_FALSE(Disjoint(*bound, node.Group(5)));                // placed for the app's GPU too
  REQUIRE(binder.PreStart(node.table(), node.Group(0)).ok());  // the app container
  CHECK(binder.BoundEfas(node.Group(0)) == bound);
  CHECK(binder.counts().kept == 1);
}

TEST_CASE("An app container reusing an init container's IDs reuses its EFAs; the init keeps them",
          "[late-binding][upgrade]") {
  Node node;
  // The kubelet gives the init container's IDs again to the app container
  // (devicesToReuse), which never runs beside it.
  const std::vector<std::string> init_ids = {node.Group(0)[0], node.Group(0)[1]};
  FakeCheckpointEntry init_efa = Entry("uid-0", kEfa, init_ids);
  init_efa.container = "download";
  node.WriteCheckpoint(
      {init_efa, Entry("uid-0", kGpu, {Uuid(kGpus[5])}), Entry("uid-0", kEfa, node.Group(0))});
  LateBinder binder(node.Options());
  REQUIRE(binder.PreStart(node.table(), init_ids).ok());
  const auto init_bound = binder.BoundEfas(init_ids);
  REQUIRE(init_bound.has_value());
  REQUIRE(binder.PreStart(node.table(), node.Group(0)).ok());
  const auto app_bound = binder.BoundEfas(node.Group(0));
  REQUIRE(app_bound.has_value());
  for (const auto& efa : *init_bound) {
    CHECK(std::find(app_bound->begin(), app_bound->end(), efa) != app_bound->end());
  }
  // The init container's next run (its pod's sandbox recreated) finds its
  // spec and EFAs.
  CHECK(binder.BoundEfas(init_ids) == init_bound);
  CHECK(fs::exists(binder.SpecPath(ClaimName(init_ids))));
  CHECK(binder.counts().released == 0);
}

TEST_CASE("Without late binding, a container admitted under it that never started is bound",
          "[late-binding][upgrade]") {
  Node node;
  // Admitted under late binding (an Allocate answer with no device nodes),
  // never started; then helm upgrade --set alignment.mode=best-effort. The
  // kubelet will start it with the CDI device of that answer.
  const std::vector<std::string> held_by_id = {node.Group(2)[0]};
  const std::vector<std::string> crossing = {node.Group(2)[0], node.Group(4)[0]};
  const std::vector<FakeCheckpointEntry> entries = {
      Entry("uid-0", kEfa, node.Group(1)), ByIdEntry("uid-1", kEfa, held_by_id),
      Entry("uid-2", kGpu, {Uuid(kGpus[6])}), Entry("uid-2", kEfa, crossing)};
  node.WriteCheckpoint(entries);
  LateBinderOptions options = node.Options();
  options.late_binding = false;
  LateBinder binder(options);
  binder.BindUnstarted(node.table());  // not before recovery
  CHECK(binder.Bindings().empty());
  REQUIRE(binder.Recover().ok());
  {
    // Nor while an EFA entry of the checkpoint is skipped: it may hold the
    // EFAs a binding would take.
    std::string json = efa::testing::FakeCheckpointJson({Entry("uid-0", kEfa, node.Group(1))});
    const std::string at_entries = "\"PodDeviceEntries\":[";
    const size_t at = json.find(at_entries);
    REQUIRE(at != std::string::npos);
    json.insert(at + at_entries.size(),
                absl::StrCat("{\"PodUID\":\"x\",\"ContainerName\":\"c\",\"ResourceName\":\"", kEfa,
                             "\",\"DeviceIDs\":{\"0\":[\"a\"]},\"AllocResp\":\"%%\"},"));
    std::ofstream(node.kubelet_dir() / "device-plugins/kubelet_internal_checkpoint") << json;
    binder.BindUnstarted(node.table());
    CHECK(binder.Bindings().empty());
  }
  node.WriteCheckpoint(entries);
  binder.BindUnstarted(node.table());
  // The EFAs its IDs name, which the kubelet counts held, when free.
  CHECK(binder.BoundEfas(node.Group(1)) == node.Group(1));
  CHECK(fs::exists(binder.SpecPath(ClaimName(node.Group(1)))));
  // Else only EFAs whose IDs the kubelet holds for live pods: it gives the
  // others by ID meanwhile. Without pod-resources, none: not bound (with
  // pod-resources: late_binding_daemon_test).
  CHECK_FALSE(binder.BoundEfas(crossing).has_value());
  const int failed = binder.counts().failed;
  CHECK(failed >= 1);
  CHECK(binder.counts().bound == 1);
  binder.BindUnstarted(node.table());
  CHECK(binder.counts().bound == 1);
  CHECK(binder.counts().failed == failed);  // logged and counted once
  // Its pod deleted, the binding released: its entries, left in the
  // checkpoint, bind nothing again.
  node.WriteCheckpoint({});
  binder.ReleaseGone();
  node.Advance(LateBinderOptions().release_after);
  binder.ReleaseGone();
  REQUIRE(binder.Bindings().empty());
  node.WriteCheckpoint({Entry("uid-0", kEfa, node.Group(1))});
  binder.BindUnstarted(node.table());
  CHECK(binder.Bindings().empty());
}

TEST_CASE(
    "Without late binding, a never-started claim of IDs not advertised now is not bound to the "
    "EFAs they name",
    "[late-binding][upgrade]") {
  Node node;  // one replica per EFA now
  // Admitted under late binding with sharing (replica IDs), never started;
  // then helm upgrade to alignment off without sharing. The kubelet holds
  // rdmap..::0, but is told of rdmap.. now and gives it by ID to the next
  // pod: binding the claim to it would put two containers on one EFA. Nor
  // under the other name, whose IDs the kubelet counts apart.
  const std::vector<std::string> replica_ids = {node.Group(1)[0] + "::0", node.Group(1)[1] + "::1"};
  node.WriteCheckpoint(
      {Entry("uid-0", kEfa, replica_ids), Entry("uid-1", kSharedResourceName, {node.Group(2)[0]})});
  LateBinderOptions options = node.Options();
  options.late_binding = false;
  LateBinder binder(options);
  REQUIRE(binder.Recover().ok());
  binder.BindUnstarted(node.table());
  CHECK_FALSE(binder.BoundEfas(replica_ids).has_value());
  CHECK(binder.Bindings().empty());
  // The same IDs, advertised now (sharing 2 again): bound to what they name.
  Node node2(2);
  node2.WriteCheckpoint(
      {Entry("uid-0", kEfa, {node2.Group(1)[0] + "::0", node2.Group(1)[1] + "::1"})});
  LateBinderOptions options2 = node2.Options();
  options2.late_binding = false;
  LateBinder binder2(options2);
  REQUIRE(binder2.Recover().ok());
  binder2.BindUnstarted(node2.table());
  CHECK(binder2.BoundEfas({node2.Group(1)[0] + "::0", node2.Group(1)[1] + "::1"}) ==
        std::vector<std::string>{node2.Group(1)[0], node2.Group(1)[1]});
}

TEST_CASE("With late binding, a claim under the name not served that never started is bound",
          "[late-binding][upgrade]") {
  Node node;
  // Admitted while sharing's rename served vpc.amazonaws.com/efa.shared:
  // no PreStartContainer of that name will come.
  const std::vector<std::string> renamed = {node.Group(1)[0] + "::0", node.Group(1)[1] + "::1"};
  node.WriteCheckpoint(
      {Entry("uid-0", kSharedResourceName, renamed), Entry("uid-1", kEfa, node.Group(2))});
  LateBinder binder(node.Options());
  REQUIRE(binder.Recover().ok());
  binder.BindUnstarted(node.table());
  CHECK(binder.BoundEfas(renamed) == std::vector<std::string>{node.Group(1)[0], node.Group(1)[1]});
  // PreStartContainer binds the claims of the name served.
  CHECK_FALSE(binder.BoundEfas(node.Group(2)).has_value());
}

TEST_CASE("Recovery keeps a spec it cannot read and reports the CDI dir not read whole",
          "[late-binding][upgrade]") {
  Node node;
  fs::create_directories(node.cdi_dir());
  std::ofstream(node.cdi_dir() / CdiSpecFileName("claim-a"))
      << CdiSpecJson("claim-a", {node.table().devices[0]});
  // A read error (EISDIR here; EIO or EMFILE on a node) is no proof the
  // binding is gone.
  const fs::path unreadable = node.cdi_dir() / CdiSpecFileName("claim-b");
  fs::create_directories(unreadable);
  LateBinder binder(node.Options());
  const absl::Status status = binder.Recover();
  CHECK(status.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_FALSE(binder.recovered());
  CHECK(fs::exists(unreadable));
  CHECK(binder.counts().recover_incomplete == 1);
  CHECK(binder.Bindings().count("claim-a") == 1);
  fs::remove(unreadable);
  REQUIRE(binder.Recover().ok());
  CHECK(binder.recovered());
  CHECK(binder.counts().recovered == 1);
}

TEST_CASE("Recovery of a CDI dir it cannot list decides nothing", "[late-binding][upgrade]") {
  Node node;
  // A link to itself: opendir fails with ELOOP, as it may with EIO or EMFILE.
  fs::create_directory_symlink(node.cdi_dir(), node.cdi_dir());
  LateBinder binder(node.Options());
  const absl::Status status = binder.Recover();
  CHECK(status.message() == absl::StrCat("cannot list ", node.cdi_dir().string(),
                                         ": Too many levels of symbolic links"));
  CHECK_FALSE(binder.recovered());
  // No directory at all holds no binding: a whole answer.
  fs::remove(node.cdi_dir());
  CHECK(binder.Recover().ok());
  CHECK(binder.recovered());
}

TEST_CASE("A binding a newer release wrote is kept and its EFAs counted as held",
          "[late-binding][upgrade]") {
  Node node;
  fs::create_directories(node.cdi_dir());
  // A later spec format this release cannot parse, and a record of a later
  // version naming its EFAs.
  std::ofstream(node.cdi_dir() / CdiSpecFileName("claim-next")) << R"({"cdiVersion":"9.0.0"})";
  const nlohmann::json record = {{"version", kClaimRecordVersion + 1},
                                 {"claim", "claim-next"},
                                 {"efas", node.Group(7)},
                                 {"somethingNew", true}};
  std::ofstream(node.cdi_dir() / ClaimRecordFileName("claim-next")) << record.dump();
  node.WriteCheckpoint({Entry("uid-n", kEfa, {"next-0"}), Entry("uid-0", kGpu, {Uuid(kGpus[7])}),
                        Entry("uid-0", kEfa, node.Group(0))});
  LateBinder binder(node.Options());
  REQUIRE(binder.Recover().ok());
  CHECK(binder.Bindings().at("claim-next") == node.Group(7));
  REQUIRE(binder.PreStart(node.table(), node.Group(0)).ok());
  CHECK(Disjoint(*binder.BoundEfas(node.Group(0)), node.Group(7)));
  CHECK(fs::exists(node.cdi_dir() / CdiSpecFileName("claim-next")));
  const nlohmann::json kept =
      nlohmann::json::parse(std::ifstream(node.cdi_dir() / ClaimRecordFileName("claim-next")));
  CHECK(kept == record);
}

TEST_CASE("A claim's record holds what recovering it needs", "[late-binding][upgrade]") {
  const ClaimRecord record{.owner = "uid-0",
                           .kubelet_ids = {"efa_1", "efa_0"},
                           .resource = kResourceName,
                           .replicas = 1,
                           .efas = {"rdmap16s27"}};
  const std::string json = ClaimRecordJson("claim-x", record);
  CHECK(json == R"({"version":1,"claim":"claim-x","mode":"late-binding","owner":"uid-0",)"
                R"("kubeletIds":["efa_1","efa_0"],"resource":"vpc.amazonaws.com/efa","replicas":1,)"
                R"("efas":["rdmap16s27"]})"
                "\n");
  auto parsed = ParseClaimRecord(json, "claim-x", "r.state");
  REQUIRE(parsed.ok());
  CHECK(parsed->owner == "uid-0");
  CHECK(parsed->kubelet_ids == record.kubelet_ids);
  CHECK(ParseClaimRecord(json, "claim-y", "r.state").status().message() ==
        "r.state: claim: expected \"claim-y\"");
  CHECK(ParseClaimRecord("[]", "claim-x", "r.state").status().message() ==
        "r.state: expected a JSON object");
}
