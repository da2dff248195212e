#include "plugin/ops/metrics.h"

#include <prometheus/text_serializer.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace efa::plugin {

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
}

std::string SerializeMetrics(std::vector<prometheus::MetricFamily> families) {
  for (prometheus::MetricFamily& family : families) {
    family.help = absl::StrReplaceAll(family.help, {{"\\", "\\\\"}, {"\n", "\\n"}});
  }
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace efa::plugin
