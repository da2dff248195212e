#include "topology/instance_type.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "test/sim/machine_spec.h"
#include "test/sim/sim_root.h"
#include "topology/neuron_efa_map.h"

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
  CHECK(InstanceFamily(".48xlarge") == "");
  CHECK(InstanceFamily("p5.") == "p5");
  CHECK(InstanceFamily("p5..48xlarge") == "p5");
  CHECK(InstanceFamily(".") == "");
  // A view into the argument, not a copy.
  const std::string type = "trn2u.48xlarge";
  CHECK(InstanceFamily(type).data() == type.data());
}

TEST_CASE("SupportedEfaCount gives the EFA count of the types it lists, nullopt for others",
          "[topology]") {
  CHECK(SupportedEfaCount("p5.48xlarge") == 32);
  CHECK(SupportedEfaCount("ml.p5.48xlarge") == 32);
  CHECK(SupportedEfaCount("p5en.48xlarge") == 16);
  CHECK(SupportedEfaCount("trn1.32xlarge") == 8);
  CHECK(SupportedEfaCount("p6-b300.48xlarge") == 16);
  CHECK(SupportedEfaCount("p6e-gb200.36xlarge") == 16);
  CHECK(SupportedEfaCount("hpc7g.16xlarge") == 1);
  CHECK(SupportedEfaCount("c7gn.16xlarge") == 1);
  CHECK(SupportedEfaCount("c8gn.48xlarge") == 2);
  CHECK(SupportedEfaCount("r8gb.metal-48xl") == 2);
  CHECK(SupportedEfaCount("c8gn.24xlarge") == 1);
  CHECK(SupportedEfaCount("c8g.48xlarge") == 1);
  // No public count: not checked.
  CHECK(SupportedEfaCount("p6e-gb300.36xlarge") == std::nullopt);
  CHECK(SupportedEfaCount("c7gn.8xlarge") == std::nullopt);
  CHECK(SupportedEfaCount("m5.8xlarge") == std::nullopt);
  CHECK(SupportedEfaCount("") == std::nullopt);
}

TEST_CASE("A HyperPod ml. prefix names the same instance type and family", "[topology]") {
  CHECK(WithoutHyperPodPrefix("ml.p5.48xlarge") == "p5.48xlarge");
  CHECK(WithoutHyperPodPrefix("p5.48xlarge") == "p5.48xlarge");
  CHECK(WithoutHyperPodPrefix("ml.") == "");
  CHECK(InstanceFamily("ml.p5.48xlarge") == "p5");
  CHECK(InstanceFamily("ml.trn1.32xlarge") == "trn1");
  CHECK(SupportedEfaCount("ml.p5.48xlarge") == SupportedEfaCount("p5.48xlarge"));
  CHECK(DefaultNeuronCoresPerDevice("ml.trn1.32xlarge") == 2);
  CHECK(DefaultNeuronCoresPerDevice("ml.inf2.48xlarge") == 2);
}

TEST_CASE("DefaultNeuronCoresPerDevice goes by instance family", "[topology]") {
  CHECK(DefaultNeuronCoresPerDevice("inf1.24xlarge") == 4);
  CHECK(DefaultNeuronCoresPerDevice("inf2.48xlarge") == 2);
  CHECK(DefaultNeuronCoresPerDevice("trn1.32xlarge") == 2);
  CHECK(DefaultNeuronCoresPerDevice("trn1n.32xlarge") == 2);
  CHECK(DefaultNeuronCoresPerDevice("trn2.48xlarge") == 4);
  CHECK(DefaultNeuronCoresPerDevice("trn3.48xlarge") == 4);
  CHECK(DefaultNeuronCoresPerDevice("") == 4);
}

// The simulated machines are written by hand from public data; the
// production tables are what the daemon uses. They must agree, so a new
// machine or a corrected count cannot leave one of them behind.
TEST_CASE("Every simulated machine agrees with the production instance-type tables", "[topology]") {
  for (const efa::sim::MachineSpec& spec : efa::sim::BuiltinMachines()) {
    INFO(spec.instance_type);
    int efas = 0, neurons = 0;
    for (const efa::sim::PcieGroup& group : spec.groups) {
      for (const efa::sim::Endpoint& endpoint : group.endpoints) {
        efas += endpoint.kind == efa::sim::Kind::kEfa ? 1 : 0;
        neurons += endpoint.kind == efa::sim::Kind::kNeuron ? 1 : 0;
      }
    }
    if (efas == 0) {
      CHECK(SupportedEfaCount(spec.instance_type) == std::nullopt);
    } else {
      CHECK(SupportedEfaCount(spec.instance_type) == efas);
    }
    const NeuronEfaTable* table = FindNeuronEfaTable(spec.instance_type);
    if (neurons == 0) {
      CHECK(table == nullptr);
    } else {
      REQUIRE(table != nullptr);
      CHECK(table->efas.size() == static_cast<size_t>(neurons));
    }
  }
}
