#include "topology/pci_address.h"

#include <catch2/catch.hpp>

using efa::topology::PciAddress;

TEST_CASE("PciAddress parses sysfs addresses and prints them canonically", "[topology]") {
  auto a = PciAddress::Parse("0000:4F:00.0");
  REQUIRE(a.has_value());
  CHECK(a->bus == 0x4f);
  CHECK(a->ToString() == "0000:4f:00.0");
  auto b = PciAddress::Parse("10:1c.0");
  REQUIRE(b.has_value());
  CHECK(b->ToString() == "0000:10:1c.0");
  CHECK(PciAddress::Parse("0001:a0:1f.7")->ToString() == "0001:a0:1f.7");
  CHECK(*PciAddress::Parse("0000:10:1b.0") < *PciAddress::Parse("0000:10:1c.0"));
}

TEST_CASE("PciAddress rejects anything that is not a PCI function", "[topology]") {
  for (const char* bad : {"", "pci0000:44", "0000:4f:00", "0000:4f:20.0", "0000:4f:00.8",
                          "0000:4g:00.0", "0000:4f:00.0x", "uverbs0", "000:4f:00.0"}) {
    INFO(bad);
    CHECK_FALSE(PciAddress::Parse(bad).has_value());
  }
}
