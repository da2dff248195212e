// The daemon's configuration: one set of options, each settable by a flag
// (--rescan-interval), an environment variable (EFA_RESCAN_INTERVAL) and a
// key of a YAML file (rescanInterval) given with --config or EFA_CONFIG.
// Precedence: flag > environment > file > default. Every field is optional
// so that "not given" differs from a zero or empty value.
//
// Errors name the input first and say what was expected and what was found:
//   config.yaml:12:5: rescanInterval: expected a duration like "10s", got "abc"
//   EFA_LOG_LEVEL: expected one of trace, debug, info, warn, error, got "verbose"
//   --report-numa: expected true or false, got "yes"
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "plugin/daemon.h"
#include "plugin/runtime/http_server.h"
#include "plugin/runtime/logging.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace efa::plugin {

struct Config {
  std::optional<std::string> sysfs_root;
  std::optional<std::string> dev_root;
  std::optional<std::string> proc_root;
  std::optional<std::string> kubelet_dir;
  std::optional<std::string> topology_xml;
  std::optional<std::string> instance_type;
  std::optional<bool> report_numa;
  std::optional<std::chrono::milliseconds> rescan_interval;
  std::optional<LogLevel> log_level;
  std::optional<LogFormat> log_format;
  std::optional<std::string> metrics_address;                     // "" turns the HTTP endpoints off
  std::optional<std::string> probe_address;                       // "" turns the probe listener off
  std::optional<int> metrics_max_connections;                     // of metricsAddress, 1..512
  std::optional<int> probe_max_connections;                       // of probeAddress, 1..512
  std::optional<std::chrono::milliseconds> http_request_timeout;  // from accept to the answer
  std::optional<AlignmentMode> alignment;
  std::optional<std::vector<std::string>> gpu_resources;
  std::optional<std::vector<std::string>> neuron_resources;
  std::optional<std::vector<std::string>> neuroncore_resources;
  std::optional<int> neuroncores_per_device;  // 0: by instance family
  std::optional<std::string> cdi_dir;
  std::optional<CdiHandover> cdi_handover;
  std::optional<MofedPolicy> mofed_policy;
  std::optional<DraPolicy> dra_policy;
  std::optional<std::vector<std::string>> dra_drivers;
  std::optional<std::vector<std::string>> cdi_spec_dirs;
  std::optional<int> expected_efa_count;  // 0: from the instance type
  std::optional<int> sharing_replicas;    // 1..kMaxReplicas (docs/alignment.md, "Sharing")
  std::optional<bool> sharing_rename_by_default;
  std::optional<std::chrono::milliseconds> counter_interval;
  std::optional<std::chrono::milliseconds> idle_timeout;
  std::optional<bool> device_health;
  std::optional<std::chrono::milliseconds> device_health_keep_alive_timeout;
  std::optional<int> device_health_admin_errors;
  std::optional<std::chrono::milliseconds> device_health_hold_down;
  std::optional<bool> claim_lookup;
  std::optional<std::string> api_server;  // "": the pod's KUBERNETES_SERVICE_HOST and _PORT
  std::optional<std::string> api_token_file;
  std::optional<std::string> api_ca_file;

  bool operator==(const Config&) const = default;
};

// What the configuration sets, each field at its default: the daemon's
// options (whose defaults are theirs and their parts') and the process's
// own. The configuration's defaults are read from here.
struct Settings {
  DaemonOptions daemon;
  std::string metrics_address = ":8080";  // "" turns the HTTP endpoints off
  std::string probe_address = ":8081";    // "" turns the probe listener off
  EndpointLimits limits;
  LogLevel log_level = LogLevel::kInfo;
  LogFormat log_format = LogFormat::kText;
  int expected_efa_count = 0;  // 0: from the instance type
  // With replicas > 1: serve the shared resource name (docs/alignment.md).
  bool sharing_rename_by_default = false;
};

// Every option at its default value (Settings').
Config DefaultConfig();

// `base` with every option that `over` sets replaced by `over`'s value.
Config MergeConfig(Config base, const Config& over);

// Looks an environment variable up; nullopt when it is not set. The only
// way the configuration reads the environment.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
// The process environment (getenv).
EnvLookup ProcessEnvironment();

// Parses a configuration file's text. `file_name` prefixes every message
// with the line and column of the offending node. The file must say
// `version: v1`; unknown keys are refused (naming the closest known key); a
// key whose value is null (`key:` or `key: ~`) counts as not given.
absl::StatusOr<Config> ParseConfigYaml(std::string_view text, const std::string& file_name);
// Reads and parses a configuration file; a file that cannot be read fails
// with "<path>: <reason>".
absl::StatusOr<Config> ReadConfigFile(const std::filesystem::path& path);
// The options set in the environment (EFA_X_Y for option xY). A variable
// set to the empty string counts as given (empty text, empty list).
absl::StatusOr<Config> ConfigFromEnvironment(const EnvLookup& env);

// The command-line side: adds --x-y for every option, --config and
// --print-config to a CLI11 app (before it parses), then hands out what was
// given. Lists are comma-separated; an empty value is an empty list.
class ConfigFlags {
 public:
  explicit ConfigFlags(CLI::App& app);
  ~ConfigFlags();
  ConfigFlags(const ConfigFlags&) = delete;
  ConfigFlags& operator=(const ConfigFlags&) = delete;

  // The options given on the command line (after the app parsed).
  absl::StatusOr<Config> Parsed() const;
  // --config, if given.
  std::optional<std::string> config_file() const;
  bool print_config() const { return print_config_; }

 private:
  struct Flag;
  std::vector<std::unique_ptr<Flag>> flags_;
  std::string config_file_;
  CLI::Option* config_option_ = nullptr;
  bool print_config_ = false;
};

// The configuration in effect: every option set, and where each came from.
struct EffectiveConfig {
  Config config;
  // Option key -> "--x-y", "EFA_X_Y" or the file's path; absent: default.
  std::map<std::string, std::string> origin;

  // The configuration as a file (`version: v1` and every key), each value
  // not at its default commented with its origin. Parsing it back gives
  // `config`.
  std::string ToYaml() const;
  // One line for the log: `key=value` for every option, origins in
  // parentheses.
  std::string Summary() const;
};

// Resolves flag > environment > file > default. The file is the one named
// by `config_file` (--config), else by EFA_CONFIG, else none.
absl::StatusOr<EffectiveConfig> ResolveConfig(const Config& flags,
                                              const std::optional<std::string>& config_file,
                                              const EnvLookup& env);
absl::StatusOr<EffectiveConfig> ResolveConfig(const ConfigFlags& flags, const EnvLookup& env);

// The settings a configuration gives: the defaults, with every option it
// sets replaced.
Settings ToSettings(const Config& config);
// ToSettings(config).daemon.
DaemonOptions ToDaemonOptions(const Config& config);

std::string_view LogLevelName(LogLevel level);
std::string_view LogFormatName(LogFormat format);
std::string_view AlignmentModeName(AlignmentMode mode);

}  // namespace efa::plugin
