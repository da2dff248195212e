#include "plugin/runtime/expected_efas.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "plugin/runtime/metrics.h"
#include "spdlog/spdlog.h"
#include "topology/instance_type.h"

namespace efa::plugin {
namespace {

std::string Article(std::string_view word) {
  const bool vowel =
      !word.empty() && std::string_view("aeiou").find(word[0]) != std::string_view::npos;
  return absl::StrCat(vowel ? "an " : "a ", std::string(word));
}

std::string Efas(int n) { return absl::StrCat(n, n == 1 ? " EFA" : " EFAs"); }

}  // namespace

std::string ResolveInstanceType(const std::string& configured,
                                const std::filesystem::path& sysfs_root) {
  if (!configured.empty()) return configured;
  auto dmi = topology::ReadInstanceType(sysfs_root);
  return dmi.ok() ? *dmi : std::string();
}

ExpectedEfasCheck CheckExpectedEfas(const std::string& instance_type, int expected_efa_count,
                                    int found) {
  ExpectedEfasCheck check;
  check.instance_type = instance_type;
  check.found = found;
  if (expected_efa_count > 0) {
    check.expected = expected_efa_count;
    check.configured = true;
  } else {
    check.expected = topology::SupportedEfaCount(instance_type);
  }
  return check;
}

std::string ExpectedEfasCheck::Describe() const {
  const std::string found_text = absl::StrCat("found ", Efas(found));
  if (!expected) {
    if (instance_type.empty()) {
      return absl::StrCat(found_text,
                          "; the instance type is unknown (set instanceType or expectedEfaCount "
                          "to check the count)");
    }
    return absl::StrCat(found_text, "; no EFA count is known for ", instance_type,
                        " (set expectedEfaCount to check it)");
  }
  const std::string reference = configured
                                    ? absl::StrCat("expectedEfaCount is ", *expected)
                                    : absl::StrCat(Article(instance_type), " supports ", *expected);
  if (found == *expected) {
    return absl::StrCat(found_text, ", as ",
                        configured ? std::string("expectedEfaCount says")
                                   : absl::StrCat("many as ", Article(instance_type), " supports"));
  }
  if (found > *expected) {
    return absl::StrCat(found_text, ", more than expected: ", reference,
                        configured ? "" : " (set expectedEfaCount if the table is out of date)");
  }
  return absl::StrCat(
      found_text, ", but ", reference,
      ": the node was likely launched with fewer EFA interfaces than it supports. Check the "
      "launch template or the Karpenter EC2NodeClass: every network card needs a network "
      "interface with interfaceType efa or efa-only",
      found == 0 ? ", and the efa kernel module must be loaded" : "");
}

ExpectedEfasMonitor::ExpectedEfasMonitor(std::string instance_type, int expected_efa_count)
    : instance_type_(std::move(instance_type)), expected_efa_count_(expected_efa_count) {}

void ExpectedEfasMonitor::Observe(int found) {
  ExpectedEfasCheck check = CheckExpectedEfas(instance_type_, expected_efa_count_, found);
  {
    absl::MutexLock lock(&mu_);
    if (latest_ && latest_->found == found) return;
    latest_ = check;
  }
  if (check.short_of_expected() || (check.expected && found > *check.expected)) {
    spdlog::warn("EFA count: {}", check.Describe());
  } else {
    spdlog::info("EFA count: {}", check.Describe());
  }
}

std::optional<ExpectedEfasCheck> ExpectedEfasMonitor::latest() const {
  absl::MutexLock lock(&mu_);
  return latest_;
}

void CollectExpectedEfas(const std::optional<ExpectedEfasCheck>& check,
                         std::vector<prometheus::MetricFamily>& out) {
  using prometheus::MetricType;
  AddSample(AddFamily(out, absl::StrCat(kMetricPrefix, "efas_found"),
                      "EFAs found on the node by the last scan.", MetricType::Gauge),
            check ? check->found : 0);
  // A family without samples still shows its HELP and TYPE, as before
  // prometheus-cpp: dashboards and alerts see the name.
  auto& expected = AddFamily(out, absl::StrCat(kMetricPrefix, "efas_expected"),
                             "EFAs the node should have (expectedEfaCount, else the instance "
                             "type's count); absent when unknown.",
                             MetricType::Gauge);
  if (check && check->expected) AddSample(expected, *check->expected);
}

}  // namespace efa::plugin
