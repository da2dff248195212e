#include "topology/sysfs.h"

#include <catch2/catch.hpp>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "test/support/descriptor_table_full.h"
#include "test/support/sanitized.h"
#include "test/support/temp_dir.h"

namespace fs = std::filesystem;
using namespace efa::topology;

TEST_CASE("sysfs parsers accept what the kernel writes", "[topology]") {
  CHECK(*ParseHex("0x1d0f\n") == 0x1d0f);
  CHECK(*ParseHex("EFA1") == 0xefa1);
  CHECK(*ParseInt("-1\n") == -1);
  CHECK(*ParseInt(" 7 ") == 7);
  CHECK(*ParseDevNumbers("231:192\n") == std::pair<uint32_t, uint32_t>{231, 192});
}

TEST_CASE("sysfs parsers quote the garbage they reject", "[topology]") {
  CHECK(ParseHex("0xzz").status().message() == "expected a hexadecimal number, got \"0xzz\"");
  CHECK(ParseHex("").status().message() == "expected a hexadecimal number, got \"\"");
  CHECK(ParseHex("0x1ffffffff").status().message() ==
        "expected a hexadecimal number, got \"0x1ffffffff\"");
  CHECK(ParseInt("abc\x01").status().message() == "expected an integer, got \"abc\\x01\"");
  CHECK(ParseInt("1.5").status().message() == "expected an integer, got \"1.5\"");
  CHECK(ParseDevNumbers("231").status().message() ==
        "expected a device number like \"231:192\", got \"231\"");
  CHECK(ParseDevNumbers("231:").status().message() ==
        "expected a device number like \"231:192\", got \"231:\"");
  CHECK(ParseDevNumbers(":5").status().message() ==
        "expected a device number like \"231:192\", got \":5\"");
}

TEST_CASE("sysfs reads name the path on failure", "[topology]") {
  const fs::path dir = fs::temp_directory_path() / "efa-sysfs-test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "numa_node") << "garbage\n";
  fs::create_symlink(dir / "nowhere", dir / "dangling");

  CHECK(ReadAttribute(dir / "missing").status().message() ==
        (dir / "missing").string() + ": No such file or directory");
  CHECK(ReadIntAttribute(dir / "numa_node").status().message() ==
        (dir / "numa_node").string() + ": expected an integer, got \"garbage\"");
  CHECK(ResolvePath(dir / "dangling").status().message() ==
        (dir / "dangling").string() + ": dangling link to " + (dir / "nowhere").string());
  CHECK(ListDirectory(dir / "missing").status().code() == absl::StatusCode::kNotFound);
  CHECK(*ListDirectory(dir) == std::vector<std::string>{"dangling", "numa_node"});
  fs::remove_all(dir);
}

TEST_CASE("The RDMA subsystem's network namespace mode is read from ib_core's parameter",
          "[topology]") {
  efa::testing::TempDir dir;
  // No ib_core: nothing to say, and no error.
  REQUIRE(ReadRdmaNetnsShared(dir.path()).ok());
  CHECK_FALSE(ReadRdmaNetnsShared(dir.path())->has_value());
  const std::filesystem::path params = dir.path() / "module/ib_core/parameters";
  std::filesystem::create_directories(params);
  for (const auto& [text, shared] : std::vector<std::pair<std::string, bool>>{
           {"Y\n", true}, {"N\n", false}, {"1", true}, {"0", false}}) {
    CAPTURE(text);
    std::ofstream(params / "netns_mode") << text;
    REQUIRE(ReadRdmaNetnsShared(dir.path()).ok());
    CHECK(ReadRdmaNetnsShared(dir.path())->value() == shared);
  }
  // What says neither, and what cannot be read: errors naming the file.
  const std::string path = (params / "netns_mode").string();
  std::ofstream(params / "netns_mode") << "maybe\n";
  CHECK(ReadRdmaNetnsShared(dir.path()).status().message() ==
        path + ": expected Y or N, got \"maybe\"");
  std::filesystem::remove(params / "netns_mode");
  std::filesystem::create_directory(params / "netns_mode");
  CHECK(ReadRdmaNetnsShared(dir.path()).status().message().find(path) == 0);
}

TEST_CASE("The bounded reader reads up to its limit and keeps errno in its errors", "[topology]") {
  efa::testing::TempDir dir;
  std::ofstream(dir.path() / "exact") << std::string(20000, 'x');  // more than one read()
  std::ofstream(dir.path() / "empty");

  absl::StatusOr<std::string> exact = ReadFileBounded(dir.path() / "exact", 20000);
  REQUIRE(exact.ok());
  CHECK(*exact == std::string(20000, 'x'));
  CHECK(ReadFileBounded(dir.path() / "empty", 0).value().empty());

  absl::Status longer = ReadFileBounded(dir.path() / "exact", 19999).status();
  CHECK(longer.code() == absl::StatusCode::kResourceExhausted);
  CHECK(longer.message() == (dir.path() / "exact").string() + ": larger than 19999 bytes");
  CHECK(ReadFileBounded(dir.path() / "exact", 16 * 1024).status().message() ==
        (dir.path() / "exact").string() + ": larger than 16 KiB");

  absl::Status missing = ReadFileBounded(dir.path() / "missing", 100).status();
  CHECK(missing.code() == absl::StatusCode::kNotFound);
  CHECK(missing.message() == (dir.path() / "missing").string() + ": No such file or directory");
  absl::Status directory = ReadFileBounded(dir.path(), 100).status();
  CHECK(directory.code() == absl::StatusCode::kFailedPrecondition);  // EISDIR
  CHECK(directory.message() == dir.path().string() + ": Is a directory");
}

TEST_CASE("Read errors keep their errno and say whether read() gave it", "[topology]") {
  efa::testing::TempDir dir;
  // An open that fails: ENOENT, not on read.
  absl::Status missing = ReadFileBounded(dir.path() / "missing", 100).status();
  CHECK(ErrnoOf(missing) == ENOENT);
  CHECK_FALSE(FailedOnRead(missing));
  // A file that opens but whose read() fails, as a driver's show() can:
  // reading /proc/self/mem at address 0 gives EIO.
  fs::create_symlink("/proc/self/mem", dir.path() / "mem");
  absl::Status eio = ReadFileBounded(dir.path() / "mem", 100).status();
  CHECK(eio.message() == (dir.path() / "mem").string() + ": Input/output error");
  CHECK(ErrnoOf(eio) == EIO);
  CHECK(FailedOnRead(eio));
  // A listing that fails keeps its errno too; a parse error has none.
  fs::create_symlink("loop", dir.path() / "loop");
  CHECK(ErrnoOf(ListDirectory(dir.path() / "loop").status()) == ELOOP);
  std::ofstream(dir.path() / "garbage") << "x\n";
  CHECK(ErrnoOf(ReadIntAttribute(dir.path() / "garbage").status()) == 0);
  CHECK(ErrnoOf(absl::OkStatus()) == 0);
}

TEST_CASE("Only a shortage of the process or host counts as a host resource error", "[topology]") {
  for (int err : {EMFILE, ENFILE, ENOMEM, ENOBUFS, EAGAIN, EINTR}) {
    CAPTURE(err);
    CHECK(IsHostResourceError(err));
  }
  for (int err : {0, ENOENT, ENODEV, ENXIO, EIO, ETIME, EACCES, ELOOP, EISDIR, EINVAL}) {
    CAPTURE(err);
    CHECK_FALSE(IsHostResourceError(err));
  }
}

TEST_CASE("A directory that cannot be opened for want of descriptors is EMFILE, not NotFound",
          "[topology]") {
  if (efa::testing::kSanitized) {
    WARN("not run under a sanitizer: its runtime needs descriptors while none are left");
    return;
  }
  efa::testing::TempDir dir;
  absl::Status status;
  {
    efa::testing::DescriptorTableFull full;
    status = ListDirectory(dir.path()).status();
  }
  CHECK(status.message() == dir.path().string() + ": Too many open files");
  CHECK(ErrnoOf(status) == EMFILE);
  CHECK_FALSE(absl::IsNotFound(status));
}
