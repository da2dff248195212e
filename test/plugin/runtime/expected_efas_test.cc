#include "plugin/runtime/expected_efas.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <optional>
#include <string>

#include "test/sim/sim_root.h"

namespace fs = std::filesystem;
using namespace efa::plugin;
using efa::sim::SimRoot;

TEST_CASE("The EFA count check", "[topology-report]") {
  CHECK(CheckExpectedEfas("p4d.24xlarge", 0, 4).Describe() ==
        "found 4 EFAs, as many as a p4d.24xlarge supports");
  CHECK(CheckExpectedEfas("p4d.24xlarge", 2, 2).Describe() ==
        "found 2 EFAs, as expectedEfaCount says");
  CHECK(CheckExpectedEfas("m5.8xlarge", 0, 0).Describe() ==
        "found 0 EFAs; no EFA count is known for m5.8xlarge (set expectedEfaCount to check it)");
  CHECK(CheckExpectedEfas("", 0, 1).Describe() ==
        "found 1 EFA; the instance type is unknown (set instanceType or expectedEfaCount to "
        "check the count)");
  CHECK(CheckExpectedEfas("g5.48xlarge", 0, 2).Describe() ==
        "found 2 EFAs, more than expected: a g5.48xlarge supports 1 (set expectedEfaCount if "
        "the table is out of date)");
  CHECK(CheckExpectedEfas("trn2.48xlarge", 0, 0).Describe() ==
        "found 0 EFAs, but a trn2.48xlarge supports 16: the node was likely launched with fewer "
        "EFA interfaces than it supports. Check the launch template or the Karpenter "
        "EC2NodeClass: every network card needs a network interface with interfaceType efa or "
        "efa-only, and the efa kernel module must be loaded");
  const ExpectedEfasCheck configured = CheckExpectedEfas("m5.8xlarge", 4, 3);
  CHECK(configured.short_of_expected());
  CHECK(configured.Describe().rfind("found 3 EFAs, but expectedEfaCount is 4: ", 0) == 0);
}

TEST_CASE("ResolveInstanceType: configuration wins, then DMI, then unknown", "[ops]") {
  SimRoot sim("trn2.48xlarge");
  CHECK(ResolveInstanceType("trn2u.48xlarge", sim.sys()) == "trn2u.48xlarge");
  CHECK(ResolveInstanceType("", sim.sys()) == "trn2.48xlarge");
  // Configuration needs no DMI at all.
  CHECK(ResolveInstanceType("p5.48xlarge", sim.path() / "no-sys") == "p5.48xlarge");
  fs::remove(sim.sys() / "devices/virtual/dmi/id/product_name");
  CHECK(ResolveInstanceType("", sim.sys()) == "");
  CHECK(ResolveInstanceType("", sim.path() / "no-sys") == "");
}

TEST_CASE("ExpectedEfasMonitor keeps the check of the latest observation", "[ops]") {
  ExpectedEfasMonitor monitor("p5.48xlarge", 0);
  CHECK_FALSE(monitor.latest().has_value());
  monitor.Observe(31);
  REQUIRE(monitor.latest().has_value());
  CHECK(monitor.latest()->instance_type == "p5.48xlarge");
  CHECK(monitor.latest()->found == 31);
  CHECK(monitor.latest()->expected == 32);
  CHECK_FALSE(monitor.latest()->configured);
  CHECK(monitor.latest()->short_of_expected());
  monitor.Observe(32);
  CHECK(monitor.latest()->found == 32);
  CHECK(monitor.latest()->as_expected());
  CHECK_FALSE(monitor.latest()->short_of_expected());
  // The same count again changes nothing; a drop is seen again.
  monitor.Observe(32);
  CHECK(monitor.latest()->as_expected());
  monitor.Observe(0);
  CHECK(monitor.latest()->found == 0);
  CHECK(monitor.latest()->short_of_expected());
}

TEST_CASE("ExpectedEfasMonitor compares with expectedEfaCount when it is set", "[ops]") {
  ExpectedEfasMonitor configured("p5.48xlarge", 4);
  configured.Observe(4);
  REQUIRE(configured.latest().has_value());
  CHECK(configured.latest()->configured);
  CHECK(configured.latest()->expected == 4);
  CHECK(configured.latest()->as_expected());
  configured.Observe(32);
  CHECK(configured.latest()->found == 32);
  CHECK_FALSE(configured.latest()->as_expected());
  CHECK_FALSE(configured.latest()->short_of_expected());

  // An unknown type has nothing to compare with, unless configured.
  ExpectedEfasMonitor unknown("", 0);
  unknown.Observe(2);
  CHECK_FALSE(unknown.latest()->expected.has_value());
  CHECK_FALSE(unknown.latest()->as_expected());
  CHECK_FALSE(unknown.latest()->short_of_expected());
  ExpectedEfasMonitor unknown_configured("", 2);
  unknown_configured.Observe(1);
  CHECK(unknown_configured.latest()->expected == 2);
  CHECK(unknown_configured.latest()->short_of_expected());
}
