// The device tracker on a simulated p4d: what it keeps of the EFAs across
// discoveries, when its periodic look reads sysfs, and the host model.
#include "plugin/device_tracker.h"

#include <sys/inotify.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "test/sim/sim_root.h"
#include "test/support/fake_clock.h"
#include "test/support/log_capture.h"

namespace fs = std::filesystem;
using namespace efa::plugin;
using namespace std::chrono_literals;
using efa::sim::SimRoot;

namespace {

const std::vector<std::string> kP4dEfas = {"rdmap16s27", "rdmap32s27", "rdmap144s27",
                                           "rdmap160s27"};

EfaCounterMonitorOptions Counters(const SimRoot& sim) {
  EfaCounterMonitorOptions options;
  options.sysfs_root = sim.sys();
  return options;
}

// A tracker on a simulated p4d, publishing to a real service, with guards
// that never ran (they advertise every EFA as it is).
struct Tracked {
  SimRoot sim{"p4d.24xlarge"};
  efa::testing::FakeClock clock;
  DevicePluginService service{DevicePluginService::Options{}};
  GuardRunner guards{GuardRunner::Options{}};
  EfaCounterMonitor counters{Counters(sim)};
  // Without `open`, no instance: every directory's watch is refused.
  explicit Tracked(bool open = true) {
    if (open) watches.Open();
  }
  InotifyWatches watches{{}};
  int discoveries = 0;  // inventories the tracker reported
  DeviceTracker tracker{{.roots = sim.roots(),
                         .topology_xml = sim.xml().string(),
                         .instance_type = "p4d.24xlarge",
                         .full_rescan_interval = 5min,
                         .on_inventory = [this](const auto&) { ++discoveries; },
                         .clock = &clock,
                         .watches = &watches},
                        &service,
                        &guards,
                        &counters};

  // The health problem the service lists for `ibdev` ("" when healthy), or
  // "absent".
  std::string Problem(const std::string& ibdev) const {
    const auto table = service.Table();
    const efa::topology::EfaDevice* d = table ? table->FindPhysical(ibdev) : nullptr;
    return d ? d->health_problem : "absent";
  }
  fs::path ClassLink(const std::string& ibdev) const {
    return sim.sys() / "class/infiniband" / ibdev;
  }
};

}  // namespace

TEST_CASE("The device tracker keeps an EFA a complete discovery no longer finds, Unhealthy",
          "[device-tracker]") {
  Tracked t;
  efa::testing::LogCapture log;
  t.tracker.Rescan();
  REQUIRE(t.tracker.known_count() == 4);
  for (const std::string& efa : kP4dEfas) CHECK(t.Problem(efa) == "");
  log.Take();

  fs::remove(t.ClassLink("rdmap32s27"));
  t.tracker.Rescan();
  const std::string gone = t.ClassLink("rdmap32s27").string() + ": gone";
  CHECK(t.tracker.known_count() == 4);
  CHECK(t.Problem("rdmap32s27") == gone);
  CHECK(t.Problem("rdmap16s27") == "");
  CHECK(log.Take() == std::vector<std::string>{"[warning] EFA rdmap32s27 is unhealthy: " + gone});
  t.tracker.Rescan();  // logged once, not at every rescan
  CHECK(log.Take().empty());
  CHECK(t.Problem("rdmap32s27") == gone);
}

TEST_CASE("An incomplete discovery leaves every EFA as it was, and is counted",
          "[device-tracker]") {
  Tracked t;
  t.tracker.Rescan();
  REQUIRE(t.tracker.complete());
  // class/infiniband cannot be listed (a loop: ELOOP) while an EFA goes.
  const fs::path cls = t.sim.sys() / "class/infiniband";
  const fs::path away = t.sim.sys() / "class/infiniband.away";
  fs::rename(cls, away);
  fs::create_symlink("infiniband", cls);
  fs::remove(away / "rdmap32s27");
  t.tracker.Rescan();
  CHECK_FALSE(t.tracker.complete());
  CHECK(t.tracker.discovery_errors().list == 1);
  CHECK(t.tracker.known_count() == 4);
  for (const std::string& efa : kP4dEfas) CHECK(t.Problem(efa) == "");
  // The next periodic look rescans although no uevent was counted, and,
  // complete, sees the EFA gone.
  fs::remove(cls);
  fs::rename(away, cls);
  const int before = t.discoveries;
  t.tracker.PeriodicLook(/*force=*/false);
  CHECK(t.discoveries == before + 1);
  CHECK(t.tracker.complete());
  CHECK(t.Problem("rdmap32s27") == t.ClassLink("rdmap32s27").string() + ": gone");
  CHECK(t.tracker.discovery_errors().list == 1);
}

TEST_CASE("The device tracker's periodic look rescans only when the host may have changed",
          "[device-tracker]") {
  Tracked t;
  const std::string root = t.sim.path().string();
  t.tracker.Rescan();
  REQUIRE(t.discoveries == 1);
  // Unbound from its driver: no event, and no uevent counted yet.
  fs::remove(t.ClassLink("rdmap32s27") / "device/driver");
  for (int look = 0; look < 7; ++look) t.tracker.PeriodicLook(/*force=*/false);
  CHECK(t.discoveries == 1);
  CHECK(t.Problem("rdmap32s27") == "");
  // A uevent counted, and the fingerprint changed.
  REQUIRE(efa::sim::CountUevent(root).ok());
  t.tracker.PeriodicLook(/*force=*/false);
  CHECK(t.discoveries == 2);
  CHECK(t.Problem("rdmap32s27") ==
        (t.ClassLink("rdmap32s27") / "device/driver").string() + ": no driver bound");
  SECTION("forced") {
    t.tracker.PeriodicLook(/*force=*/true);
    CHECK(t.discoveries == 3);
  }
  SECTION("every full_rescan_interval") {
    t.clock.Advance(5min);
    t.tracker.PeriodicLook(/*force=*/false);
    CHECK(t.discoveries == 3);
  }
  SECTION("uevents with the fingerprint unchanged: every sixth look") {
    for (int look = 1; look <= 5; ++look) {
      REQUIRE(efa::sim::CountUevent(root).ok());
      t.tracker.PeriodicLook(/*force=*/false);
    }
    CHECK(t.discoveries == 2);
    REQUIRE(efa::sim::CountUevent(root).ok());
    t.tracker.PeriodicLook(/*force=*/false);
    CHECK(t.discoveries == 3);
  }
}

TEST_CASE("Without a watch on the device directories the periodic look compares the fingerprint",
          "[device-tracker]") {
  // No uevent is counted when a device node goes: only inotify reports
  // it. Without inotify the fingerprint, which covers device nodes, is
  // compared at every look.
  const bool watched = GENERATE(true, false);
  INFO((watched ? "watched" : "no inotify instance"));
  Tracked t(/*open=*/watched);
  t.tracker.Rescan();
  REQUIRE(t.discoveries == 1);
  CHECK(t.watches.unavailable() == (watched ? 0 : 3));
  fs::remove(t.sim.path() / "dev/infiniband/uverbs1");
  t.tracker.PeriodicLook(/*force=*/false);
  if (watched) {
    CHECK(t.discoveries == 1);  // the inotify event's rescan is the daemon's
    CHECK(t.Problem("rdmap32s27") == "");
  } else {
    CHECK(t.discoveries == 2);
    CHECK(t.Problem("rdmap32s27") != "");
    // Nothing changed since: the fingerprint says so, no rescan.
    t.tracker.PeriodicLook(/*force=*/false);
    CHECK(t.discoveries == 2);
  }
}

TEST_CASE("The device tracker builds the host model once per set of EFAs", "[device-tracker]") {
  Tracked t;
  t.tracker.Rescan();
  CHECK(t.tracker.model() == nullptr);
  CHECK(t.service.Table()->model_pending);
  t.tracker.UpdateModel();
  const auto model = t.tracker.model();
  REQUIRE(model != nullptr);
  CHECK(model->instance_type() == "p4d.24xlarge");
  CHECK(model->efas().size() == 4);
  CHECK_FALSE(t.service.Table()->model_pending);
  CHECK(t.service.Table()->model == model);
  // The same EFAs: the model stays.
  t.tracker.Rescan();
  t.tracker.UpdateModel();
  CHECK(t.tracker.model() == model);
  CHECK(t.service.Table()->model == model);
  // One gone: a new model of the three, published pending until built.
  fs::remove(t.ClassLink("rdmap32s27"));
  t.tracker.Rescan();
  CHECK(t.tracker.model() == nullptr);
  CHECK(t.service.Table()->model_pending);
  t.tracker.UpdateModel();
  REQUIRE(t.tracker.model() != nullptr);
  CHECK(t.tracker.model() != model);
  CHECK(t.tracker.model()->efas().size() == 3);
}

TEST_CASE("The device tracker owns the inotify watches of the device directories",
          "[device-tracker]") {
  Tracked t;
  t.tracker.Rescan();
  fs::create_directory(t.sim.path() / "dev/infiniband/new");
  alignas(inotify_event) char buf[4096];
  const ssize_t n = ::read(t.watches.fd(), buf, sizeof buf);
  REQUIRE(n >= static_cast<ssize_t>(sizeof(inotify_event)));
  const auto* ev = reinterpret_cast<const inotify_event*>(buf);
  CHECK(t.tracker.TakeWatchEvent(ev->wd, ev->mask));
  CHECK_FALSE(t.tracker.TakeWatchEvent(ev->wd + 1000, ev->mask));
}
