// The command line of efa-k8s-device-plugin-idle (plugin/idle_main.cc): the
// daemon writes it (plugin/main.cc, ExecIdleProcess) and the idle process
// reads it, both from this one struct, so the two cannot drift apart.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "plugin/runtime/http_server.h"
#include "plugin/runtime/logging.h"

namespace efa::plugin {

// Every value is the daemon's configuration's (no defaults here).
struct IdleArgs {
  std::string sysfs_root;
  std::string dev_root;
  std::chrono::milliseconds rescan_interval{};
  std::string metrics_address;
  std::string probe_address;
  EndpointLimits limits;
  std::string instance_type;
  int expected_efa_count = 0;
  LogLevel log_level{};
  LogFormat log_format{};
  // The daemon's command line (its binary first), after `--`.
  std::vector<std::string> daemon;
};

// The arguments that AddIdleOptions() reads back into `args` (no argv[0]).
std::vector<std::string> IdleArgv(const IdleArgs& args);
// Adds to `app` the options that fill `args`; a duration or a count that
// is not positive, or an unknown log level or format, fails the parse
// naming the option.
void AddIdleOptions(CLI::App& app, IdleArgs& args);

}  // namespace efa::plugin
