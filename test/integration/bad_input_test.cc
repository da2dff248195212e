// The bad-input catalogue: what the daemon does with every kind of
// bad outside input, one case each. Every case asserts the exact message (or
// the exact degraded result) and that nothing else changed: the kubelet's
// device list, the daemon's advertised list and a later valid request for
// the gRPC cases; the rest of the inventory for sysfs; the other GPUs or
// processes for procfs.
//
// Inputs: configuration files and variables; Allocate,
// GetPreferredAllocation and PreStartContainer over real gRPC to the running
// daemon (through the fake kubelet); a broken simulated sysfs; the kubelet
// checkpoint; the NVIDIA driver's and the NVIDIA device plugin's /proc files.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "plugin/config.h"
#include "plugin/daemon.h"
#include "plugin/guards/mofed_guard.h"
#include "plugin/guards/nvidia_plugin_process.h"
#include "plugin/kubelet/kubelet_checkpoint.h"
#include "test/fake_kubelet/fake_kubelet.h"
#include "test/plugin/guard_fakes.h"
#include "test/sim/sim_root.h"
#include "test/support/devices.h"
#include "test/support/test_node.h"
#include "topology/efa_discovery.h"
#include "topology/nvidia_gpus.h"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using namespace efa::plugin;
using efa::sim::SimRoot;
using efa::testing::FakeKubelet;
using efa::testing::FakeProc;
using efa::testing::TempDir;
using efa::testing::TestNode;
using efa::topology::EfaDevice;
using efa::topology::Inventory;

namespace {

using efa::testing::kDeadline;
using efa::testing::kEfa;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

void WriteFile(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// ---- The running daemon -----------------------------------------------------

// A simulated p4d.24xlarge (EFAs rdmap16s27, rdmap32s27, rdmap144s27,
// rdmap160s27) served by the daemon on a thread to a fake kubelet, which
// forwards each request over the daemon's real gRPC socket; registered and
// all Healthy once built.
class ServedNode : public TestNode {
 public:
  // `fake_clock`: the daemon reads clock() (TestNode::Pass moves it).
  explicit ServedNode(bool fake_clock = false)
      : TestNode({.machine = "p4d.24xlarge", .fake_clock = fake_clock, .wait_serving = true}) {
    REQUIRE(WaitAll("Healthy"));
  }

  // The devices as the kubelet got them ("id health numa").
  std::vector<std::string> KubeletDevices() const {
    std::vector<std::string> out;
    for (const v1beta1::Device& d : kubelet().devices(kEfa)) {
      out.push_back(absl::StrCat(
          d.id(), " ", d.health(), " ",
          d.topology().nodes_size() > 0 ? absl::StrCat(d.topology().nodes(0).id()) : "-"));
    }
    return out;
  }
  // What the kubelet and the daemon hold, equal before and after a bad
  // request: the kubelet's list and how many ListAndWatch messages it got,
  // the registrations it accepted and the daemon's advertised list.
  std::string State() const {
    return absl::StrCat("kubelet: ", absl::StrJoin(KubeletDevices(), ", "),
                        "; messages: ", kubelet().list_and_watch_messages(kEfa),
                        "; registrations: ", kubelet().registrations(kEfa),
                        "; advertised: ", daemon().advertised().ShortDebugString());
  }

  grpc::Status Allocate(const std::vector<std::vector<std::string>>& containers,
                        v1beta1::AllocateResponse* response) {
    v1beta1::AllocateRequest request;
    for (const auto& ids : containers) {
      auto* c = request.add_container_requests();
      for (const auto& id : ids) c->add_devices_ids(id);
    }
    return kubelet().Allocate(kEfa, request, response);
  }
  grpc::Status Allocate(const std::vector<std::vector<std::string>>& containers) {
    v1beta1::AllocateResponse response;
    grpc::Status status = Allocate(containers, &response);
    // A refused request gets no answer at all: nothing is half-allocated.
    if (!status.ok()) CHECK(response.container_responses_size() == 0);
    return status;
  }
  // GetPreferredAllocation for one container; it must succeed.
  std::vector<std::string> Preferred(const std::vector<std::string>& available,
                                     const std::vector<std::string>& must, int size) {
    v1beta1::PreferredAllocationRequest request;
    auto* c = request.add_container_requests();
    for (const auto& id : available) c->add_available_deviceids(id);
    for (const auto& id : must) c->add_must_include_deviceids(id);
    c->set_allocation_size(size);
    v1beta1::PreferredAllocationResponse response;
    grpc::Status status = kubelet().GetPreferredAllocation(kEfa, request, &response);
    REQUIRE(status.error_message() == "");
    REQUIRE(status.ok());
    REQUIRE(response.container_responses_size() == 1);
    const auto& ids = response.container_responses(0).deviceids();
    return {ids.begin(), ids.end()};
  }
  grpc::Status PreStart(const std::vector<std::string>& ids) {
    v1beta1::PreStartContainerRequest request;
    for (const auto& id : ids) request.add_devices_ids(id);
    v1beta1::PreStartContainerResponse response;
    return kubelet().PreStartContainer(kEfa, request, &response);
  }

  // A valid Allocate still gets exactly its device.
  void CheckStillAllocates() {
    v1beta1::AllocateResponse response;
    REQUIRE(Allocate({{"rdmap144s27"}}, &response).ok());
    REQUIRE(response.container_responses_size() == 1);
    CHECK(response.container_responses(0).envs().at("EFA_DEVICES") == "rdmap144s27");
    CHECK(response.container_responses(0).devices(0).container_path() == "/dev/infiniband/uverbs2");
  }
};

// Runs a refused Allocate and checks its code, its exact message and that
// the daemon is as it was and still allocates.
void CheckRefused(ServedNode& node, const std::vector<std::vector<std::string>>& containers,
                  grpc::StatusCode code, const std::string& message) {
  const std::string before = node.State();
  grpc::Status status = node.Allocate(containers);
  CHECK(status.error_code() == code);
  CHECK(status.error_message() == message);
  CHECK(node.State() == before);
  node.CheckStillAllocates();
  CHECK(node.State() == before);
}

// ---- sysfs -----------------------------------------------------------------

// Every field of a device that discovery fills.
std::string Describe(const EfaDevice& d) {
  return absl::StrCat(d.ibdev, " ", d.uverbs, " ", d.uverbs_path, " ", d.major, ":", d.minor, " ",
                      d.pci.ToString(), " numa", d.numa_node ? absl::StrCat(*d.numa_node) : "?",
                      " ", d.root_complex, " ", d.node_guid, " [", d.health_problem, "]");
}
std::vector<std::string> Describe(const Inventory& inv, const std::string& except = "") {
  std::vector<std::string> out;
  for (const EfaDevice& d : inv.devices) {
    if (d.ibdev != except) out.push_back(Describe(d));
  }
  return out;
}

// A p4d.24xlarge whose rdmap32s27 is broken by the test; the other three
// EFAs must come out of discovery exactly as before.
struct BrokenSysfs {
  BrokenSysfs() : baseline(Describe(efa::topology::DiscoverEfaDevices(sim.roots()), kVictim)) {}

  static constexpr char kVictim[] = "rdmap32s27";
  fs::path cls() const { return sim.sys() / "class/infiniband"; }
  fs::path device() const { return cls() / kVictim / "device"; }

  // Discovery skips the victim for `reason` and finds the rest unchanged.
  void CheckSkipped(const std::string& reason) const {
    Inventory inv = efa::topology::DiscoverEfaDevices(sim.roots());
    CHECK(Describe(inv) == baseline);
    REQUIRE(inv.skipped.size() == 1);
    CHECK(inv.skipped[0].ibdev == kVictim);
    CHECK(inv.skipped[0].reason == reason);
    CHECK(inv.skipped[0].malformed);
  }

  SimRoot sim{"p4d.24xlarge"};
  std::vector<std::string> baseline;
};

}  // namespace

// =============================================================================
// Configuration files and variables
// =============================================================================

TEST_CASE("A tab in the configuration file's indentation is refused at its line and column",
          "[bad-input]") {
  auto c = ParseConfigYaml("version: v1\nlogLevel: info\n\tlogFormat: json\n", "config.yaml");
  REQUIRE_FALSE(c.ok());
  CHECK(Message(c.status()) ==
        "config.yaml:3:1: invalid YAML: illegal tab when looking for indentation");
}

TEST_CASE("A configuration file that is not text is refused, not read as options", "[bad-input]") {
  const std::string bytes(
      "\x7f"
      "ELF\x02\x01\x01\x00\x00\x00\x00\x00",
      12);
  auto c = ParseConfigYaml(bytes, "config.yaml");
  REQUIRE_FALSE(c.ok());
  CHECK(Message(c.status()) == "config.yaml:1:10: invalid YAML: unknown escape character: \\x00");
}

TEST_CASE("A second YAML document in the configuration file is refused", "[bad-input]") {
  auto c = ParseConfigYaml("version: v1\n---\nlogLevel: debug\n", "config.yaml");
  REQUIRE_FALSE(c.ok());
  CHECK(Message(c.status()) == "config.yaml:2:1: expected one YAML document, got a second");
}

TEST_CASE("Garbage that yaml-cpp's LoadAll loops on is refused at once", "[bad-input]") {
  // Found by the config_yaml fuzzer (corpus/config_yaml/regression-loadall-hang.yaml).
  auto c = ParseConfigYaml(",:", "config.yaml");
  REQUIRE_FALSE(c.ok());
  CHECK(Message(c.status()) ==
        "config.yaml:1:1: expected a mapping of options starting with version: v1, got an "
        "empty file");
}

TEST_CASE("Deeply nested YAML in the configuration file is refused without a crash",
          "[bad-input]") {
  const std::string yaml = "version: v1\ngpuResources: " + std::string(100000, '[') + "\n";
  auto c = ParseConfigYaml(yaml, "config.yaml");
  REQUIRE_FALSE(c.ok());
  CHECK(Message(c.status()) == "config.yaml:3:1: invalid YAML: nested too deeply");
}

TEST_CASE("A huge bad value in the configuration file is shown shortened", "[bad-input]") {
  auto c =
      ParseConfigYaml("version: v1\nlogLevel: " + std::string(1 << 20, 'x') + "\n", "config.yaml");
  REQUIRE_FALSE(c.ok());
  CHECK(Message(c.status()) ==
        "config.yaml:2:11: logLevel: expected one of trace, debug, info, "
        "warn, error, got \"" +
            std::string(64, 'x') + "...\"");
}

TEST_CASE("Numbers out of range and negative durations in the configuration file are refused",
          "[bad-input]") {
  struct Case {
    std::string yaml;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"version: v1\nexpectedEfaCount: 99999999999999999999\n",
       "config.yaml:2:19: expectedEfaCount: expected an integer from 0 to 1024, got "
       "\"99999999999999999999\""},
      {"version: v1\nneuroncoresPerDevice: 0x10\n",
       "config.yaml:2:23: neuroncoresPerDevice: expected an integer from 0 to 64, got \"0x10\""},
      {"version: v1\nrescanInterval: -5s\n",
       "config.yaml:2:17: rescanInterval: expected a duration from 100ms to 1h, got \"-5s\""},
      {"version: v1\nrescanInterval: inf\n",
       "config.yaml:2:17: rescanInterval: expected a duration from 100ms to 1h, got \"inf\""},
  };
  for (const Case& c : cases) {
    INFO(c.yaml);
    auto parsed = ParseConfigYaml(c.yaml, "config.yaml");
    REQUIRE_FALSE(parsed.ok());
    CHECK(Message(parsed.status()) == c.message);
  }
}

TEST_CASE("Control characters and UTF-8 in configuration values are shown escaped", "[bad-input]") {
  auto c = ParseConfigYaml("version: v1\nlogFormat: \"json\\n\\x1b[31m\"\n", "config.yaml");
  REQUIRE_FALSE(c.ok());
  CHECK(Message(c.status()) ==
        "config.yaml:2:12: logFormat: expected one of text, json, got \"json\\x0a\\x1b[31m\"");
  auto utf8 = ParseConfigYaml("version: v1\nalignment: \xc3\xa9t\xc3\xa9\n", "config.yaml");
  REQUIRE_FALSE(utf8.ok());
  CHECK(Message(utf8.status()) ==
        "config.yaml:2:12: alignment: expected one of best-effort, late-binding, off, got "
        "\"\xc3\xa9t\xc3\xa9\"");
}

TEST_CASE("A configuration file that is a directory or a link loop is refused naming it",
          "[bad-input]") {
  TempDir dir;
  fs::create_directory(dir.path() / "config.yaml");
  fs::create_symlink("loop.yaml", dir.path() / "loop.yaml");
  CHECK(Message(ReadConfigFile(dir.path() / "config.yaml").status()) ==
        (dir.path() / "config.yaml").string() + ": Is a directory");
  CHECK(Message(ReadConfigFile(dir.path() / "loop.yaml").status()) ==
        (dir.path() / "loop.yaml").string() + ": Too many levels of symbolic links");
}

TEST_CASE("Environment variables with odd bytes are refused naming the variable", "[bad-input]") {
  struct Case {
    std::string name, value, message;
  };
  const std::vector<Case> cases = {
      {"EFA_RESCAN_INTERVAL", "10s\n",
       "EFA_RESCAN_INTERVAL: expected a duration like \"10s\", got \"10s\\x0a\""},
      {"EFA_EXPECTED_EFA_COUNT", " 8",
       "EFA_EXPECTED_EFA_COUNT: expected an integer from 0 to 1024, got \" 8\""},
      {"EFA_REPORT_NUMA", "on", "EFA_REPORT_NUMA: expected true or false, got \"on\""},
      {"EFA_GPU_RESOURCES", "nvidia.com/gpu,nvidia.com/gpu/extra",
       "EFA_GPU_RESOURCES: expected a resource name like \"nvidia.com/gpu\", got "
       "\"nvidia.com/gpu/extra\""},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    auto parsed = ConfigFromEnvironment([&](const std::string& name) -> std::optional<std::string> {
      if (name == c.name) return c.value;
      return std::nullopt;
    });
    REQUIRE_FALSE(parsed.ok());
    CHECK(Message(parsed.status()) == c.message);
  }
}

// =============================================================================
// Allocate, GetPreferredAllocation and PreStartContainer over gRPC
// =============================================================================

TEST_CASE("Allocate of an unknown device is refused naming it, and changes nothing",
          "[bad-input][concurrency]") {
  ServedNode node;
  CheckRefused(node, {{"rdmap0s0"}}, grpc::StatusCode::INVALID_ARGUMENT,
               "unknown device \"rdmap0s0\": not an EFA of this node");
  // A uverbs name or a PCI address is no device ID either.
  CheckRefused(node, {{"uverbs2"}}, grpc::StatusCode::INVALID_ARGUMENT,
               "unknown device \"uverbs2\": not an EFA of this node");
  CheckRefused(node, {{"0000:90:1b.0"}}, grpc::StatusCode::INVALID_ARGUMENT,
               "unknown device \"0000:90:1b.0\": not an EFA of this node");
}

TEST_CASE("Allocate of a device named twice in one container is refused",
          "[bad-input][concurrency]") {
  ServedNode node;
  CheckRefused(node, {{"rdmap16s27", "rdmap32s27", "rdmap16s27"}},
               grpc::StatusCode::INVALID_ARGUMENT, "device \"rdmap16s27\" requested twice");
}

TEST_CASE("Allocate of an empty container request is refused", "[bad-input][concurrency]") {
  ServedNode node;
  CheckRefused(node, {{"rdmap16s27"}, {}}, grpc::StatusCode::INVALID_ARGUMENT,
               "the container request names no devices");
}

TEST_CASE("Allocate with no container requests answers nothing, successfully",
          "[bad-input][concurrency]") {
  ServedNode node;
  const std::string before = node.State();
  v1beta1::AllocateResponse response;
  CHECK(node.Allocate({}, &response).ok());
  CHECK(response.container_responses_size() == 0);
  CHECK(node.State() == before);
  node.CheckStillAllocates();
}

TEST_CASE("Allocate of the same device for two containers of one request is refused",
          "[bad-input][concurrency]") {
  // One EFA must never reach two containers, whatever the kubelet sends.
  ServedNode node;
  CheckRefused(node, {{"rdmap16s27"}, {"rdmap32s27", "rdmap16s27"}},
               grpc::StatusCode::INVALID_ARGUMENT,
               "device \"rdmap16s27\" requested twice (by two containers)");
  // Distinct devices in two containers are answered.
  v1beta1::AllocateResponse response;
  REQUIRE(node.Allocate({{"rdmap16s27"}, {"rdmap32s27"}}, &response).ok());
  REQUIRE(response.container_responses_size() == 2);
  CHECK(response.container_responses(1).envs().at("EFA_DEVICES") == "rdmap32s27");
}

TEST_CASE("Allocate of thousands of IDs is refused at the first bad one",
          "[bad-input][concurrency]") {
  ServedNode node;
  std::vector<std::string> unknown = {"rdmap16s27", "rdmap32s27"};
  for (int i = 0; i < 5000; ++i) unknown.push_back(absl::StrCat("efa", i));
  CheckRefused(node, {unknown}, grpc::StatusCode::INVALID_ARGUMENT,
               "unknown device \"efa0\": not an EFA of this node");
  std::vector<std::string> repeated(5000, "rdmap160s27");
  CheckRefused(node, {repeated}, grpc::StatusCode::INVALID_ARGUMENT,
               "device \"rdmap160s27\" requested twice");
  std::vector<std::vector<std::string>> containers(3000, {"rdmap16s27"});
  CheckRefused(node, containers, grpc::StatusCode::INVALID_ARGUMENT,
               "device \"rdmap16s27\" requested twice (by two containers)");
  containers = {{"rdmap16s27"}, {"rdmap32s27", "nope"}};
  CheckRefused(node, containers, grpc::StatusCode::INVALID_ARGUMENT,
               "unknown device \"nope\": not an EFA of this node");
}

TEST_CASE("Allocate shows NUL, newline, escape and UTF-8 bytes of an ID escaped",
          "[bad-input][concurrency]") {
  ServedNode node;
  CheckRefused(node, {{std::string("rdmap16s27\0x", 12)}}, grpc::StatusCode::INVALID_ARGUMENT,
               "unknown device \"rdmap16s27\\x00x\": not an EFA of this node");
  CheckRefused(node, {{"rdmap16s27\nrdmap32s27"}}, grpc::StatusCode::INVALID_ARGUMENT,
               "unknown device \"rdmap16s27\\nrdmap32s27\": not an EFA of this node");
  CheckRefused(node, {{"\x1b[2Jrdmap16s27"}}, grpc::StatusCode::INVALID_ARGUMENT,
               "unknown device \"\\x1b[2Jrdmap16s27\": not an EFA of this node");
  CheckRefused(node, {{"rdmap16s27\xc3\xa9"}}, grpc::StatusCode::INVALID_ARGUMENT,
               "unknown device \"rdmap16s27\\xc3\\xa9\": not an EFA of this node");
  CheckRefused(node, {{"\"rdmap16s27\""}}, grpc::StatusCode::INVALID_ARGUMENT,
               "unknown device \"\\\"rdmap16s27\\\"\": not an EFA of this node");
}

TEST_CASE("Allocate shows only the start of a very long ID", "[bad-input][concurrency]") {
  ServedNode node;
  CheckRefused(node, {{std::string(100000, 'r')}}, grpc::StatusCode::INVALID_ARGUMENT,
               "unknown device \"" + std::string(64, 'r') + "...\": not an EFA of this node");
}

TEST_CASE("An Allocate request over gRPC's size limit is refused by gRPC, the daemon unharmed",
          "[bad-input][concurrency]") {
  ServedNode node;
  const std::string before = node.State();
  v1beta1::AllocateRequest request;
  request.add_container_requests()->add_devices_ids(std::string(5 << 20, 'x'));
  v1beta1::AllocateResponse response;
  grpc::Status status = node.kubelet().Allocate(kEfa, request, &response);
  CHECK(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(status.error_message() == absl::StrFormat("Received message larger than max (%d vs. %d)",
                                                  request.ByteSizeLong(), 4 << 20));
  CHECK(node.State() == before);
  node.CheckStillAllocates();
}

TEST_CASE("GetPreferredAllocation ignores unknown and odd IDs and never fails",
          "[bad-input][concurrency]") {
  ServedNode node;
  const std::string before = node.State();
  CHECK(
      node.Preferred({"bogus", std::string("rdmap16s27\0", 11), "rdmap32s27\n", "\xc3\xa9"}, {}, 2)
          .empty());
  CHECK(node.Preferred({"bogus", "rdmap144s27", std::string(100000, 'r'), "rdmap144s27"}, {}, 2) ==
        std::vector<std::string>{"rdmap144s27"});
  CHECK(node.State() == before);
  node.CheckStillAllocates();
}

TEST_CASE("An ID that is not UTF-8 is refused by protobuf before the daemon sees it",
          "[bad-input][concurrency]") {
  // proto3 strings are UTF-8: the kubelet (Go) cannot even send this one.
  ServedNode node;
  const std::string before = node.State();
  v1beta1::PreferredAllocationRequest request;
  request.add_container_requests()->add_available_deviceids("rdmap16s27\xff");
  v1beta1::PreferredAllocationResponse response;
  grpc::Status status = node.kubelet().GetPreferredAllocation(kEfa, request, &response);
  CHECK(status.error_code() == grpc::StatusCode::UNIMPLEMENTED);  // gRPC's code for it
  CHECK(status.error_message() == "");
  CHECK(node.State() == before);
  node.CheckStillAllocates();
}

TEST_CASE("GetPreferredAllocation keeps must-include IDs even when unknown",
          "[bad-input][concurrency]") {
  // The kubelet's must-include IDs are a subset of its available ones and
  // it intersects the answer with them; the policy returns them as given.
  ServedNode node;
  const std::string before = node.State();
  CHECK(node.Preferred({"rdmap16s27", "rdmap32s27"}, {"ghost"}, 2) ==
        std::vector<std::string>{"rdmap16s27", "ghost"});
  CHECK(node.State() == before);
}

TEST_CASE("GetPreferredAllocation of a negative, zero or huge size never fails",
          "[bad-input][concurrency]") {
  ServedNode node;
  const std::string before = node.State();
  const std::vector<std::string> all = {"rdmap16s27", "rdmap32s27", "rdmap144s27", "rdmap160s27"};
  CHECK(node.Preferred(all, {}, -5).empty());
  CHECK(node.Preferred(all, {}, 0).empty());
  CHECK(node.Preferred(all, {"rdmap160s27"}, -1) == std::vector<std::string>{"rdmap160s27"});
  CHECK(node.Preferred(all, {}, 2147483647) == all);
  CHECK(node.State() == before);
  node.CheckStillAllocates();
}

TEST_CASE("GetPreferredAllocation of thousands of available IDs answers from the known ones",
          "[bad-input][concurrency]") {
  ServedNode node;
  const std::string before = node.State();
  std::vector<std::string> available;
  for (int i = 0; i < 10000; ++i) available.push_back(absl::StrCat("rdmap", i, "s0"));
  available.push_back("rdmap160s27");
  for (int i = 0; i < 1000; ++i) available.push_back("rdmap144s27");
  CHECK(node.Preferred(available, {}, 3) == std::vector<std::string>{"rdmap144s27", "rdmap160s27"});
  CHECK(node.State() == before);
}

TEST_CASE("GetPreferredAllocation with no container requests answers none",
          "[bad-input][concurrency]") {
  ServedNode node;
  v1beta1::PreferredAllocationRequest request;
  v1beta1::PreferredAllocationResponse response;
  CHECK(node.kubelet().GetPreferredAllocation(kEfa, request, &response).ok());
  CHECK(response.container_responses_size() == 0);
}

TEST_CASE("PreStartContainer answers OK whatever the IDs, changing nothing",
          "[bad-input][concurrency]") {
  ServedNode node;
  const std::string before = node.State();
  CHECK(node.PreStart({}).ok());
  CHECK(node.PreStart({"bogus", std::string("a\0b", 3), std::string(100000, 'r')}).ok());
  CHECK(node.PreStart({"rdmap16s27", "rdmap16s27"}).ok());
  CHECK(node.State() == before);
  node.CheckStillAllocates();
}

// =============================================================================
// sysfs
// =============================================================================

TEST_CASE("A device link that points to itself skips that device only", "[bad-input]") {
  BrokenSysfs s;
  fs::remove(s.device());
  fs::create_symlink("device", s.device());
  s.CheckSkipped(s.device().string() + ": Too many levels of symbolic links");
}

TEST_CASE("A cycle of two links skips that device only", "[bad-input]") {
  BrokenSysfs s;
  fs::remove(s.device());
  fs::create_symlink("other", s.device());
  fs::create_symlink("device", s.device().parent_path() / "other");
  s.CheckSkipped(s.device().string() + ": Too many levels of symbolic links");
}

TEST_CASE("A class entry that links to itself skips that device only", "[bad-input]") {
  BrokenSysfs s;
  const fs::path entry = s.cls() / BrokenSysfs::kVictim;
  fs::remove(entry);
  fs::create_symlink(BrokenSysfs::kVictim, entry);
  s.CheckSkipped(s.device().string() + ": Too many levels of symbolic links");
}

TEST_CASE("A looping infiniband class directory is reported and leaves discovery incomplete",
          "[bad-input]") {
  SimRoot sim("p4d.24xlarge");
  const fs::path cls = sim.sys() / "class/infiniband";
  fs::remove_all(cls);
  fs::create_symlink("infiniband", cls);
  Inventory inv = efa::topology::DiscoverEfaDevices(sim.roots());
  CHECK(inv.devices.empty());
  CHECK(inv.skipped.empty());
  // Not a node without EFA: a listing that fails otherwise than with
  // ENOENT tells nothing about what is there.
  CHECK_FALSE(inv.listed);
  REQUIRE(inv.errors.size() == 1);
  CHECK(inv.errors[0].message == "listing " + cls.string() + ": Too many levels of symbolic links");
}

TEST_CASE("A looping uverbs entry leaves its EFA without a uverbs device", "[bad-input]") {
  BrokenSysfs s;
  const fs::path uverbs = s.sim.sys() / "class/infiniband_verbs/uverbs1";
  fs::remove(uverbs);
  fs::create_symlink("uverbs1", uverbs);
  s.CheckSkipped((s.sim.sys() / "class/infiniband_verbs").string() +
                 ": no uverbs device names rdmap32s27");
}

TEST_CASE("A looping driver link makes the EFA unhealthy, naming the loop", "[bad-input]") {
  BrokenSysfs s;
  const fs::path driver = s.device() / "driver";
  fs::remove(driver);
  fs::create_symlink("driver", driver);
  Inventory inv = efa::topology::DiscoverEfaDevices(s.sim.roots());
  CHECK(Describe(inv, BrokenSysfs::kVictim) == s.baseline);
  REQUIRE(inv.devices.size() == 4);
  CHECK(inv.devices[1].ibdev == BrokenSysfs::kVictim);
  CHECK(inv.devices[1].health_problem == driver.string() + ": Too many levels of symbolic links");
}

TEST_CASE("Empty, overflowing, NUL-filled and directory attributes skip that device only",
          "[bad-input]") {
  struct Case {
    std::string attribute;
    std::string content;
    std::string message;  // after "<path>: "
  };
  const std::vector<Case> cases = {
      {"vendor", "", "expected a hexadecimal number, got \"\""},
      {"vendor", "0x1d0f1d0f1d0f\n", "expected a hexadecimal number, got \"0x1d0f1d0f1d0f\""},
      {"device", "0xefa1 0xefa2\n", "expected a hexadecimal number, got \"0xefa1 0xefa2\""},
      {"numa_node", std::string("0\0\0\0", 4), "expected an integer, got \"0\\x00\\x00\\x00\""},
      {"numa_node", "99999999999999999999\n", "expected an integer, got \"99999999999999999999\""},
      {"numa_node", "+1\n", "expected an integer, got \"+1\""},
      {"numa_node", std::string(70000, '1'), "larger than 64 KiB"},
  };
  for (const Case& c : cases) {
    INFO(c.attribute << " = " << c.content.substr(0, 40));
    BrokenSysfs s;
    WriteFile(s.device() / c.attribute, c.content);
    s.CheckSkipped((s.device() / c.attribute).string() + ": " + c.message);
  }
  BrokenSysfs s;
  fs::remove(s.device() / "vendor");
  fs::create_directory(s.device() / "vendor");
  s.CheckSkipped((s.device() / "vendor").string() + ": Is a directory");
}

TEST_CASE("Bad uverbs device numbers skip that device only", "[bad-input]") {
  for (const std::string dev : {"231:192:7\n", "-231:192\n", "231:99999999999\n", "231 192\n"}) {
    INFO(dev);
    BrokenSysfs s;
    const fs::path path = s.sim.sys() / "class/infiniband_verbs/uverbs1/dev";
    WriteFile(path, dev);
    std::string shown = dev.substr(0, dev.size() - 1);
    s.CheckSkipped(path.string() + ": expected a device number like \"231:192\", got \"" + shown +
                   "\"");
  }
}

TEST_CASE("A device broken while the daemon runs turns Unhealthy naming why, the rest unchanged",
          "[bad-input][concurrency]") {
  ServedNode node(/*fake_clock=*/true);
  const fs::path numa = node.sim().sys() / "class/infiniband/rdmap32s27/device/numa_node";
  WriteFile(numa, "garbage\n");
  // No event tells of a changed attribute: the periodic passes of a node
  // where uevents come and go (other devices') find it, at the latest with
  // the full rescan of every sixth.
  auto unhealthy = [](const std::vector<v1beta1::Device>& devices) {
    return devices.size() == 4 && devices[1].health() == "Unhealthy";
  };
  for (int pass = 0; pass < 12 && !unhealthy(node.kubelet().devices(kEfa)); ++pass) {
    REQUIRE(efa::sim::CountUevent(node.sim().path().string()).ok());
    REQUIRE(node.Pass(10s));
  }
  REQUIRE(node.kubelet().WaitForDevices(kEfa, unhealthy, kDeadline));
  CHECK(node.KubeletDevices() ==
        std::vector<std::string>{"rdmap16s27 Healthy 0", "rdmap32s27 Unhealthy 0",
                                 "rdmap144s27 Healthy 1", "rdmap160s27 Healthy 1"});
  CheckRefused(node, {{"rdmap32s27"}}, grpc::StatusCode::FAILED_PRECONDITION,
               "device \"rdmap32s27\" is unhealthy: " + numa.string() +
                   ": expected an integer, got \"garbage\"");
}

// =============================================================================
// The kubelet checkpoint
// =============================================================================

TEST_CASE("An empty, null or non-object checkpoint is refused and makes MOFED unknown",
          "[bad-input]") {
  struct Case {
    std::string json, message;
  };
  const std::vector<Case> cases = {
      {"",
       "cp:1:1: truncated JSON: syntax error while parsing value - unexpected end of input; "
       "expected '[', '{', or a literal"},
      {"null", "cp: the checkpoint: expected an object, got null"},
      {"{\"Data\":[]}", "cp: Data: expected an object, got array"},
      {"{\"Checksum\":1}", "cp: Data: missing"},
      {"{\"Data\":{}}\n{\"Data\":{}}",
       "cp:2:1: invalid JSON: syntax error while parsing value - unexpected '{'; expected "
       "end of input"},
  };
  for (const Case& c : cases) {
    INFO(c.json);
    auto checkpoint = ParseCheckpoint(c.json, "cp");
    REQUIRE_FALSE(checkpoint.ok());
    CHECK(Message(checkpoint.status()) == c.message);
    const MofedEvidence evidence = MofedFromCheckpoint(checkpoint, "cp");
    CHECK(evidence.state == MofedState::kUnknown);
    CHECK(evidence.findings == std::vector<std::string>{c.message});
  }
}

TEST_CASE("A checkpoint truncated inside a base64 answer is refused at its end", "[bad-input]") {
  const std::string json =
      "{\"Data\":{\"PodDeviceEntries\":[{\"PodUID\":\"p\",\"ContainerName\":\"c\","
      "\"ResourceName\":\"nvidia.com/gpu\",\"DeviceIDs\":{\"0\":[\"GPU-1\"]},"
      "\"AllocResp\":\"CgQKAkFCEgJyd";
  auto checkpoint = ParseCheckpoint(json, "cp");
  REQUIRE_FALSE(checkpoint.ok());
  CHECK(Message(checkpoint.status()) ==
        absl::StrCat("cp:1:", json.size() + 1,
                     ": truncated JSON: syntax error while parsing value - invalid string: missing "
                     "closing quote; last read: '\"CgQKAkFCEgJyd'"));
}

TEST_CASE(
    "A checkpoint entry with a field of the wrong type is skipped naming the field, the "
    "others read",
    "[bad-input]") {
  struct Case {
    std::string entry, message;
  };
  const std::vector<Case> cases = {
      {"{\"DeviceIDs\":{\"zero\":[\"a\"]}}",
       "cp: Data.PodDeviceEntries[0].DeviceIDs: NUMA node \"zero\" is not an integer"},
      {"{\"DeviceIDs\":{\"99999999999999999999\":[\"a\"]}}",
       "cp: Data.PodDeviceEntries[0].DeviceIDs: NUMA node \"99999999999999999999\" is not an "
       "integer"},
      {"{\"DeviceIDs\":{\"0\":[\"a\",1]}}",
       "cp: Data.PodDeviceEntries[0].DeviceIDs[\"0\"][1]: expected a string, got number"},
      {"{\"DeviceIDs\":\"a\"}",
       "cp: Data.PodDeviceEntries[0].DeviceIDs: expected an object or a list, got string"},
      {"{\"PodUID\":[\"p\"]}", "cp: Data.PodDeviceEntries[0].PodUID: expected a string, got array"},
      {"{\"AllocResp\":true}",
       "cp: Data.PodDeviceEntries[0].AllocResp: expected a string, got boolean"},
      {"7", "cp: Data.PodDeviceEntries[0]: expected an object, got number"},
  };
  const std::string good =
      "{\"PodUID\":\"p2\",\"ContainerName\":\"c\",\"ResourceName\":\"vpc.amazonaws.com/efa\","
      "\"DeviceIDs\":{\"0\":[\"rdmap16s27\"]}}";
  for (const Case& c : cases) {
    INFO(c.entry);
    auto checkpoint =
        ParseCheckpoint("{\"Data\":{\"PodDeviceEntries\":[" + c.entry + "," + good + "]}}", "cp");
    REQUIRE(checkpoint.ok());
    CHECK(checkpoint->skipped == std::vector<std::string>{c.message});
    REQUIRE(checkpoint->entries.size() == 1);
    CHECK(checkpoint->entries[0].pod_uid == "p2");
    CHECK(checkpoint->entries[0].device_ids == std::vector<std::string>{"rdmap16s27"});
    // What the skipped entry was is unknown: it may have shown MOFED.
    const MofedEvidence evidence = MofedFromCheckpoint(checkpoint, "cp");
    CHECK(evidence.state == MofedState::kUnknown);
    CHECK(evidence.findings == std::vector<std::string>{c.message});
  }
  auto registered = ParseCheckpoint(
      "{\"Data\":{\"RegisteredDevices\":{\"nvidia.com/gpu\":\"GPU-1\",\"x\":[\"a\"]}}}", "cp");
  REQUIRE(registered.ok());
  CHECK(registered->skipped ==
        std::vector<std::string>{"cp: Data.RegisteredDevices[\"nvidia.com/gpu\"]: expected a list "
                                 "of strings, got string"});
  CHECK(registered->registered_devices ==
        std::map<std::string, std::vector<std::string>>{{"x", {"a"}}});
}

TEST_CASE("Deeply nested and ill-formed UTF-8 checkpoints are refused without a crash",
          "[bad-input]") {
  auto nested = ParseCheckpoint(std::string(200000, '[') + std::string(200000, ']'), "cp");
  CHECK(Message(nested.status()) == "cp: the checkpoint: expected an object, got array");
  auto utf8 =
      ParseCheckpoint("{\"Data\":{\"PodDeviceEntries\":[{\"PodUID\":\"\xc3\x28\"}]}}", "cp");
  CHECK(Message(utf8.status()) ==
        "cp:1:42: invalid JSON: syntax error while parsing value - invalid string: ill-formed "
        "UTF-8 byte; last read: '\"\\xc3('");
}

TEST_CASE("A huge, directory or looping checkpoint file is refused naming the file",
          "[bad-input]") {
  TempDir dir;
  const fs::path huge = dir.path() / "huge";
  { std::ofstream out(huge); }
  fs::resize_file(huge, (size_t{64} << 20) + 1);
  CHECK(Message(ReadCheckpoint(huge).status()) == huge.string() + ": larger than 64 MiB");
  fs::create_directory(dir.path() / "dir");
  CHECK(Message(ReadCheckpoint(dir.path() / "dir").status()) ==
        (dir.path() / "dir").string() + ": Is a directory");
  fs::create_symlink("loop", dir.path() / "loop");
  CHECK(Message(ReadCheckpoint(dir.path() / "loop").status()) ==
        (dir.path() / "loop").string() + ": Too many levels of symbolic links");
  const MofedEvidence evidence =
      MofedFromCheckpoint(ReadCheckpoint(dir.path() / "dir"), dir.path() / "dir");
  CHECK(evidence.state == MofedState::kUnknown);
}

// =============================================================================
// /proc: the NVIDIA driver's GPU files and the NVIDIA device plugin's process
// =============================================================================

TEST_CASE(
    "NVIDIA information files without a UUID, with a malformed UUID or a bad bus are left out by "
    "name",
    "[bad-input]") {
  SimRoot sim("p5.48xlarge");
  const fs::path gpus = sim.path() / "proc/driver/nvidia/gpus";
  std::vector<std::string> errors;
  const auto baseline = efa::topology::ReadNvidiaGpus(sim.path() / "proc", &errors);
  REQUIRE(baseline.size() == 8);
  REQUIRE(errors.empty());
  const fs::path first = gpus / baseline[0].pci.ToString() / "information";
  const fs::path second = gpus / baseline[1].pci.ToString() / "information";
  const fs::path third = gpus / baseline[2].pci.ToString() / "information";
  WriteFile(first, "Model: \t\t NVIDIA H100\nGPU UUID: \t \nBus Location: \t 0000:53:00.0\n");
  WriteFile(second, "GPU UUID: \t GPU-a\nBus Location: \t 0000:64:00.0:garbage" +
                        std::string(100, 'z') + "\n");
  fs::remove(third);
  fs::create_directory(third);
  // What the driver writes while it cannot read the UUID, and a UUID that
  // would read as a replica ID "<ID>::<replica>".
  const fs::path fourth = gpus / baseline[3].pci.ToString() / "information";
  const fs::path fifth = gpus / baseline[4].pci.ToString() / "information";
  WriteFile(fourth, "GPU UUID: \t ??\nBus Location: \t " + baseline[3].pci.ToString() + "\n");
  WriteFile(fifth, "GPU UUID: \t GPU-1::2\nBus Location: \t " + baseline[4].pci.ToString() + "\n");
  const auto gpus_now = efa::topology::ReadNvidiaGpus(sim.path() / "proc", &errors);
  CHECK(gpus_now.size() == 3);
  CHECK(errors ==
        std::vector<std::string>{
            first.string() + ": no \"GPU UUID:\" line",
            second.string() + ": Bus Location \"0000:64:00.0:garbagezzzzzzzzzzzz\" is not a PCI "
                              "address",
            third.string() + ": Is a directory",
            fourth.string() + ": GPU UUID \"??\" is not \"GPU-<hex>\"",
            fifth.string() + ": GPU UUID \"GPU-1::2\" is not \"GPU-<hex>\""});
  for (size_t i = 0; i < gpus_now.size(); ++i) {
    CHECK(gpus_now[i].uuid == baseline[i + 5].uuid);
    CHECK(gpus_now[i].pci == baseline[i + 5].pci);
  }
}

TEST_CASE("A looping NVIDIA GPU entry is left out by name", "[bad-input]") {
  SimRoot sim("p5.48xlarge");
  const fs::path gpus = sim.path() / "proc/driver/nvidia/gpus";
  fs::create_symlink("0000:ff:00.0", gpus / "0000:ff:00.0");
  std::vector<std::string> errors;
  CHECK(efa::topology::ReadNvidiaGpus(sim.path() / "proc", &errors).size() == 8);
  CHECK(errors == std::vector<std::string>{(gpus / "0000:ff:00.0/information").string() +
                                           ": Too many levels of symbolic links"});
}

TEST_CASE("Odd command lines are not taken for the NVIDIA device plugin", "[bad-input]") {
  CHECK_FALSE(IsNvidiaPluginCommand(""));
  CHECK_FALSE(IsNvidiaPluginCommand(std::string("\0\0\0", 3)));
  CHECK_FALSE(IsNvidiaPluginCommand("nvidia-device-plugin/"));
  CHECK_FALSE(IsNvidiaPluginCommand(std::string("/bin/sh\0nvidia-device-plugin\0", 29)));
  CHECK(IsNvidiaPluginCommand("/usr/bin/nvidia-device-plugin"));  // no final NUL
  CHECK(MofedFlagFromCmdline(std::string("nvidia-device-plugin\0--mofed-enabled=yes\0", 42)) ==
        std::nullopt);
  CHECK(MofedFlagFromCmdline(std::string("nvidia-device-plugin\0---mofed-enabled\0", 38)) ==
        std::nullopt);
  CHECK(MofedEnvFromEnviron(std::string("MOFED_ENABLED\0=true\0", 20)) == std::nullopt);
  CHECK(MofedDefaultForVersion("v0.19") == std::nullopt);
  CHECK(MofedDefaultForVersion("v0.19.99999999999") == std::nullopt);
  CHECK(MofedDefaultForVersion("v-0.19.1") == std::nullopt);
}

TEST_CASE("Unreadable, looping and garbage process files leave the others' findings alone",
          "[bad-input]") {
  TempDir dir;
  FakeProc proc(dir.path() / "proc");
  proc.AddProcess(100, {"/usr/bin/nvidia-device-plugin", "--mofed-enabled=false"}, {}, "v0.19.3");
  proc.AddProcess(200, {"nvidia-device-plugin"}, {"MOFED_ENABLED=true"}, "v0.19.3");
  proc.AddProcess(300, {"nvidia-device-plugin"}, {}, "v0.19.1");
  // 200: environ is a directory; 300: exe is a truncated ELF; 400: cmdline
  // loops; 500: a huge command line.
  fs::remove(dir.path() / "proc/200/environ");
  fs::create_directory(dir.path() / "proc/200/environ");
  WriteFile(dir.path() / "proc/300/exe",
            "\x7f"
            "ELF\x02\x01");
  fs::create_directories(dir.path() / "proc/400");
  fs::create_symlink("cmdline", dir.path() / "proc/400/cmdline");
  fs::create_directories(dir.path() / "proc/500");
  WriteFile(dir.path() / "proc/500/cmdline",
            std::string("nvidia-device-plugin\0", 21) + std::string(3 << 20, 'a'));
  WriteFile(dir.path() / "proc/500/status", FakeProc::Status("nvidia-device-plugin", 0));
  fs::create_directories(dir.path() / "proc/self");
  auto scan = FindNvidiaPluginProcesses(dir.path() / "proc", dir.path() / "device-plugins");
  REQUIRE(scan.ok());
  const std::vector<NvidiaPluginProcess>* found = &scan->processes;
  REQUIRE(found->size() == 4);
  CHECK((*found)[0].pid == 100);
  CHECK((*found)[0].mofed_flag == false);
  CHECK((*found)[0].version == "v0.19.3");
  CHECK((*found)[1].pid == 200);
  CHECK_FALSE((*found)[1].environ_readable);
  CHECK((*found)[1].mofed_env == std::nullopt);
  CHECK((*found)[2].pid == 300);
  CHECK((*found)[2].version == "");
  CHECK(EffectiveMofed((*found)[2]) == std::nullopt);
  CHECK((*found)[3].pid == 500);
  CHECK((*found)[3].mofed_flag == std::nullopt);
  // Read up to its bound only, and not trusted (it holds no plugin socket).
  CHECK((*found)[3].untrusted ==
        (dir.path() / "proc/500/cmdline").string() + ": larger than 64 KiB");
  CHECK(scan->incomplete.empty());
}
