// Fuzzes the readers of the NVIDIA device plugin's /proc/<pid>/cmdline and
// environ (NUL-separated fields) and of its version string: the whole input
// is given to each. SplitNul loses nothing but the separators.
#include <cstddef>
#include <cstdint>
#include <string>

#include "plugin/guards/nvidia_plugin_process.h"
#include "test/fuzz/fuzz_check.h"

using namespace efa::plugin;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes = efa::fuzz::AsText(data, size);
  const std::vector<std::string_view> fields = SplitNul(bytes);
  std::string joined;
  for (size_t i = 0; i < fields.size(); ++i) {
    if (i > 0) joined += '\0';
    joined += fields[i];
  }
  const std::string_view without_final_nul =
      !bytes.empty() && bytes.back() == '\0' ? bytes.substr(0, bytes.size() - 1) : bytes;
  FUZZ_CHECK(joined == without_final_nul);

  const bool is_plugin = IsNvidiaPluginCommand(bytes);
  FUZZ_CHECK(!is_plugin || !fields.empty());
  NvidiaPluginProcess process;
  process.mofed_flag = MofedFlagFromCmdline(bytes);
  process.mofed_env = MofedEnvFromEnviron(bytes);
  process.version = std::string(bytes.substr(0, 64));
  const std::optional<bool> by_version = MofedDefaultForVersion(bytes);
  const std::optional<bool> effective = EffectiveMofed(process);
  if (process.mofed_flag) FUZZ_CHECK(effective == process.mofed_flag);
  if (by_version) FUZZ_CHECK(bytes.size() >= 5);
  if (auto b = ParseGoBool(bytes)) FUZZ_CHECK(bytes.size() <= 5);
  return 0;
}
