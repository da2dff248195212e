#include "topology/instance_type.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "test/sim/sim_root.h"

namespace fs = std::filesystem;
using efa::sim::SimRoot;
using namespace efa::topology;

namespace {

fs::path ProductName(const SimRoot& sim) {
  return sim.sys() / "devices/virtual/dmi/id/product_name";
}

}  // namespace

TEST_CASE("ReadInstanceType reads each simulated machine's DMI product name", "[topology]") {
  for (const char* machine : {"trn2.48xlarge", "p5.48xlarge", "g5.48xlarge"}) {
    SimRoot sim(machine);
    CHECK(ReadInstanceType(sim.sys()).value() == machine);
  }
}

TEST_CASE("ReadInstanceType strips trailing whitespace only", "[topology]") {
  SimRoot sim("p5.48xlarge");
  std::ofstream(ProductName(sim)) << "p4d.24xlarge\n";
  CHECK(ReadInstanceType(sim.sys()).value() == "p4d.24xlarge");
  std::ofstream(ProductName(sim)) << "p4d.24xlarge \t\r\n\n";
  CHECK(ReadInstanceType(sim.sys()).value() == "p4d.24xlarge");
  // Leading whitespace is kept: it is no instance type any table knows.
  std::ofstream(ProductName(sim)) << " p4d.24xlarge\n";
  CHECK(ReadInstanceType(sim.sys()).value() == " p4d.24xlarge");
  // Whitespace alone is as empty.
  std::ofstream(ProductName(sim)) << " \t\n";
  const auto blank = ReadInstanceType(sim.sys());
  CHECK(blank.status().code() == absl::StatusCode::kNotFound);
  CHECK(blank.status().message() == ProductName(sim).string() + ": empty");
}

TEST_CASE("ReadInstanceType names the DMI file it cannot read", "[topology]") {
  SimRoot sim("p5.48xlarge");
  const fs::path file = sim.sys() / "devices/virtual/dmi/id/product_name";
  fs::remove(file);
  CHECK(ReadInstanceType(sim.sys()).status().message() ==
        file.string() + ": No such file or directory");
  std::ofstream(file) << "\n";
  CHECK(ReadInstanceType(sim.sys()).status().message() == file.string() + ": empty");
}

TEST_CASE("InstanceFamily is the part before the first dot", "[topology]") {
  CHECK(InstanceFamily("p5.48xlarge") == "p5");
  CHECK(InstanceFamily("trn3-dev0.48xlarge") == "trn3-dev0");
  CHECK(InstanceFamily("trn1") == "trn1");
  CHECK(InstanceFamily("") == "");
}

TEST_CASE("InstanceFamily stops at the first of several dots, even at the start", "[topology]") {
  CHECK(InstanceFamily("ml.p5.48xlarge") == "ml");
  CHECK(InstanceFamily(".48xlarge") == "");
  CHECK(InstanceFamily("p5.") == "p5");
  CHECK(InstanceFamily("p5..48xlarge") == "p5");
  CHECK(InstanceFamily(".") == "");
  // A view into the argument, not a copy.
  const std::string type = "trn2u.48xlarge";
  CHECK(InstanceFamily(type).data() == type.data());
}
