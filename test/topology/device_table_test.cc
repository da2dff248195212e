#include "topology/device_table.h"

#include <catch2/catch.hpp>

#include "topology/replica_id.h"

using namespace efa::topology;

namespace {

std::vector<EfaDevice> TwoEfas() {
  std::vector<EfaDevice> devices(2);
  devices[0].ibdev = "rdmap79s0";
  devices[0].pci = *PciAddress::Parse("0000:4f:00.0");
  devices[1].ibdev = "rdmap80s0";
  devices[1].pci = *PciAddress::Parse("0000:50:00.0");
  return devices;
}

}  // namespace

TEST_CASE("Replica IDs name the EFA and the replica, in one spelling", "[topology][sharing]") {
  CHECK(ReplicaId("rdmap79s0", 3) == "rdmap79s0::3");
  auto ref = ParseReplicaId("rdmap79s0::12");
  REQUIRE(ref);
  CHECK(ref->ibdev == "rdmap79s0");
  CHECK(ref->replica == 12);
  for (const char* bad : {"rdmap79s0", "rdmap79s0::", "::1", "rdmap79s0::01", "rdmap79s0::-1",
                          "rdmap79s0::1x", "rdmap79s0::64", "rdmap79s0::99999999999"}) {
    INFO(bad);
    CHECK_FALSE(ParseReplicaId(bad));
  }
}

TEST_CASE("A device table without replicas lists and finds EFAs by ibdev name", "[topology]") {
  const DeviceTable table(TwoEfas(), nullptr);
  REQUIRE(table.model != nullptr);  // built from the devices alone
  CHECK(table.Ids(table.devices[1]) == std::vector<std::string>{"rdmap80s0"});
  REQUIRE(table.Find("rdmap80s0") != nullptr);
  CHECK(table.Find("rdmap80s0")->ibdev == "rdmap80s0");
  CHECK(table.Find("rdmap80s0::0") == nullptr);  // no replica IDs without sharing
  CHECK(table.Find("mlx5_0") == nullptr);
  CHECK(table.PhysicalEfas({"rdmap80s0", "nope", "rdmap79s0", "rdmap80s0"}) ==
        std::vector<std::string>{"rdmap80s0", "rdmap79s0"});
}

TEST_CASE("A device table with replicas finds each EFA by its replica IDs only",
          "[topology][sharing]") {
  const DeviceTable table(TwoEfas(), nullptr, 3);
  CHECK(table.Ids(table.devices[0]) ==
        std::vector<std::string>{"rdmap79s0::0", "rdmap79s0::1", "rdmap79s0::2"});
  REQUIRE(table.Find("rdmap79s0::2") != nullptr);
  CHECK(table.Find("rdmap79s0::2")->ibdev == "rdmap79s0");
  CHECK(table.Find("rdmap79s0::3") == nullptr);  // beyond the replicas
  CHECK(table.Find("rdmap79s0") == nullptr);     // a bare name is not an ID when shared
  REQUIRE(table.FindPhysical("rdmap79s0") != nullptr);
  CHECK(table.PhysicalEfas({"rdmap80s0::1", "rdmap79s0::0", "rdmap80s0::2"}) ==
        std::vector<std::string>{"rdmap80s0", "rdmap79s0"});
}
