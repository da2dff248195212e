#include "plugin/alignment/cdi_spec.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "plugin/device_plugin_service.h"
#include "test/sim/sim_root.h"
#include "test/support/temp_dir.h"
#include "topology/efa_discovery.h"

namespace fs = std::filesystem;
using namespace efa::plugin;
using efa::testing::DirEntries;
using efa::testing::ReadFile;

namespace {

efa::topology::EfaDevice Efa(const std::string& ibdev, int uverbs, const std::string& pci) {
  efa::topology::EfaDevice d;
  d.ibdev = ibdev;
  d.uverbs = "uverbs" + std::to_string(uverbs);
  d.uverbs_path = "/host/dev/infiniband/" + d.uverbs;
  d.pci = *efa::topology::PciAddress::Parse(pci);
  return d;
}

}  // namespace

TEST_CASE("A claim is named by the set of the kubelet's IDs, in any order", "[late-binding]") {
  // Golden values: the names are written to disk and must not change.
  CHECK(ClaimName({"rdmap79s0", "rdmap80s0"}) == "claim-24db4ff60c275c9d");
  CHECK(ClaimName({"rdmap80s0", "rdmap79s0"}) == "claim-24db4ff60c275c9d");
  CHECK(ClaimName({"rdmap80s0"}) == "claim-594ddaedef8ff370");
  CHECK(ClaimName({"ab", "c"}) != ClaimName({"a", "bc"}));
  // The same IDs under the shared name (given after sharing's rename while
  // a container holds them under the other) are another claim.
  CHECK(ClaimName({"rdmap79s0::0"}, kResourceName) == ClaimName({"rdmap79s0::0"}));
  CHECK(ClaimName({"rdmap79s0::0"}, kSharedResourceName) != ClaimName({"rdmap79s0::0"}));
  CHECK(ClaimName({"rdmap80s0"}, kSharedResourceName) == "claim-f6d9699acdd2c451");
  CHECK(CdiDeviceName("claim-594ddaedef8ff370") == "vpc.amazonaws.com/efa=claim-594ddaedef8ff370");
  CHECK(CdiSpecFileName("claim-1") == "vpc.amazonaws.com-efa_claim-1.json");
  CHECK(ClaimOfSpecFile("vpc.amazonaws.com-efa_claim-1.json") == "claim-1");
  CHECK(ClaimOfSpecFile("vpc.amazonaws.com-efa_.json").empty());
  CHECK(ClaimOfSpecFile("k8s.device-plugin.nvidia.com-mofed.json").empty());
  CHECK(ClaimOfSpecFile(".vpc.amazonaws.com-efa_claim-1.json.abcdef.tmp").empty());
}

TEST_CASE("The CDI annotation key keeps the CDI library's rules for any claim", "[late-binding]") {
  CHECK(CdiAnnotationKey("claim-594ddaedef8ff370") ==
        "cdi.k8s.io/vpc.amazonaws.com-efa_claim-594ddaedef8ff370");
  // The rules of AnnotationKey() in the CDI library (pkg/cdi/annotations.go),
  // which runtimes parse the annotation with: after the prefix, at most 63
  // characters, alphanumeric at both ends, [A-Za-z0-9_.-] between.
  const std::string prefix = "cdi.k8s.io/";
  for (const auto& ids : std::vector<std::vector<std::string>>{
           {"rdmap79s0"}, {"rdmap79s0::63", "rdmap80s0::0"}, {std::string(300, 'x')}}) {
    const std::string key = CdiAnnotationKey(ClaimName(ids));
    INFO(key);
    REQUIRE(key.rfind(prefix, 0) == 0);
    const std::string name = key.substr(prefix.size());
    CHECK(name.size() <= 63);
    CHECK(std::isalnum(static_cast<unsigned char>(name.front())));
    CHECK(std::isalnum(static_cast<unsigned char>(name.back())));
    for (char c : name) {
      CHECK((std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'));
    }
  }
}

TEST_CASE("The CDI spec names the uverbs nodes and the env of best-effort Allocate",
          "[late-binding]") {
  const std::string spec = CdiSpecJson(
      "claim-1", {Efa("rdmap79s0", 0, "0000:4f:00.0"), Efa("rdmap80s0", 1, "0000:50:00.0")});
  CHECK(spec ==
        "{\"cdiVersion\":\"0.5.0\",\"kind\":\"vpc.amazonaws.com/efa\",\"devices\":[{\"name\":"
        "\"claim-1\",\"containerEdits\":{\"deviceNodes\":[{\"path\":\"/dev/infiniband/uverbs0\","
        "\"hostPath\":\"/host/dev/infiniband/uverbs0\",\"permissions\":\"rw\"},{\"path\":\"/dev/"
        "infiniband/uverbs1\",\"hostPath\":\"/host/dev/infiniband/uverbs1\",\"permissions\":"
        "\"rw\"}],\"env\":[\"EFA_DEVICES=rdmap79s0,rdmap80s0\",\"EFA_PCI_ADDRESSES=0000:4f:00.0,"
        "0000:50:00.0\"]}}]}\n");
  auto efas = ParseCdiSpec(spec, "claim-1", "f.json");
  REQUIRE(efas.ok());
  CHECK(*efas == std::vector<std::string>{"rdmap79s0", "rdmap80s0"});
}

TEST_CASE("A spec that is not ours is refused with a message naming the file", "[late-binding]") {
  struct Case {
    std::string json;
    std::string error;
  };
  const std::vector<Case> cases = {
      {"{\"cdiVersion\":\"0.5.0\",\"kind\":\"vpc.amazon", "f.json: invalid JSON"},
      {"[1]", "f.json: expected a JSON object"},
      {"{\"kind\":\"nvidia.com/gpu\"}",
       "f.json: kind: expected \"vpc.amazonaws.com/efa\", got \"nvidia.com/gpu\""},
      {"{\"kind\":\"vpc.amazonaws.com/efa\",\"devices\":[{\"name\":\"claim-2\"}]}",
       "f.json: devices: expected one device named \"claim-1\""},
      {"{\"kind\":\"vpc.amazonaws.com/efa\",\"devices\":[{\"name\":\"claim-1\"}]}",
       "f.json: devices[0].containerEdits.env: missing"},
      {"{\"kind\":\"vpc.amazonaws.com/efa\",\"devices\":[{\"name\":\"claim-1\","
       "\"containerEdits\":{\"env\":[\"X=1\"]}}]}",
       "f.json: devices[0].containerEdits.env: no EFA_DEVICES"},
      {"{\"kind\":\"vpc.amazonaws.com/efa\",\"devices\":[{\"name\":\"claim-1\","
       "\"containerEdits\":{\"env\":[\"EFA_DEVICES=\"]}}]}",
       "f.json: devices[0].containerEdits.env: EFA_DEVICES= is empty"},
  };
  for (const Case& c : cases) {
    INFO(c.json);
    auto efas = ParseCdiSpec(c.json, "claim-1", "f.json");
    REQUIRE_FALSE(efas.ok());
    CHECK(efas.status().message() == c.error);
  }
}

TEST_CASE("WriteFileAtomically replaces the file whole, mode 0644, leaving no temporary file",
          "[late-binding]") {
  efa::sim::SimRoot sim("p5.48xlarge");
  const fs::path dir = sim.path() / "cdi";
  fs::create_directories(dir);
  const fs::path path = dir / "vpc.amazonaws.com-efa_claim-1.json";
  REQUIRE(WriteFileAtomically(path, "old\n", 0644).ok());
  REQUIRE(WriteFileAtomically(path, "new\n", 0644).ok());
  CHECK(ReadFile(path) == "new\n");
  CHECK((fs::status(path).permissions() & fs::perms::all) ==
        (fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
         fs::perms::others_read));
  CHECK(DirEntries(dir) == std::vector<std::string>{"vpc.amazonaws.com-efa_claim-1.json"});

  SECTION("a directory that is a file") {
    const fs::path file = sim.path() / "not-a-dir";
    std::ofstream(file) << "x";
    absl::Status status = WriteFileAtomically(file / "spec.json", "x", 0644);
    CHECK(status.message() == file.string() + ": Not a directory");
    CHECK(ReadFile(file) == "x");
  }
  SECTION("a missing directory") {
    absl::Status status = WriteFileAtomically(dir / "gone" / "spec.json", "x", 0644);
    CHECK(status.message() == (dir / "gone").string() + ": No such file or directory");
  }
  SECTION("a read-only directory (not as root: root writes anyway)") {
    if (::geteuid() != 0) {
      fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec);
      absl::Status status = WriteFileAtomically(path, "newer\n", 0644);
      fs::permissions(dir, fs::perms::owner_all);
      CHECK(status.message() == dir.string() + ": Permission denied");
      CHECK(ReadFile(path) == "new\n");
      CHECK(DirEntries(dir) == std::vector<std::string>{"vpc.amazonaws.com-efa_claim-1.json"});
    }
  }
}
