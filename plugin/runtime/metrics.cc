#include "plugin/runtime/metrics.h"

#include <prometheus/text_serializer.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "spdlog/spdlog.h"

namespace efa::plugin {
namespace {

// The process's start in seconds since the epoch: the boot time (/proc/stat
// btime) plus the process's start after boot (/proc/self/stat starttime, in
// clock ticks). exec() keeps it: the daemon and the idle process it hands
// over to (or back) share it, so only a real restart changes it. Read once;
// nullopt (logged) when /proc does not say.
std::optional<double> ReadProcessStartTime() {
  std::ifstream stat_file("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(stat_file)), {});
  // Fields after the command name, which may hold spaces and parentheses:
  // state (field 3) first, starttime (field 22) 19 later.
  const size_t name_end = stat.rfind(')');
  std::vector<std::string> fields;
  if (name_end != std::string::npos) {
    fields = absl::StrSplit(stat.substr(name_end + 1), ' ', absl::SkipEmpty());
  }
  uint64_t ticks = 0;
  if (fields.size() < 20 || !absl::SimpleAtoi(fields[19], &ticks)) {
    spdlog::warn("/proc/self/stat: no start time; efa_device_plugin_start_time_seconds absent");
    return std::nullopt;
  }
  std::ifstream boot_file("/proc/stat");
  for (std::string line; std::getline(boot_file, line);) {
    uint64_t btime = 0;
    if (absl::StartsWith(line, "btime ") && absl::SimpleAtoi(line.substr(6), &btime)) {
      return static_cast<double>(btime) +
             static_cast<double>(ticks) / static_cast<double>(::sysconf(_SC_CLK_TCK));
    }
  }
  spdlog::warn("/proc/stat: no btime line; efa_device_plugin_start_time_seconds absent");
  return std::nullopt;
}

}  // namespace

prometheus::MetricFamily& AddFamily(std::vector<prometheus::MetricFamily>& families,
                                    std::string name, std::string help,
                                    prometheus::MetricType type) {
  families.push_back({std::move(name), std::move(help), type, {}});
  return families.back();
}

void AddSample(prometheus::MetricFamily& family, double value,
               std::vector<prometheus::ClientMetric::Label> labels) {
  prometheus::ClientMetric& m = family.metric.emplace_back();
  m.label = std::move(labels);
  if (family.type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
}

void CollectIdentity(std::string_view mode, int healthy, int unhealthy,
                     std::vector<prometheus::MetricFamily>& out) {
  using prometheus::MetricType;
  AddSample(AddFamily(out, absl::StrCat(kMetricPrefix, "info"),
                      "1, labelled with the plugin's version and mode (serving: the device-plugin "
                      "API is served; idle: no EFA on the node yet).",
                      MetricType::Gauge),
            1, {{"version", EFA_VERSION}, {"mode", std::string(mode)}});
  auto& devices = AddFamily(out, absl::StrCat(kMetricPrefix, "devices"),
                            "EFAs advertised to the kubelet, by health (after the guards: none "
                            "while withdrawn, all unhealthy under MOFED protect; 0 when idle).",
                            MetricType::Gauge);
  AddSample(devices, healthy, {{"health", "healthy"}});
  AddSample(devices, unhealthy, {{"health", "unhealthy"}});
  static const std::optional<double> start_time = ReadProcessStartTime();
  auto& start = AddFamily(out, absl::StrCat(kMetricPrefix, "start_time_seconds"),
                          "Start of the process, seconds since the Unix epoch (kept across the "
                          "hand-over between the daemon and the idle process: a change is a "
                          "restart).",
                          MetricType::Gauge);
  if (start_time) AddSample(start, *start_time);
}

std::string SerializeMetrics(std::vector<prometheus::MetricFamily> families) {
  for (prometheus::MetricFamily& family : families) {
    family.help = absl::StrReplaceAll(family.help, {{"\\", "\\\\"}, {"\n", "\\n"}});
  }
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace efa::plugin
