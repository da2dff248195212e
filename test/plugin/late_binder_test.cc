// LateBinder on its own: a simulated p5 with a hand-written kubelet
// checkpoint, PreStartContainer called directly (concurrently too).
#include "plugin/late_binder.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "plugin/cdi_spec.h"
#include "test/plugin/guard_fakes.h"
#include "test/sim/machine_spec.h"
#include "test/sim/sim_root.h"
#include "topology/efa_discovery.h"
#include "topology/hwloc_loader.h"

namespace fs = std::filesystem;
using namespace efa::plugin;
using efa::testing::FakeCheckpointEntry;

namespace {

constexpr char kGpu[] = "nvidia.com/gpu";
constexpr char kEfa[] = "vpc.amazonaws.com/efa";
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
  Node() : sim_("p5.48xlarge") {
    auto inventory = efa::topology::DiscoverEfaDevices(sim_.roots());
    auto topo = efa::topology::LoadTopology({sim_.path().string(), ""});
    REQUIRE(topo.ok());
    table_ = std::make_shared<efa::topology::DeviceTable>(
        inventory.devices, efa::topology::HostModel::FromHwloc(inventory, topo->get()));
    for (const auto& d : inventory.devices) efas_.push_back(d.ibdev);
    fs::create_directories(kubelet_dir() / "device-plugins");
  }

  LateBinderOptions Options() const {
    LateBinderOptions o;
    o.cdi_dir = cdi_dir();
    o.kubelet_dir = kubelet_dir();  // no pod-resources socket there
    o.proc_root = sim_.path() / "proc";
    return o;
  }
  void WriteCheckpoint(const std::vector<FakeCheckpointEntry>& entries) const {
    std::ofstream(kubelet_dir() / "device-plugins/kubelet_internal_checkpoint")
        << efa::testing::FakeCheckpointJson(entries);
  }
  // The EFAs of GPU group `g` (0-7): the 4 behind its switch.
  std::vector<std::string> Group(int g) const {
    return {efas_.begin() + 4 * g, efas_.begin() + 4 * g + 4};
  }

  fs::path cdi_dir() const { return sim_.path() / "cdi"; }
  fs::path kubelet_dir() const { return sim_.path() / "kubelet"; }
  const efa::topology::DeviceTable& table() const { return *table_; }

 private:
  efa::sim::SimRoot sim_;
  std::shared_ptr<efa::topology::DeviceTable> table_;
  std::vector<std::string> efas_;  // PCI order
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
  int files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(node.cdi_dir())) ++files;
  CHECK(files == 8);
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
  small.push_back(big.back());  // the kubelet would never do this; a lost binding might
  small.push_back(big[big.size() - 2]);
  node.WriteCheckpoint({Entry("big", kEfa, big), Entry("small", kEfa, small)});
  REQUIRE(binder.PreStart(node.table(), big).ok());
  absl::Status status = binder.PreStart(node.table(), small);
  CHECK(status.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(status.message() ==
        absl::StrCat("cannot bind ", ClaimName(small), " (kubelet devices \"", small[0], "\", \"",
                     small[1], "\", \"", small[2], "\", \"", small[3],
                     "\"): 4 EFAs wanted, 2 healthy and free (30 bound to other containers)"));
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
  CHECK(binder.Recover() == 2);
  auto bindings = binder.Bindings();
  CHECK(bindings.at("claim-a") == std::vector<std::string>{a[0].ibdev, a[1].ibdev});
  CHECK(bindings.at("claim-b") == std::vector<std::string>{b[0].ibdev, b[1].ibdev});
  // Neither is in the (empty) checkpoint: both go, with their files.
  node.WriteCheckpoint({});
  binder.ReleaseGone();
  CHECK(binder.Bindings().empty());
  CHECK(binder.counts().released == 2);
  CHECK(fs::is_empty(node.cdi_dir()));
}
