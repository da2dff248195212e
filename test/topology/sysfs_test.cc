#include "topology/sysfs.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

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

TEST_CASE("ReadFileBounded reads a whole small file and keeps errno in its status", "[topology]") {
  const fs::path dir = fs::temp_directory_path() / "efa-bounded-read-test";
  fs::remove_all(dir);
  fs::create_directories(dir / "sub");
  std::ofstream(dir / "eight") << "12345678";
  std::ofstream(dir / "big") << std::string((size_t{1} << 20) + 1, 'x');

  CHECK(*ReadFileBounded(dir / "eight", 8) == "12345678");
  CHECK(ReadFileBounded(dir / "eight", 7).status().message() ==
        (dir / "eight").string() + ": larger than 7 bytes");
  CHECK(ReadFileBounded(dir / "big", size_t{1} << 20).status().message() ==
        (dir / "big").string() + ": larger than 1 MiB");
  const auto missing = ReadFileBounded(dir / "missing", 8);
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(missing.status().message() == (dir / "missing").string() + ": No such file or directory");
  const auto directory = ReadFileBounded(dir / "sub", 8);
  CHECK(directory.status().code() == absl::StatusCode::kFailedPrecondition);  // EISDIR
  CHECK(directory.status().message() == (dir / "sub").string() + ": Is a directory");
  fs::remove_all(dir);
}
