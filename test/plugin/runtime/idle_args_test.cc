// The idle process's command line: what the daemon writes, the idle
// process reads back unchanged.
#include "plugin/runtime/idle_args.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <utility>
#include <vector>

using namespace efa::plugin;

namespace {

// Parses `argv` (without argv[0]) as the idle process does; the error
// message when the parse fails, else "".
std::string Parse(std::vector<std::string> argv, IdleArgs& out) {
  CLI::App app;
  AddIdleOptions(app, out);
  std::reverse(argv.begin(), argv.end());  // CLI11 takes them last first
  try {
    app.parse(argv);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

// Each of `names` written into `field` is read back as itself.
template <typename E>
void CheckEveryName(const std::vector<std::pair<E, std::string>>& names, E IdleArgs::*field) {
  for (const auto& entry : names) {
    IdleArgs written;
    written.*field = entry.first;
    written.rescan_interval = std::chrono::seconds(10);
    written.daemon = {"/d"};
    IdleArgs read;  // starts at another value, so a name ignored shows
    read.*field = entry.first == names.front().first ? names.back().first : names.front().first;
    INFO(entry.second);
    REQUIRE(Parse(IdleArgv(written), read).empty());
    CHECK(read.*field == entry.first);
  }
}

}  // namespace

TEST_CASE("The idle process reads back every argument the daemon writes", "[idle]") {
  IdleArgs written;
  written.sysfs_root = "/host/sys";
  written.dev_root = "/host/dev";
  written.rescan_interval = std::chrono::milliseconds(2500);
  written.metrics_address = ":9090";
  written.probe_address = "127.0.0.1:9091";
  written.limits = {.metrics_connections = 7,
                    .probe_connections = 3,
                    .request_timeout = std::chrono::milliseconds(1200)};
  written.instance_type = "p5.48xlarge";
  written.expected_efa_count = 32;
  written.log_level = LogLevel::kDebug;
  written.log_format = LogFormat::kJson;
  written.daemon = {"/usr/bin/efa-k8s-device-plugin", "--replicas", "2", "--", "x"};

  IdleArgs read;
  REQUIRE(Parse(IdleArgv(written), read).empty());
  CHECK(read.sysfs_root == written.sysfs_root);
  CHECK(read.dev_root == written.dev_root);
  CHECK(read.rescan_interval == written.rescan_interval);
  CHECK(read.metrics_address == written.metrics_address);
  CHECK(read.probe_address == written.probe_address);
  CHECK(read.limits.metrics_connections == 7);
  CHECK(read.limits.probe_connections == 3);
  CHECK(read.limits.request_timeout == std::chrono::milliseconds(1200));
  CHECK(read.instance_type == written.instance_type);
  CHECK(read.expected_efa_count == 32);
  CHECK(read.log_level == LogLevel::kDebug);
  CHECK(read.log_format == LogFormat::kJson);
  CHECK(read.daemon == written.daemon);
}

TEST_CASE("Every log level and format name round-trips through the idle command line", "[idle]") {
  CheckEveryName(LogLevelNames(), &IdleArgs::log_level);
  CheckEveryName(LogFormatNames(), &IdleArgs::log_format);
}

TEST_CASE("The idle process refuses a rescan interval that is not positive", "[idle]") {
  IdleArgs written;
  written.daemon = {"/d"};
  std::vector<std::string> argv = IdleArgv(written);
  argv[5] = "0";  // after --rescan-interval-ms
  REQUIRE(argv[4] == "--rescan-interval-ms");
  IdleArgs read;
  CHECK(Parse(argv, read).find("--rescan-interval-ms") != std::string::npos);
}
