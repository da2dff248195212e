#include "plugin/runtime/idle_args.h"

#include <cstdint>
#include <map>

namespace efa::plugin {
namespace {

template <typename E>
std::map<std::string, E> ByName(const std::vector<std::pair<E, std::string>>& names) {
  std::map<std::string, E> by_name;
  for (const auto& entry : names) by_name.emplace(entry.second, entry.first);
  return by_name;
}

template <typename E>
std::string NameOf(E value, const std::vector<std::pair<E, std::string>>& names) {
  for (const auto& entry : names) {
    if (entry.first == value) return entry.second;
  }
  return "";
}

}  // namespace

std::vector<std::string> IdleArgv(const IdleArgs& args) {
  std::vector<std::string> argv = {"--sysfs-root",
                                   args.sysfs_root,
                                   "--dev-root",
                                   args.dev_root,
                                   "--rescan-interval-ms",
                                   std::to_string(args.rescan_interval.count()),
                                   "--metrics-address",
                                   args.metrics_address,
                                   "--probe-address",
                                   args.probe_address,
                                   "--metrics-max-connections",
                                   std::to_string(args.limits.metrics_connections),
                                   "--probe-max-connections",
                                   std::to_string(args.limits.probe_connections),
                                   "--http-request-timeout-ms",
                                   std::to_string(args.limits.request_timeout.count()),
                                   "--instance-type",
                                   args.instance_type,
                                   "--expected-efa-count",
                                   std::to_string(args.expected_efa_count),
                                   "--log-level",
                                   NameOf(args.log_level, LogLevelNames()),
                                   "--log-format",
                                   NameOf(args.log_format, LogFormatNames()),
                                   "--"};
  argv.insert(argv.end(), args.daemon.begin(), args.daemon.end());
  return argv;
}

void AddIdleOptions(CLI::App& app, IdleArgs& args) {
  app.add_option("--sysfs-root", args.sysfs_root);
  app.add_option("--dev-root", args.dev_root);
  app.add_option_function<int64_t>(
         "--rescan-interval-ms",
         [&args](int64_t ms) { args.rescan_interval = std::chrono::milliseconds(ms); })
      ->check(CLI::PositiveNumber);
  app.add_option("--metrics-address", args.metrics_address);
  app.add_option("--probe-address", args.probe_address);
  app.add_option("--metrics-max-connections", args.limits.metrics_connections)
      ->check(CLI::PositiveNumber);
  app.add_option("--probe-max-connections", args.limits.probe_connections)
      ->check(CLI::PositiveNumber);
  app.add_option_function<int64_t>(
         "--http-request-timeout-ms",
         [&args](int64_t ms) { args.limits.request_timeout = std::chrono::milliseconds(ms); })
      ->check(CLI::PositiveNumber);
  app.add_option("--instance-type", args.instance_type);
  app.add_option("--expected-efa-count", args.expected_efa_count);
  app.add_option("--log-level", args.log_level)
      ->transform(CLI::CheckedTransformer(ByName(LogLevelNames())));
  app.add_option("--log-format", args.log_format)
      ->transform(CLI::CheckedTransformer(ByName(LogFormatNames())));
  app.add_option("daemon", args.daemon, "The daemon's command line, after --")->required();
}

}  // namespace efa::plugin
