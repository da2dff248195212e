#include "plugin/ops/metrics.h"

#include <prometheus/text_serializer.h>

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

std::string SerializeMetrics(std::vector<prometheus::MetricFamily> families) {
  for (prometheus::MetricFamily& family : families) {
    family.help = absl::StrReplaceAll(family.help, {{"\\", "\\\\"}, {"\n", "\\n"}});
  }
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace efa::plugin
