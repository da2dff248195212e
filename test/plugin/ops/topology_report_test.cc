// `efa-k8s-device-plugin topology` on every simulated machine, compared with
// the expected output in test/plugin/ops/testdata/topology/. To regenerate
// after a deliberate change (then review the diff):
//   EFA_UPDATE_TESTDATA=1 build/dev/test/efa_tests "[topology-report]"
#include "plugin/ops/topology_report.h"

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "nlohmann/json.hpp"
#include "test/sim/sim_root.h"
#include "test/support/build_paths.h"
#include "test/support/temp_dir.h"

namespace fs = std::filesystem;
using namespace efa::plugin;
using efa::sim::SimRoot;
using efa::testing::ReadFile;

namespace {

const fs::path kTestdata = efa::testing::kTopologyTestdata;

// Compares `actual` with the expected file, or writes it when asked to.
void CheckExpected(const std::string& name, const std::string& actual) {
  const fs::path path = kTestdata / name;
  if (std::getenv("EFA_UPDATE_TESTDATA") != nullptr) {
    fs::create_directories(kTestdata);
    std::ofstream(path) << actual;
  }
  INFO("expected output: " << path.string());
  REQUIRE(fs::exists(path));
  CHECK(actual == ReadFile(path));
}

TopologyReport Report(const SimRoot& sim, int expected_efa_count = 0) {
  return BuildTopologyReport({.roots = sim.roots(), .expected_efa_count = expected_efa_count});
}

}  // namespace

TEST_CASE("The topology command's output on every simulated machine is as expected",
          "[topology-report]") {
  for (const efa::sim::MachineSpec& spec : efa::sim::BuiltinMachines()) {
    const std::string machine = spec.instance_type == "m5.8xlarge" ? "no-efa" : spec.instance_type;
    INFO(machine);
    SimRoot sim(spec);
    const TopologyReport report = Report(sim);
    CHECK(report.topology_error.empty());
    CheckExpected(machine + ".txt", FormatTopologyTable(report));
    CheckExpected(machine + ".dot", FormatTopologyDot(report));
    // JSON says what the table says: kept for a few machines, checked for
    // shape on every one.
    const std::string json = FormatTopologyJson(report);
    const std::string name = machine;
    if (name == "p4d.24xlarge" || name == "trn2.48xlarge" || name == "g5.48xlarge" ||
        name == "no-efa") {
      CheckExpected(name + ".json", json);
    }
    REQUIRE(nlohmann::json::accept(json));
    auto parsed = nlohmann::json::parse(json);
    CHECK(parsed["efas"].size() == report.model->efas().size());
    for (const auto& efa : parsed["efas"]) {
      CHECK(efa["relations"].size() == report.model->accelerators().size());
    }
  }
}

TEST_CASE("The hwloc XML gives the same topology as the simulated sysfs", "[topology-report]") {
  for (const char* machine : {"p5.48xlarge", "trn2.48xlarge"}) {
    INFO(machine);
    SimRoot sim(machine);
    const TopologyReport from_xml =
        BuildTopologyReport({.roots = sim.roots(), .topology_xml = sim.xml().string()});
    CHECK(FormatTopologyTable(from_xml) == FormatTopologyTable(Report(sim)));
  }
}

TEST_CASE("A p5.48xlarge with 31 EFAs gets the count warning naming the likely cause",
          "[topology-report]") {
  SimRoot sim("p5.48xlarge");
  // The last EFA was never attached: no verbs device, no uverbs node.
  fs::remove(sim.sys() / "class/infiniband/rdmap201s0");
  fs::remove_all(sim.sys() / "class/infiniband_verbs/uverbs31");
  fs::remove(sim.path() / "dev/infiniband/uverbs31");
  const TopologyReport report = Report(sim);
  CHECK(report.count.found == 31);
  CHECK(report.count.expected == 32);
  CHECK(report.count.short_of_expected());
  const std::string warning =
      "found 31 EFAs, but a p5.48xlarge supports 32: the node was likely launched with fewer EFA "
      "interfaces than it supports. Check the launch template or the Karpenter EC2NodeClass: "
      "every network card needs a network interface with interfaceType efa or efa-only";
  CHECK(report.count.Describe() == warning);
  const std::string table = FormatTopologyTable(report);
  CHECK(table.find("\nEFA count: " + warning + "\n") != std::string::npos);
  CHECK(table.find("rdmap201s0") == std::string::npos);
  auto json = nlohmann::json::parse(FormatTopologyJson(report));
  CHECK(json["efaCount"]["found"] == 31);
  CHECK(json["efaCount"]["expected"] == 32);
  CHECK(json["efaCount"]["ok"] == false);
}

namespace {

TopologyReport SharedReport(const SimRoot& sim, int replicas, const std::string& resource) {
  return BuildTopologyReport(
      {.roots = sim.roots(), .replicas = replicas, .resource_name = resource});
}

// `json` without its "sharing" object.
nlohmann::json WithoutSharing(const std::string& json) {
  auto parsed = nlohmann::json::parse(json);
  parsed.erase("sharing");
  return parsed;
}

}  // namespace

TEST_CASE("With replicas 1 the topology command says nothing about sharing, byte for byte",
          "[topology-report][sharing]") {
  // The output before sharing existed is the expected files: replicas 1
  // gives exactly them, whatever the resource name.
  for (const char* machine : {"p4d.24xlarge", "trn2.48xlarge", "g5.48xlarge", "no-efa"}) {
    INFO(machine);
    SimRoot sim(machine);
    for (const char* resource : {"", "vpc.amazonaws.com/efa", "vpc.amazonaws.com/efa.shared"}) {
      INFO(resource);
      const TopologyReport report = SharedReport(sim, 1, resource);
      const std::string table = FormatTopologyTable(report);
      const std::string json = FormatTopologyJson(report);
      CHECK(table == ReadFile(kTestdata / (std::string(machine) + ".txt")));
      CHECK(json == ReadFile(kTestdata / (std::string(machine) + ".json")));
      CHECK(FormatTopologyDot(report) == ReadFile(kTestdata / (std::string(machine) + ".dot")));
      for (const std::string& text : {table, json}) {
        CHECK(text.find("haring") == std::string::npos);
        CHECK(text.find("replica") == std::string::npos);
        CHECK(text.find("::") == std::string::npos);
      }
    }
  }
}

TEST_CASE("With sharing the topology command shows the resource, the replicas and the allocatable",
          "[topology-report][sharing]") {
  SimRoot sim("p5.48xlarge");
  const std::string plain = FormatTopologyTable(Report(sim));
  const std::string line =
      "Sharing: vpc.amazonaws.com/efa.shared, 4 replicas per EFA (device IDs <ibdev>::0 to "
      "<ibdev>::3): 128 allocatable = 4 x 32 EFAs\n";
  // The table is today's with the sharing line after the EFA count.
  const size_t after_count = plain.find('\n', plain.find("\nEFA count: ") + 1) + 1;
  std::string want = plain;
  want.insert(after_count, line);
  TopologyReport shared = SharedReport(sim, 4, "vpc.amazonaws.com/efa.shared");
  CHECK(FormatTopologyTable(shared) == want);
  CHECK(FormatTopologyDot(shared) == FormatTopologyDot(Report(sim)));
  auto json = nlohmann::json::parse(FormatTopologyJson(shared));
  CHECK(json["sharing"] == nlohmann::json::parse(R"({"replicas": 4,
      "resourceName": "vpc.amazonaws.com/efa.shared", "deviceIds": 128, "allocatable": 128})"));
  CHECK(WithoutSharing(FormatTopologyJson(shared)) ==
        nlohmann::json::parse(FormatTopologyJson(Report(sim))));

  // Without renaming the resource keeps its name (empty: the default).
  for (const char* resource : {"", "vpc.amazonaws.com/efa"}) {
    shared = SharedReport(sim, 2, resource);
    CHECK(FormatTopologyTable(shared).find(
              "\nSharing: vpc.amazonaws.com/efa, 2 replicas per EFA (device IDs <ibdev>::0 to "
              "<ibdev>::1): 64 allocatable = 2 x 32 EFAs\n") != std::string::npos);
    CHECK(nlohmann::json::parse(FormatTopologyJson(shared))["sharing"]["resourceName"] ==
          "vpc.amazonaws.com/efa");
  }

  // An unhealthy EFA's replicas are not allocatable (the kubelet counts the
  // healthy devices); its IDs are still advertised.
  fs::remove(sim.path() / "dev/infiniband/uverbs5");
  shared = SharedReport(sim, 4, "vpc.amazonaws.com/efa.shared");
  CHECK(FormatTopologyTable(shared).find(
            "\nSharing: vpc.amazonaws.com/efa.shared, 4 replicas per EFA (device IDs <ibdev>::0 to "
            "<ibdev>::3): 124 allocatable = 4 x 31 healthy EFAs (1 unhealthy)\n") !=
        std::string::npos);
  json = nlohmann::json::parse(FormatTopologyJson(shared));
  CHECK(json["sharing"]["deviceIds"] == 128);
  CHECK(json["sharing"]["allocatable"] == 124);
}

namespace {

// `command` run by the shell: its exit status (as pclose gives it) and stdout.
std::pair<int, std::string> Run(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  const int status = ::pclose(pipe);
  return std::make_pair(status, out);
}

// The binary's `topology` command on `sim`, with `env` (assignments) and
// `flags`.
std::pair<int, std::string> RunTopology(const SimRoot& sim, const std::string& env,
                                        const std::string& flags) {
  return Run(env + " EFA_SYSFS_ROOT=" + sim.sys().string() +
             " EFA_DEV_ROOT=" + (sim.path() / "dev").string() + " " + efa::testing::kPluginBinary +
             " topology " + flags + " 2>/dev/null");
}

}  // namespace

TEST_CASE("The binary prints the topology and the effective configuration",
          "[topology-report][process]") {
  SimRoot sim("p6-b200.48xlarge");
  const std::string bin = efa::testing::kPluginBinary;
  auto [status, out] = RunTopology(sim, "", "--format dot");
  CHECK(status == 0);
  CHECK(out == FormatTopologyDot(Report(sim)));

  std::tie(status, out) =
      Run("EFA_LOG_LEVEL=debug EFA_RESCAN_INTERVAL=3s " + bin +
          " --print-config --rescan-interval=250ms 2>&1 | grep -E '^(logLevel|rescanInterval):'");
  CHECK(status == 0);
  CHECK(out ==
        "rescanInterval: 250ms  # from --rescan-interval\n"
        "logLevel: debug  # from EFA_LOG_LEVEL\n");

  std::tie(status, out) = Run("EFA_LOG_LEVEL=loud " + bin + " --print-config 2>&1");
  CHECK(WEXITSTATUS(status) == 2);
  CHECK(out == "EFA_LOG_LEVEL: expected one of trace, debug, info, warn, error, got \"loud\"\n");
}

TEST_CASE("The binary's topology command shows sharing as configured, nothing with replicas 1",
          "[topology-report][sharing][process]") {
  SimRoot sim("p5.48xlarge");
  // Today's output: no sharing setting, or replicas 1 by flag or
  // environment, renaming or not.
  const auto plain = RunTopology(sim, "", "");
  REQUIRE(plain.first == 0);
  CHECK(plain.second == FormatTopologyTable(Report(sim)));
  for (const auto& [env, flags] : std::vector<std::pair<std::string, std::string>>{
           {"EFA_SHARING_REPLICAS=1", ""},
           {"", "--sharing-replicas 1"},
           {"EFA_SHARING_REPLICAS=4", "--sharing-replicas 1 --sharing-rename-by-default"}}) {
    INFO(env << " " << flags);
    CHECK(RunTopology(sim, env, flags) == plain);
    CHECK(RunTopology(sim, env, flags + " --format json") ==
          std::make_pair(0, FormatTopologyJson(Report(sim))));
  }

  // Sharing: the line names the resource the daemon would register.
  CHECK(RunTopology(sim, "EFA_SHARING_REPLICAS=4", "") ==
        std::make_pair(0, FormatTopologyTable(SharedReport(sim, 4, "vpc.amazonaws.com/efa"))));
  const auto renamed =
      RunTopology(sim, "EFA_SHARING_RENAME_BY_DEFAULT=true", "--sharing-replicas 4");
  REQUIRE(renamed.first == 0);
  CHECK(renamed.second ==
        FormatTopologyTable(SharedReport(sim, 4, "vpc.amazonaws.com/efa.shared")));
  CHECK(renamed.second.find("\nSharing: vpc.amazonaws.com/efa.shared, 4 replicas per EFA") !=
        std::string::npos);
  const auto json =
      RunTopology(sim, "", "--sharing-replicas 4 --sharing-rename-by-default --format json");
  REQUIRE(json.first == 0);
  CHECK(nlohmann::json::parse(json.second)["sharing"] ==
        nlohmann::json::parse(R"({"replicas": 4, "resourceName": "vpc.amazonaws.com/efa.shared",
                                  "deviceIds": 128, "allocatable": 128})"));
}
