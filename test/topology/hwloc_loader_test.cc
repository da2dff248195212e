#include "topology/hwloc_loader.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "test/sim/sim_root.h"
#include "test/support/temp_dir.h"

namespace fs = std::filesystem;
using efa::sim::SimRoot;
using efa::testing::TempDir;
using namespace efa::topology;

namespace {

constexpr uint16_t kAmazonVendor = 0x1d0f;

// The PCI addresses of `machine`'s EFAs, as its spec lays them out.
std::set<PciAddress> SpecEfas(const std::string& machine) {
  const auto spec = efa::sim::FindMachine(machine);
  REQUIRE(spec.ok());
  std::set<PciAddress> out;
  for (const auto& group : spec->groups) {
    for (const auto& e : group.endpoints) {
      if (e.kind == efa::sim::Kind::kEfa) out.insert(e.addr);
    }
  }
  return out;
}

// The Amazon PCI devices of `topology` among `wanted`; and how many PCI
// devices it has in all.
std::set<PciAddress> AmazonDevicesAmong(hwloc_topology* topology,
                                        const std::set<PciAddress>& wanted, int* all = nullptr) {
  std::set<PciAddress> found;
  int count = 0;
  for (hwloc_obj_t o = hwloc_get_next_pcidev(topology, nullptr); o != nullptr;
       o = hwloc_get_next_pcidev(topology, o)) {
    ++count;
    const auto& pci = o->attr->pcidev;
    const PciAddress addr{static_cast<uint16_t>(pci.domain), pci.bus, pci.dev, pci.func};
    if (pci.vendor_id == kAmazonVendor && wanted.count(addr)) found.insert(addr);
  }
  if (all != nullptr) *all = count;
  return found;
}

}  // namespace

TEST_CASE("LoadTopology reads a simulated machine's EFAs from its root and from its XML",
          "[topology]") {
  for (const auto& [machine, count] :
       {std::pair{"p5.48xlarge", 32u}, std::pair{"trn2.48xlarge", 16u}}) {
    INFO(machine);
    SimRoot sim(machine);
    const std::set<PciAddress> efas = SpecEfas(machine);
    REQUIRE(efas.size() == count);
    auto from_root = LoadTopology({sim.path().string(), ""});
    REQUIRE(from_root.ok());
    CHECK(AmazonDevicesAmong(from_root->get(), efas) == efas);
    auto from_xml = LoadTopology({"", sim.xml().string()});
    REQUIRE(from_xml.ok());
    CHECK(AmazonDevicesAmong(from_xml->get(), efas) == efas);
  }
  {
    // A machine without EFAs has none.
    SimRoot sim("no-efa");
    auto topology = LoadTopology({sim.path().string(), ""});
    REQUIRE(topology.ok());
    CHECK(AmazonDevicesAmong(topology->get(), SpecEfas("p5.48xlarge")).empty());
  }
}

TEST_CASE("LoadTopology names the XML file it cannot read", "[topology]") {
  TempDir dir;
  const std::string xml = (dir.path() / "missing.xml").string();
  auto from_xml = LoadTopology({"", xml});
  REQUIRE_FALSE(from_xml.ok());
  CHECK(from_xml.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(from_xml.status().message().find(xml) != std::string::npos);
  // There, but not hwloc XML.
  const std::string garbage = (dir.path() / "garbage.xml").string();
  efa::testing::WriteFile(garbage, "<topology version=\"x\"> not closed");
  auto from_garbage = LoadTopology({"", garbage});
  REQUIRE_FALSE(from_garbage.ok());
  CHECK(from_garbage.status().message().find(garbage) == 0);
}

TEST_CASE("ExportTopologyXml writes XML that loads back to the same PCI devices", "[topology]") {
  SimRoot sim("p4d.24xlarge");
  auto original = LoadTopology({sim.path().string(), ""});
  REQUIRE(original.ok());
  TempDir dir;
  const fs::path exported = dir.path() / "exported.xml";
  REQUIRE(ExportTopologyXml(original->get(), exported.string()).ok());
  auto reloaded = LoadTopology({"", exported.string()});
  REQUIRE(reloaded.ok());
  const std::set<PciAddress> efas = SpecEfas("p4d.24xlarge");
  int original_count = 0, reloaded_count = 0;
  CHECK(AmazonDevicesAmong(original->get(), efas, &original_count) == efas);
  CHECK(AmazonDevicesAmong(reloaded->get(), efas, &reloaded_count) == efas);
  CHECK(original_count > static_cast<int>(efas.size()));
  CHECK(reloaded_count == original_count);
}

TEST_CASE("ExportTopologyXml names the path it cannot write", "[topology]") {
  SimRoot sim("no-efa");
  auto topology = LoadTopology({"", sim.xml().string()});
  REQUIRE(topology.ok());
  const std::string path = (sim.path() / "no-such-dir/out.xml").string();
  const absl::Status status = ExportTopologyXml(topology->get(), path);
  REQUIRE_FALSE(status.ok());
  CHECK(status.message().find(path) != std::string::npos);
  CHECK_FALSE(fs::exists(path));
}

TEST_CASE("Loading a simulated root never changes the process environment",
          "[topology][concurrency]") {
  // setenv/unsetenv while other threads run is undefined behaviour in
  // glibc; the daemon loads topologies while gRPC's threads run. A thread
  // watches HWLOC_FSROOT during the loads: it must never appear.
  REQUIRE(std::getenv("HWLOC_FSROOT") == nullptr);
  SimRoot sim("p4d.24xlarge");
  std::atomic<bool> done{false};
  std::atomic<bool> seen{false};
  std::thread watcher([&] {
    while (!done) {
      if (std::getenv("HWLOC_FSROOT") != nullptr) seen = true;
    }
  });
  for (int i = 0; i < 5; ++i) {
    auto topology = LoadTopology({sim.path().string(), ""});
    CHECK(topology.ok());
  }
  done = true;
  watcher.join();
  CHECK_FALSE(seen);
}

TEST_CASE("The simulated arm64 machines look like arm64 to hwloc and in sysfs", "[topology]") {
  int arm64 = 0;
  for (const efa::sim::MachineSpec& spec : efa::sim::BuiltinMachines()) {
    INFO(spec.instance_type);
    SimRoot sim(spec);
    const bool is_arm64 = spec.arm64_cpu_part.has_value();
    arm64 += is_arm64 ? 1 : 0;
    // Dies are x86's: an arm64 kernel has no die_id.
    CHECK(fs::exists(sim.sys() / "devices/system/cpu/cpu0/topology/die_id") == !is_arm64);
    std::ifstream cpuinfo(sim.path() / "proc/cpuinfo");
    const std::string text((std::istreambuf_iterator<char>(cpuinfo)),
                           std::istreambuf_iterator<char>());
    CHECK((text.find("CPU implementer\t: 0x41") != std::string::npos) == is_arm64);
    CHECK((text.find("physical id") != std::string::npos) == !is_arm64);
    if (!is_arm64) continue;
    for (const TopologySource& source :
         {TopologySource{sim.path().string(), ""}, TopologySource{"", sim.xml().string()}}) {
      auto topology = LoadTopology(source);
      REQUIRE(topology.ok());
      const char* arch =
          hwloc_obj_get_info_by_name(hwloc_get_root_obj(topology->get()), "Architecture");
      REQUIRE(arch != nullptr);
      CHECK(std::string(arch) == "aarch64");
    }
  }
  CHECK(arm64 == 3);  // p6e-gb200, hpc7g, c8gn
}
