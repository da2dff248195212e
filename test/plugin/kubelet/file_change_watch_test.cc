// FileChangeWatch on a real inotify, in a temporary directory tree.
#include "plugin/kubelet/file_change_watch.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "test/support/descriptor_table_full.h"
#include "test/support/sanitized.h"
#include "test/support/temp_dir.h"

namespace fs = std::filesystem;
using efa::plugin::FileChangeWatch;

TEST_CASE("A file's watch reports its writes and its removal, and nothing else", "[kubelet]") {
  efa::testing::TempDir tmp;
  const fs::path file = tmp.path() / "dir/kubelet.sock";
  fs::create_directories(file.parent_path());
  FileChangeWatch watch(file);
  CHECK(watch.Changed());  // the first call
  CHECK_FALSE(watch.Changed());
  std::ofstream(file) << "x";
  CHECK(watch.Changed());
  CHECK_FALSE(watch.Changed());
  std::ofstream(tmp.path() / "dir/other") << "y";
  CHECK_FALSE(watch.Changed());
  fs::remove(file);
  CHECK(watch.Changed());
}

TEST_CASE(
    "While a file's directory is absent its watch answers false, until the directory and then "
    "the file appear",
    "[kubelet]") {
  efa::testing::TempDir tmp;
  // Two levels missing, as a kubelet dir before the kubelet first ran.
  const fs::path file = tmp.path() / "kubelet/pod-resources/kubelet.sock";
  FileChangeWatch watch(file);
  CHECK(watch.Changed());  // the first call: the caller looks once
  // No call looks at the file system meanwhile: nothing on the way changed.
  CHECK_FALSE(watch.Changed());
  CHECK_FALSE(watch.Changed());
  fs::create_directories(tmp.path() / "kubelet");
  CHECK_FALSE(watch.Changed());  // its directory is still absent
  std::ofstream(tmp.path() / "unrelated") << "z";
  CHECK_FALSE(watch.Changed());
  fs::create_directories(file.parent_path());
  CHECK(watch.Changed());  // the directory came: the caller looks again
  CHECK_FALSE(watch.Changed());
  std::ofstream(file) << "x";
  CHECK(watch.Changed());
  // The directory goes and comes back, with the file.
  fs::remove_all(tmp.path() / "kubelet");
  CHECK(watch.Changed());
  CHECK_FALSE(watch.Changed());
  fs::create_directories(file.parent_path());
  std::ofstream(file) << "x";
  CHECK(watch.Changed());
}

TEST_CASE("Without an inotify instance every call is true, until one is given", "[kubelet]") {
  if (efa::testing::kSanitized) {
    WARN("not run: a sanitizer's runtime needs descriptors");
    return;
  }
  efa::testing::TempDir tmp;
  const fs::path file = tmp.path() / "dir/kubelet_internal_checkpoint";
  fs::create_directories(file.parent_path());
  FileChangeWatch watch(file);
  {
    // uid 0's max_user_instances reached: EMFILE, as with no descriptor.
    efa::testing::DescriptorTableFull full;
    CHECK(watch.Changed());
    CHECK(watch.Changed());  // nothing watched: the caller looks every time
  }
  CHECK(watch.Changed());  // watched from now on; a change before is not missed
  CHECK_FALSE(watch.Changed());
  std::ofstream(file) << "x";
  CHECK(watch.Changed());
  CHECK_FALSE(watch.Changed());
}
