#include "topology/efa_discovery.h"

#include <catch2/catch.hpp>
#include <cerrno>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "test/sim/sim_root.h"
#include "test/support/descriptor_table_full.h"
#include "test/support/sanitized.h"

namespace fs = std::filesystem;
using efa::sim::Naming;
using efa::sim::SimRoot;
using namespace efa::topology;

namespace {

// "rdmap79s0 uverbs0 0000:4f:00.0 numa0" per device.
std::vector<std::string> Describe(const Inventory& inv) {
  std::vector<std::string> out;
  for (const EfaDevice& d : inv.devices) {
    out.push_back(absl::StrCat(d.ibdev, " ", d.uverbs, " ", d.pci.ToString(), " numa",
                               d.numa_node ? absl::StrCat(*d.numa_node) : "?"));
  }
  return out;
}

// Expected lines for EFAs at bus:slot pairs, named as udev names them.
std::vector<std::string> Expect(std::vector<std::pair<int, int>> bus_slot, int first_uverbs,
                                std::vector<int> numa) {
  std::vector<std::string> out;
  for (size_t i = 0; i < bus_slot.size(); ++i) {
    auto [bus, slot] = bus_slot[i];
    out.push_back(absl::StrFormat("rdmap%ds%d uverbs%d 0000:%02x:%02x.0 numa%s", bus, slot,
                                  first_uverbs + static_cast<int>(i), bus, slot,
                                  numa[i] < 0 ? "?" : absl::StrCat(numa[i])));
  }
  return out;
}

std::vector<std::pair<int, int>> Buses(std::vector<int> buses) {
  std::vector<std::pair<int, int>> out;
  for (int b : buses) out.push_back({b, 0});
  return out;
}

std::vector<int> Numa(std::vector<std::pair<int, int>> runs) {  // {numa, count}...
  std::vector<int> out;
  for (auto [numa, count] : runs) out.insert(out.end(), count, numa);
  return out;
}

void Write(const fs::path& path, const std::string& content) {
  std::ofstream out(path, std::ios::trunc);
  out << content;
}

}  // namespace

TEST_CASE("EfaDiscovery finds exactly the EFAs of every simulated machine", "[topology]") {
  struct Case {
    std::string machine;
    std::vector<std::string> expected;
  };
  const std::vector<Case> cases = {
      {"p5.48xlarge",
       Expect(Buses({0x4f, 0x50, 0x51, 0x52, 0x60, 0x61, 0x62, 0x63, 0x71, 0x72, 0x73,
                     0x74, 0x82, 0x83, 0x84, 0x85, 0x93, 0x94, 0x95, 0x96, 0xa4, 0xa5,
                     0xa6, 0xa7, 0xb5, 0xb6, 0xb7, 0xb8, 0xc6, 0xc7, 0xc8, 0xc9}),
              0, Numa({{0, 16}, {1, 16}}))},
      {"p5en.48xlarge", Expect(Buses({0x55, 0x56, 0x57, 0x58, 0x6e, 0x6f, 0x70, 0x71, 0x87, 0x88,
                                      0x89, 0x8a, 0xa0, 0xa1, 0xa2, 0xa3}),
                               0, Numa({{0, 8}, {1, 8}}))},
      {"p4d.24xlarge",
       Expect({{0x10, 0x1b}, {0x20, 0x1b}, {0x90, 0x1b}, {0xa0, 0x1b}}, 0, Numa({{0, 2}, {1, 2}}))},
      // uverbs0 is the first ConnectX-7 (bus 30), which is not an EFA.
      {"p6-b200.48xlarge",
       Expect(Buses({0x55, 0x56, 0x6e, 0x6f, 0x87, 0x88, 0xa0, 0xa1}), 1, Numa({{0, 4}, {1, 4}}))},
      {"trn1.32xlarge", Expect({{0x10, 0x19},
                                {0x10, 0x1a},
                                {0x20, 0x19},
                                {0x20, 0x1a},
                                {0x90, 0x19},
                                {0x90, 0x1a},
                                {0xa0, 0x19},
                                {0xa0, 0x1a}},
                               0, Numa({{0, 4}, {1, 4}}))},
      {"trn2.48xlarge", Expect(Buses({0x56, 0x57, 0x6c, 0x6d, 0x82, 0x83, 0x98, 0x99, 0xb3, 0xb4,
                                      0xc9, 0xca, 0xdf, 0xe0, 0xf5, 0xf6}),
                               0, Numa({{0, 8}, {1, 8}}))},
      {"g5.48xlarge", Expect({{0x00, 0x15}}, 0, {-1})},
      {"p6-b300.48xlarge", Expect(Buses({0x55, 0x56, 0x57, 0x58, 0x6e, 0x6f, 0x70, 0x71, 0x87, 0x88,
                                         0x89, 0x8a, 0xa0, 0xa1, 0xa2, 0xa3}),
                                  0, Numa({{0, 8}, {1, 8}}))},
      // Per GPU: the odd cards' EFAs behind its switch, then the even
      // cards' on a root bus of their own (beside ENA functions).
      {"p6e-gb200.36xlarge", Expect({{0x13, 0},
                                     {0x14, 0},
                                     {0x30, 1},
                                     {0x30, 2},
                                     {0x53, 0},
                                     {0x54, 0},
                                     {0x70, 1},
                                     {0x70, 2},
                                     {0x93, 0},
                                     {0x94, 0},
                                     {0xb0, 1},
                                     {0xb0, 2},
                                     {0xd3, 0},
                                     {0xd4, 0},
                                     {0xf0, 1},
                                     {0xf0, 2}},
                                    0, Numa({{0, 8}, {1, 8}}))},
      {"hpc7g.16xlarge", Expect({{0x00, 0x06}}, 0, {0})},
      {"c8gn.48xlarge", Expect({{0x00, 0x06}, {0x80, 0x06}}, 0, {0, 1})},
      {"no-efa", {}},
  };
  for (const Case& c : cases) {
    SECTION(c.machine) {
      SimRoot sim(c.machine);
      Inventory inv = DiscoverEfaDevices(sim.roots());
      CHECK(Describe(inv) == c.expected);
      for (const EfaDevice& d : inv.devices) {
        CHECK(d.healthy());
        CHECK(d.uverbs_path == (sim.path() / "dev/infiniband" / d.uverbs).string());
      }
      for (const SkippedDevice& s : inv.skipped) CHECK_FALSE(s.malformed);
    }
  }
}

TEST_CASE("EfaDiscovery counts trn1n's sixteen EFAs", "[topology]") {
  SimRoot sim("trn1n.32xlarge");
  CHECK(DiscoverEfaDevices(sim.roots()).devices.size() == 16);
}

TEST_CASE("EfaDiscovery reads every attribute of a p5 EFA", "[topology]") {
  SimRoot sim("p5.48xlarge");
  Inventory inv = DiscoverEfaDevices(sim.roots());
  REQUIRE(inv.devices.size() == 32);
  const EfaDevice& d = inv.devices[0];
  CHECK(d.ibdev == "rdmap79s0");
  CHECK(d.major == 231);
  CHECK(d.minor == 192);
  CHECK(d.device_id == 0xefa1);
  CHECK(d.generation == 2);
  CHECK(d.root_complex == "pci0000:44");
  CHECK(d.node_guid == "0a4f:0000:fe00:0000");
  CHECK(inv.devices[31].minor == 223);
  CHECK(inv.devices[31].root_complex == "pci0000:bb");
  CHECK(inv.skipped.empty());
}

TEST_CASE("EfaDiscovery skips p6-b200's mlx5 verbs devices and finds its efa3", "[topology]") {
  SimRoot sim("p6-b200.48xlarge");
  Inventory inv = DiscoverEfaDevices(sim.roots());
  REQUIRE(inv.devices.size() == 8);
  for (const EfaDevice& d : inv.devices) {
    CHECK(d.device_id == 0xefa3);
    CHECK(d.generation == 4);
  }
  REQUIRE(inv.skipped.size() == 2);
  CHECK(inv.skipped[0].ibdev == "ibp176s1");
  CHECK(inv.skipped[0].reason == "PCI 15b3:1021 is a Mellanox device, not an EFA");
  CHECK_FALSE(inv.skipped[0].malformed);
  CHECK(inv.skipped[1].ibdev == "ibp48s1");
}

TEST_CASE("EfaDiscovery finds EFAs under their kernel names", "[topology]") {
  SimRoot sim("p5.48xlarge", Naming::kKernel);
  Inventory inv = DiscoverEfaDevices(sim.roots());
  REQUIRE(inv.devices.size() == 32);
  // Sorted by PCI address, not by name: efa_10 must not come before efa_2.
  for (size_t i = 0; i < inv.devices.size(); ++i) {
    CHECK(inv.devices[i].ibdev == absl::StrCat("efa_", i));
    CHECK(inv.devices[i].uverbs == absl::StrCat("uverbs", i));
  }
  CHECK(inv.devices[10].pci.ToString() == "0000:73:00.0");
}

TEST_CASE("EfaDiscovery matches the device ID, not the Amazon vendor alone", "[topology]") {
  SimRoot sim("p4d.24xlarge");
  // A verbs device whose PCI function is the ENA (1d0f:ec20).
  const fs::path ena = sim.sys() / "bus/pci/devices/0000:00:05.0";
  fs::create_directories(sim.sys() / "class/infiniband/ena_0");
  fs::create_directory_symlink(ena, sim.sys() / "class/infiniband/ena_0/device");
  // Every ENA device ID the ena driver lists (ena_pci_id_tbl.h), bound to
  // ena or, forced, to efa.
  const fs::path driver = ena / "driver";
  for (const char* id : {"0x0ec2", "0x1ec2", "0xec20", "0xec21"}) {
    for (const char* bound_to : {"ena", "efa"}) {
      CAPTURE(id, bound_to);
      Write(ena / "device", absl::StrCat(id, "\n"));
      fs::remove(driver);
      fs::create_directory_symlink(sim.sys() / "bus/pci/drivers" / bound_to, driver);
      Inventory inv = DiscoverEfaDevices(sim.roots());
      CHECK(inv.devices.size() == 4);
      REQUIRE(inv.skipped.size() == 1);
      CHECK(inv.skipped[0].ibdev == "ena_0");
      CHECK(inv.skipped[0].reason ==
            absl::StrCat("PCI 1d0f:", std::string(id).substr(2), " is an ENA, not an EFA"));
    }
  }
}

TEST_CASE("EfaDiscovery accepts every device ID of the EFA family", "[topology]") {
  // The kernel knows efa0-efa3 (and efa4 from 2026); aws-ofi-nccl takes
  // the whole 0xefa0-0xefaf family: so does discovery.
  SimRoot sim("p4d.24xlarge");
  const fs::path victim = sim.sys() / "class/infiniband/rdmap32s27/device";
  for (uint16_t id = 0xefa0; id <= 0xefaf; ++id) {
    CAPTURE(id);
    Write(victim / "device", absl::StrFormat("0x%04x\n", id));
    Inventory inv = DiscoverEfaDevices(sim.roots());
    REQUIRE(inv.devices.size() == 4);
    CHECK(inv.skipped.empty());
    CHECK(inv.devices[1].ibdev == "rdmap32s27");
    CHECK(inv.devices[1].device_id == id);
    CHECK(inv.devices[1].generation == id - 0xefa0 + 1);
    CHECK(inv.devices[1].healthy());
  }
}

TEST_CASE("EfaDiscovery accepts a function of an unknown ID bound to the efa driver",
          "[topology]") {
  SimRoot sim("p4d.24xlarge");
  const fs::path victim = sim.sys() / "class/infiniband/rdmap32s27/device";
  Write(victim / "device", "0xefb0\n");
  Inventory inv = DiscoverEfaDevices(sim.roots());
  REQUIRE(inv.devices.size() == 4);
  CHECK(inv.devices[1].ibdev == "rdmap32s27");
  CHECK(inv.devices[1].device_id == 0xefb0);
  CHECK(inv.devices[1].generation == 0);
  CHECK(inv.devices[1].healthy());

  // The same ID bound to another driver, or to none, is not an EFA.
  fs::remove(victim / "driver");
  fs::create_directories(sim.sys() / "bus/pci/drivers/vfio-pci");
  fs::create_directory_symlink(sim.sys() / "bus/pci/drivers/vfio-pci", victim / "driver");
  for (bool bound : {true, false}) {
    if (!bound) fs::remove(victim / "driver");
    inv = DiscoverEfaDevices(sim.roots());
    CHECK(inv.devices.size() == 3);
    REQUIRE(inv.skipped.size() == 1);
    CHECK(inv.skipped[0].reason ==
          "PCI 1d0f:efb0 is not an EFA (neither 1d0f:efa0-efaf nor bound to the efa driver)");
    CHECK(inv.complete());
  }
}

TEST_CASE("EfaDiscovery never takes an mlx5 device for an EFA whatever its ID", "[topology]") {
  SimRoot sim("p6-b200.48xlarge");
  // A ConnectX (vendor 15b3) whose device ID happens to read efa1, bound
  // (forced) to the efa driver.
  const fs::path mlx5 = sim.sys() / "class/infiniband/ibp48s1/device";
  Write(mlx5 / "device", "0xefa1\n");
  fs::remove(mlx5 / "driver");
  fs::create_directory_symlink(sim.sys() / "bus/pci/drivers/efa", mlx5 / "driver");
  Inventory inv = DiscoverEfaDevices(sim.roots());
  CHECK(inv.devices.size() == 8);
  REQUIRE(inv.skipped.size() == 2);
  CHECK(inv.skipped[1].ibdev == "ibp48s1");
  CHECK(inv.skipped[1].reason == "PCI 15b3:efa1 is a Mellanox device, not an EFA");
}

TEST_CASE("EfaDiscovery skips only the device whose sysfs is broken, naming the path",
          "[topology]") {
  SimRoot sim("p4d.24xlarge");
  const fs::path cls = sim.sys() / "class/infiniband";
  std::string expected;
  std::string victim = "rdmap32s27";

  SECTION("missing numa_node") {
    fs::remove(cls / victim / "device/numa_node");
    expected = (cls / victim / "device/numa_node").string() + ": No such file or directory";
  }
  SECTION("garbage numa_node") {
    Write(cls / victim / "device/numa_node", "zero\n");
    expected = (cls / victim / "device/numa_node").string() + ": expected an integer, got \"zero\"";
  }
  SECTION("out-of-range numa_node") {
    Write(cls / victim / "device/numa_node", "-7\n");
    expected = (cls / victim / "device/numa_node").string() +
               ": expected -1 or a NUMA node number, got -7";
  }
  SECTION("dangling device link") {
    const fs::path link = cls / victim / "device";
    fs::remove(link);
    fs::create_directory_symlink("../../0000:20:1b.7", link);
    expected = link.string() + ": dangling link to ../../0000:20:1b.7";
  }
  SECTION("garbage device ID") {
    Write(cls / victim / "device/device", "efa?\n");
    expected =
        (cls / victim / "device/device").string() + ": expected a hexadecimal number, got \"efa?\"";
  }
  SECTION("garbage uverbs dev numbers") {
    Write(sim.sys() / "class/infiniband_verbs/uverbs1/dev", "231\n");
    expected = (sim.sys() / "class/infiniband_verbs/uverbs1/dev").string() +
               ": expected a device number like \"231:192\", got \"231\"";
  }
  SECTION("no uverbs device") {
    fs::remove(sim.sys() / "class/infiniband_verbs/uverbs1");
    expected =
        (sim.sys() / "class/infiniband_verbs").string() + ": no uverbs device names " + victim;
  }
  Inventory inv = DiscoverEfaDevices(sim.roots());
  CHECK(Describe(inv) == std::vector<std::string>{"rdmap16s27 uverbs0 0000:10:1b.0 numa0",
                                                  "rdmap144s27 uverbs2 0000:90:1b.0 numa1",
                                                  "rdmap160s27 uverbs3 0000:a0:1b.0 numa1"});
  REQUIRE(inv.skipped.size() == 1);
  CHECK(inv.skipped[0].ibdev == victim);
  CHECK(inv.skipped[0].reason == expected);
  CHECK(inv.skipped[0].malformed);
}

TEST_CASE("EfaDiscovery reports a present EFA without its node or driver as unhealthy",
          "[topology]") {
  SimRoot sim("p4d.24xlarge");
  const fs::path node = sim.path() / "dev/infiniband/uverbs1";
  const fs::path driver = sim.sys() / "class/infiniband/rdmap144s27/device/driver";
  fs::remove(node);
  fs::remove(driver);
  Inventory inv = DiscoverEfaDevices(sim.roots());
  REQUIRE(inv.devices.size() == 4);
  CHECK(inv.devices[0].healthy());
  CHECK(inv.devices[1].health_problem == node.string() + ": No such file or directory");
  CHECK(inv.devices[2].health_problem == driver.string() + ": no driver bound");
  CHECK(inv.devices[3].healthy());

  fs::create_directories(sim.sys() / "bus/pci/drivers/vfio-pci");
  fs::create_directory_symlink(sim.sys() / "bus/pci/drivers/vfio-pci", driver);
  inv = DiscoverEfaDevices(sim.roots());
  CHECK(inv.devices[2].health_problem == driver.string() + ": bound to vfio-pci, not efa");
}

TEST_CASE("EfaDiscovery on a root with no sysfs at all is an empty inventory", "[topology]") {
  HostRoots roots{"/nonexistent/sys", "/nonexistent/dev", "/nonexistent/proc"};
  Inventory inv = DiscoverEfaDevices(roots);
  CHECK(inv.devices.empty());
  CHECK(inv.skipped.empty());
}

TEST_CASE("EfaDiscovery reports a uverbs path that is not a character device as unhealthy",
          "[topology]") {
  SimRoot sim("p4d.24xlarge");
  const fs::path node = sim.path() / "dev/infiniband/uverbs1";
  REQUIRE(DiscoverEfaDevices(sim.roots()).devices[1].healthy());  // the sim's node is real

  fs::remove(node);
  { std::ofstream(node.string()) << "x"; }
  Inventory inv = DiscoverEfaDevices(sim.roots());
  CHECK(inv.devices[1].health_problem ==
        node.string() + ": not a character device (a regular file)");

  fs::remove(node);
  fs::create_directory(node);
  inv = DiscoverEfaDevices(sim.roots());
  CHECK(inv.devices[1].health_problem == node.string() + ": not a character device (a directory)");

  fs::remove(node);
  REQUIRE(efa::sim::MakeCharDevice(node, 231, 7).ok());  // another device's numbers
  inv = DiscoverEfaDevices(sim.roots());
  CHECK(inv.devices[1].health_problem == node.string() + ": device 231:7, but sysfs says 231:193");

  fs::remove(node);
  sim.RestoreUverbs(1);
  CHECK(DiscoverEfaDevices(sim.roots()).devices[1].healthy());
}

TEST_CASE("The discovery fingerprint changes with whatever changes a device's presence or health",
          "[topology]") {
  SimRoot sim("p4d.24xlarge");
  const HostRoots roots = sim.roots();
  const std::string before = DiscoveryFingerprint(roots);
  CHECK(DiscoveryFingerprint(roots) == before);
  CHECK_FALSE(before.empty());
  SECTION("its uverbs node removed") {
    fs::remove(sim.path() / "dev/infiniband/uverbs1");
    CHECK(DiscoveryFingerprint(roots) != before);
    sim.RestoreUverbs(1);
    CHECK(DiscoveryFingerprint(roots) == before);
  }
  SECTION("its uverbs node a regular file") {
    fs::remove(sim.path() / "dev/infiniband/uverbs1");
    std::ofstream(sim.path() / "dev/infiniband/uverbs1") << "x";
    CHECK(DiscoveryFingerprint(roots) != before);
  }
  SECTION("its class entry removed") {
    fs::remove(sim.sys() / "class/infiniband/rdmap32s27");
    CHECK(DiscoveryFingerprint(roots) != before);
  }
  SECTION("its driver unbound") {
    fs::remove(sim.sys() / "class/infiniband/rdmap32s27/device/driver");
    CHECK(DiscoveryFingerprint(roots) != before);
  }
  SECTION("its uverbs entry naming another device") {
    std::ofstream(sim.sys() / "class/infiniband_verbs/uverbs0/ibdev") << "efa_9\n";
    CHECK(DiscoveryFingerprint(roots) != before);
  }
}

TEST_CASE("EfaDiscovery out of descriptors is incomplete, never a node without EFA", "[topology]") {
  if (efa::testing::kSanitized) {
    WARN("not run under a sanitizer: its runtime needs descriptors while none are left");
    return;
  }
  SimRoot sim("p4d.24xlarge");
  Inventory inv;
  {
    efa::testing::DescriptorTableFull full;
    inv = DiscoverEfaDevices(sim.roots());
  }
  CHECK(inv.devices.empty());
  CHECK(inv.skipped.empty());
  CHECK_FALSE(inv.complete());
  CHECK_FALSE(inv.listed);
  REQUIRE(inv.errors.size() == 1);
  CHECK(inv.errors[0].operation == "list");
  CHECK(inv.errors[0].err == EMFILE);
  CHECK(inv.errors[0].message ==
        "listing " + (sim.sys() / "class/infiniband").string() + ": Too many open files");
  // Descriptors back: complete again.
  CHECK(DiscoverEfaDevices(sim.roots()).complete());
}

TEST_CASE("An incomplete discovery keeps the devices it could not see as they were", "[topology]") {
  SimRoot sim("p4d.24xlarge");
  Inventory before = DiscoverEfaDevices(sim.roots());
  REQUIRE(before.complete());
  REQUIRE(before.devices.size() == 4);
  before.devices[1].health_problem = "an earlier problem";
  const fs::path cls = sim.sys() / "class/infiniband";

  SECTION("the listing failed: every device as it was") {
    fs::rename(cls, sim.sys() / "class/infiniband.away");
    fs::create_symlink("infiniband", cls);  // a loop: ELOOP, not ENOENT
    Inventory now = KeepLastKnown(DiscoverEfaDevices(sim.roots()), before);
    CHECK_FALSE(now.complete());
    CHECK(Describe(now) == Describe(before));
    CHECK(now.devices[1].health_problem == "an earlier problem");
  }
  SECTION("a device skipped for a reason of its own is not kept") {
    fs::rename(cls, sim.sys() / "class/infiniband.away");
    fs::create_symlink("infiniband", cls);
    Inventory now = DiscoverEfaDevices(sim.roots());
    now.skipped.push_back({"rdmap32s27", "its own reason", true});
    now = KeepLastKnown(std::move(now), before);
    CHECK(Describe(now) == std::vector<std::string>{"rdmap16s27 uverbs0 0000:10:1b.0 numa0",
                                                    "rdmap144s27 uverbs2 0000:90:1b.0 numa1",
                                                    "rdmap160s27 uverbs3 0000:a0:1b.0 numa1"});
  }
  SECTION("a complete discovery is taken as it is: a device it lacks is gone") {
    fs::remove(cls / "rdmap32s27");
    Inventory now = KeepLastKnown(DiscoverEfaDevices(sim.roots()), before);
    CHECK(now.complete());
    CHECK(now.devices.size() == 3);
    CHECK(now.devices[1].ibdev == "rdmap144s27");
  }
}
