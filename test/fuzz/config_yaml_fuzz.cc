// Fuzzes the configuration file parser (ParseConfigYaml): any bytes give a
// Config or an InvalidArgument naming the file, never an exception; and a
// file that parses prints back (EffectiveConfig::ToYaml) as a file that
// parses to the same configuration.
#include <cstddef>
#include <cstdint>

#include "absl/strings/match.h"
#include "plugin/config.h"
#include "test/fuzz/fuzz_check.h"

using namespace efa::plugin;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parsed = ParseConfigYaml(efa::fuzz::AsText(data, size), "config.yaml");
  if (!parsed.ok()) {
    FUZZ_CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK_MSG(absl::StartsWith(parsed.status().message(), "config.yaml:"),
                   parsed.status().message());
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
