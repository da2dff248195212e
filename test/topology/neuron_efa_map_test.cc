#include "topology/neuron_efa_map.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <set>
#include <string>
#include <vector>

using namespace efa::topology;

TEST_CASE("FindNeuronEfaTable maps instance families as AWS does", "[topology]") {
  struct Case {
    std::string instance_type;
    std::string table;  // "" for none
  };
  const std::vector<Case> cases = {
      {"trn1.32xlarge", "trn1"},
      {"trn1.2xlarge", "trn1"},
      {"trn1n.32xlarge", "trn1n"},
      {"trn2.48xlarge", "trn2"},
      {"trn2e.48xlarge", "trn2"},
      {"trn2u.48xlarge", "trn2"},
      {"trn3.48xlarge", "trn3"},
      {"trn3p.48xlarge", "trn3"},
      {"trn3pd98.48xlarge", "trn3"},
      {"trn3s.48xlarge", "trn3"},
      {"trn3-dev0.48xlarge", "trn3pds"},
      {"trn3-dev1.48xlarge", "trn3pds"},
      {"p5.48xlarge", ""},
      {"inf2.48xlarge", ""},
      {"trn", ""},
      {"", ""},
  };
  for (const Case& c : cases) {
    INFO(c.instance_type);
    const NeuronEfaTable* table = FindNeuronEfaTable(c.instance_type);
    CHECK((table == nullptr ? "" : std::string(table->name)) == c.table);
  }
  REQUIRE(NeuronEfaTables().size() == 5);
  for (const NeuronEfaTable& t : NeuronEfaTables()) CHECK(t.efas.size() == 16);
}

TEST_CASE("FindNeuronEfaTable takes the family alone, never a prefix or the case of it",
          "[topology]") {
  // The bare family maps as its instance types do.
  CHECK(FindNeuronEfaTable("trn2u")->name == "trn2");
  CHECK(FindNeuronEfaTable("trn3-dev1")->name == "trn3pds");
  // A HyperPod node's type carries an "ml." prefix; its machine is the EC2 type's.
  CHECK(FindNeuronEfaTable("ml.trn2.48xlarge") == FindNeuronEfaTable("trn2.48xlarge"));
  // Families the mapping does not list, however close.
  for (const char* type :
       {"trn2n.48xlarge", "trn3pd.48xlarge", "trn3-dev2.48xlarge", "TRN2.48xlarge", "trn1n32xlarge",
        ".trn2", "inf1.24xlarge", "p4d.24xlarge"}) {
    INFO(type);
    CHECK(FindNeuronEfaTable(type) == nullptr);
  }
  // The same table object for every family that maps to it, one of NeuronEfaTables().
  const NeuronEfaTable* trn2 = FindNeuronEfaTable("trn2.48xlarge");
  CHECK(FindNeuronEfaTable("trn2e.48xlarge") == trn2);
  CHECK(trn2 >= NeuronEfaTables().data());
  CHECK(trn2 < NeuronEfaTables().data() + NeuronEfaTables().size());
}

TEST_CASE("Every Neuron table names one EFA for each of 16 devices, in name order", "[topology]") {
  const auto& tables = NeuronEfaTables();
  std::vector<std::string> names;
  for (const NeuronEfaTable& t : tables) names.emplace_back(t.name);
  CHECK(names == std::vector<std::string>{"trn1", "trn1n", "trn2", "trn3", "trn3pds"});
  CHECK(std::is_sorted(names.begin(), names.end()));
  for (const NeuronEfaTable& t : tables) {
    INFO(t.name);
    REQUIRE(t.efas.size() == 16);
    std::set<PciAddress> distinct;
    for (const auto& efas : t.efas) {
      REQUIRE(efas.size() == 1);
      CHECK(efas[0] != PciAddress{});
      CHECK_FALSE(efas[0].ToString().empty());
      distinct.insert(efas[0]);
    }
    // Two devices share one EFA on trn1; every later table gives each its own.
    CHECK(distinct.size() == (t.name == "trn1" ? 8u : 16u));
  }
  // AWS's first and last entries, as transcribed.
  CHECK(tables[0].efas[0][0].ToString() == "0000:10:1a.0");
  CHECK(tables[2].efas[0][0].ToString() == "0000:c9:00.0");
  CHECK(tables[4].efas[15][0].ToString() == "0000:8d:00.0");
}
