// The owner loop's inotify instance when the kernel gives none: what is
// counted and logged, and the recovery once descriptors are free again.
#include "plugin/inotify_watches.h"

#include <sys/inotify.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "test/support/descriptor_table_full.h"
#include "test/support/log_capture.h"
#include "test/support/sanitized.h"
#include "test/support/temp_dir.h"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using efa::plugin::InotifyWatches;

namespace {

constexpr uint32_t kEvents = IN_CREATE | IN_DELETE;

}  // namespace

TEST_CASE("Without an inotify instance every directory is refused, logged once, until it comes",
          "[inotify]") {
  if (efa::testing::kSanitized) {
    WARN("not run: a sanitizer's runtime needs descriptors");
    return;
  }
  efa::testing::TempDir dir;
  const fs::path a = dir.path() / "a", b = dir.path() / "b";
  fs::create_directories(a);
  fs::create_directories(b);
  efa::testing::LogCapture log;
  InotifyWatches watches({.rescan_interval = 2s});
  std::vector<std::string> lines;
  {
    efa::testing::DescriptorTableFull full;
    CHECK_FALSE(watches.Open());
    CHECK_FALSE(watches.Open());  // tried again: the same cause, not logged again
    CHECK(watches.fd() < 0);
    const InotifyWatches::Watch watch = watches.Add(a, kEvents);
    CHECK(watch.wd < 0);
    CHECK(watch.refused);
    CHECK(watches.Add(b, kEvents).refused);
    CHECK(watches.Add(dir.path() / "absent", kEvents).refused);  // cannot tell
    CHECK(watches.unavailable() == 3);
    lines = log.Take();
  }
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].starts_with(
      "[warning] cannot create an inotify instance: Too many open files (fs.inotify."
      "max_user_instances: uid 0's instances are shared by every root container on the node); "
      "running on timers: every 2 s the periodic pass looks for what inotify would report"));

  // Descriptors free again: the next pass creates it and watches again.
  CHECK(watches.Open());
  CHECK(watches.fd() >= 0);
  CHECK_FALSE(watches.Open());  // one instance
  CHECK(watches.Add(a, kEvents).wd >= 0);
  CHECK(watches.unavailable() == 2);
  const InotifyWatches::Watch absent = watches.Add(dir.path() / "absent", kEvents);
  CHECK(absent.wd < 0);
  CHECK_FALSE(absent.refused);  // ENOENT: absent, nothing to look at
  CHECK(watches.unavailable() == 1);
  CHECK(watches.Add(b, kEvents).wd >= 0);
  CHECK(watches.unavailable() == 0);
  CHECK(log.Take() ==
        std::vector<std::string>{
            "[info] created an inotify instance (it failed before with: Too many open files); "
            "watching again",
            "[info] inotify watches every directory again: the daemon reacts to changes at once "
            "again, not only at its periodic pass"});
  // Events come on the instance.
  fs::create_directory(b / "new");
  alignas(inotify_event) char buf[4096];
  CHECK(::read(watches.fd(), buf, sizeof buf) >= static_cast<ssize_t>(sizeof(inotify_event)));
}
