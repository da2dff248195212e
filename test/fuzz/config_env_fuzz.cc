// Fuzzes the environment side of the configuration (ConfigFromEnvironment).
// The input is an environment block as in /proc/<pid>/environ:
// NUL-separated NAME=VALUE entries (a later entry wins, as with setenv).
// Any values give a Config or an InvalidArgument that starts with the name
// of a variable that is set; a Config prints back as a file that parses to
// the same configuration.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "plugin/config.h"
#include "test/fuzz/fuzz_check.h"

using namespace efa::plugin;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::map<std::string, std::string> vars;
  std::string_view rest = efa::fuzz::AsText(data, size);
  while (!rest.empty()) {
    const size_t end = rest.find('\0');
    const std::string_view entry = rest.substr(0, end);
    const size_t eq = entry.find('=');
    if (eq != std::string_view::npos) {
      vars[std::string(entry.substr(0, eq))] = std::string(entry.substr(eq + 1));
    }
    if (end == std::string_view::npos) break;
    rest.remove_prefix(end + 1);
  }
  const EnvLookup env = [&vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
  auto parsed = ConfigFromEnvironment(env);
  if (!parsed.ok()) {
    FUZZ_CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
    const absl::string_view message = parsed.status().message();
    const size_t colon = message.find(": ");
    FUZZ_CHECK_MSG(colon != absl::string_view::npos, message);
    FUZZ_CHECK_MSG(vars.count(std::string(message.substr(0, colon))) == 1, message);
    return 0;
  }
  EffectiveConfig effective;
  effective.config = MergeConfig(DefaultConfig(), *parsed);
  const std::string printed = effective.ToYaml();
  auto again = ParseConfigYaml(printed, "printed.yaml");
  FUZZ_CHECK_MSG(again.ok(), again.status().message());
  FUZZ_CHECK_MSG(*again == effective.config, printed);
  return 0;
}
