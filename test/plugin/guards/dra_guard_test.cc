#include "plugin/guards/dra_guard.h"

#include <catch2/catch.hpp>
#include <fstream>

#include "test/plugin/guard_fakes.h"

using namespace efa::plugin;
using efa::testing::FakeDraDriver;
using efa::testing::TempDir;

TEST_CASE("IsDraRegistrationName matches the driver's registration socket names exactly", "[dra]") {
  CHECK(IsDraRegistrationName("dra.net-reg.sock", "dra.net"));
  // Rolling updates: the pod UID between the name and the suffix.
  CHECK(IsDraRegistrationName("dra.net-11111111-2222-3333-4444-555555555555-reg.sock", "dra.net"));
  // Names that merely contain the driver's are other drivers' (or none).
  for (const char* other :
       {"dra.net.sock", "foo.dra.net-reg.sock", "dra.network-reg.sock", "dra.net-reg.sock.tmp",
        "xdra.net-reg.sock", "dra.net-x-reg.sock", "dra.net--reg.sock",
        "dra.net-11111111-2222-3333-4444-55555555555G-reg.sock",
        "dra.net-111111112-222-3333-4444-555555555555-reg.sock", "ebs.csi.aws.com-reg.sock",
        "gpu.nvidia.com-reg.sock", "dra.net"}) {
    INFO(other);
    CHECK_FALSE(IsDraRegistrationName(other, "dra.net"));
  }
  CHECK_FALSE(IsDraRegistrationName("anything", ""));
}

TEST_CASE(
    "DetectDraDriver ignores a listening socket of another driver whose name contains "
    "dra.net",
    "[dra]") {
  TempDir dir;
  const auto registry = dir.path() / "plugins_registry";
  FakeDraDriver other(registry, "foo.dra.net-reg.sock");
  other.Start();
  DraReport report = DetectDraDriver(registry, "dra.net");
  CHECK_FALSE(report.present);
  CHECK(report.evidence == "no dra.net registration socket in " + registry.string());
}

TEST_CASE("DetectDraDriver finds a listening dra.net registration socket", "[dra]") {
  TempDir dir;
  const auto registry = dir.path() / "plugins_registry";

  auto no_dir = DetectDraDriver(registry);
  CHECK_FALSE(no_dir.present);
  CHECK(no_dir.evidence == "no dra.net registration socket in " + registry.string());

  FakeDraDriver other(registry, "ebs.csi.aws.com-reg.sock");
  other.Start();
  CHECK_FALSE(DetectDraDriver(registry).present);

  FakeDraDriver driver(registry);
  driver.Start();
  auto present = DetectDraDriver(registry);
  CHECK(present.present);
  CHECK(present.evidence == driver.socket_path().string() +
                                ": the dra.net DRA driver's registration socket accepts "
                                "connections");

  driver.Stop();
  CHECK_FALSE(DetectDraDriver(registry).present);
}

TEST_CASE("DetectDraDrivers sees the configured drivers and no other", "[dra]") {
  TempDir dir;
  const auto registry = dir.path() / "plugins_registry";
  const std::vector<std::string> configured = {"dra.net", "efa.dra.example.com"};
  CHECK(DetectDraDrivers(registry, configured).evidence ==
        "no dra.net or efa.dra.example.com registration socket in " + registry.string());

  // A driver of another name: seen only when configured.
  FakeDraDriver efa(registry, "efa.dra.example.com-reg.sock");
  efa.Start();
  auto seen = DetectDraDrivers(registry, configured);
  CHECK(seen.present);
  CHECK(seen.driver == "efa.dra.example.com");
  CHECK(seen.evidence == efa.socket_path().string() +
                             ": the efa.dra.example.com DRA driver's registration socket accepts "
                             "connections");
  CHECK_FALSE(DetectDraDrivers(registry, {"dra.net"}).present);
  efa.Stop();

  // dra.net installed for ENA interfaces only: left out of the list, it is
  // not seen.
  FakeDraDriver dranet(registry);
  dranet.Start();
  CHECK(DetectDraDrivers(registry, configured).driver == "dra.net");
  CHECK_FALSE(DetectDraDrivers(registry, {"efa.dra.example.com"}).present);
  CHECK(DetectDraDrivers(registry, {}).evidence ==
        "no DRA driver to look for (draDrivers is empty)");
  CHECK_FALSE(DetectDraDrivers(registry, {}).present);
}

TEST_CASE("DetectDraDriver ignores a stale socket and a plain file", "[dra]") {
  TempDir dir;
  const auto registry = dir.path() / "plugins_registry";
  FakeDraDriver driver(registry);
  driver.Start();
  driver.Crash();  // the file stays, nothing listens
  auto stale = DetectDraDriver(registry);
  CHECK_FALSE(stale.present);
  CHECK(stale.evidence ==
        driver.socket_path().string() + ": refuses connections (stale: Connection refused)");

  std::filesystem::remove(driver.socket_path());
  std::ofstream(registry / "dra.net-reg.sock") << "not a socket";
  CHECK_FALSE(DetectDraDriver(registry).present);
}

TEST_CASE("DetectDraDriver tells an incomplete look from an empty registry", "[dra]") {
  TempDir dir;
  const auto registry = dir.path() / "plugins_registry";
  // No registry at all: a complete answer, no driver.
  DraReport none = DetectDraDriver(registry);
  CHECK_FALSE(none.present);
  CHECK(none.error.empty());
  CHECK(none.evidence == "no dra.net registration socket in " + registry.string());
  // A registry that cannot be listed says nothing of the driver.
  std::ofstream(registry) << "not a directory";
  DraReport unlisted = DetectDraDriver(registry);
  CHECK_FALSE(unlisted.present);
  CHECK(unlisted.error == "cannot list " + registry.string() + ": Not a directory");
  // A stale socket is a complete answer too.
  std::filesystem::remove(registry);
  FakeDraDriver driver(registry);
  driver.Start();
  driver.Crash();
  CHECK(DetectDraDriver(registry).error.empty());
}

TEST_CASE("DRA policies have one name each", "[dra]") {
  CHECK(DraPolicyNames().size() == 3);
  CHECK(DraPolicyName(DraPolicy::kYield) == "yield");
  CHECK(DraPolicyName(DraPolicy::kIgnore) == "ignore");
  CHECK(DraPolicyName(DraPolicy::kMonitor) == "monitor");
}
