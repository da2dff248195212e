#include "plugin/ops/expected_efas.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "plugin/ops/metrics.h"
#include "spdlog/spdlog.h"
#include "topology/instance_type.h"

namespace efa::plugin {
namespace {

struct TypeCount {
  std::string_view type;
  int efas;
};

// EC2's MaximumEfaInterfaces for instance types that are bought for EFA,
// only where a public source gives the count. Types not listed are not
// checked (expectedEfaCount checks any type); among them p6e-gb300.36xlarge
// and the c9g/m9g families of AWS's chart, whose counts no public source we
// read gives.
constexpr TypeCount kEfaCounts[] = {
    {"g5.48xlarge", 1},
    {"p3dn.24xlarge", 1},
    {"p4d.24xlarge", 4},
    {"p4de.24xlarge", 4},
    {"p5.48xlarge", 32},
    {"p5e.48xlarge", 32},
    {"p5en.48xlarge", 16},
    {"p6-b200.48xlarge", 8},
    // 16 EFAs at 400 Gbps (EC2 user guide, P6-B300 network cards).
    {"p6-b300.48xlarge", 16},
    // At most 16 of its 17 network cards carry an EFA: card 0 is ENA only
    // (EC2 user guide, EFA for P6e-GB200).
    {"p6e-gb200.36xlarge", 16},
    {"trn1.32xlarge", 8},
    {"trn1n.32xlarge", 16},
    {"trn2.48xlarge", 16},
    {"trn2u.48xlarge", 16},  // trn2's layout (AWS's Neuron-to-EFA maps)
    // arm64 (Graviton): the EFA sizes AWS's chart v0.5.30 lists, with
    // Karpenter's instance-types reference (vpc.amazonaws.com/efa): 1 EFA,
    // but 2 on the .48xlarge and .metal-48xl sizes of c8gn, m8gn, r8gn,
    // c8gb, m8gb and r8gb.
    {"c6gn.16xlarge", 1},
    {"c7g.16xlarge", 1},
    {"c7g.metal", 1},
    {"c7gd.16xlarge", 1},
    {"c7gd.metal", 1},
    {"c7gn.16xlarge", 1},
    {"c7gn.metal", 1},
    {"c8g.24xlarge", 1},
    {"c8g.48xlarge", 1},
    {"c8g.metal-24xl", 1},
    {"c8g.metal-48xl", 1},
    {"c8gb.16xlarge", 1},
    {"c8gb.24xlarge", 1},
    {"c8gb.48xlarge", 2},
    {"c8gb.metal-24xl", 1},
    {"c8gb.metal-48xl", 2},
    {"c8gd.24xlarge", 1},
    {"c8gd.48xlarge", 1},
    {"c8gd.metal-24xl", 1},
    {"c8gd.metal-48xl", 1},
    {"c8gn.16xlarge", 1},
    {"c8gn.24xlarge", 1},
    {"c8gn.48xlarge", 2},
    {"c8gn.metal-24xl", 1},
    {"c8gn.metal-48xl", 2},
    {"hpc7g.4xlarge", 1},
    {"hpc7g.8xlarge", 1},
    {"hpc7g.16xlarge", 1},
    {"i4g.16xlarge", 1},
    {"i8g.48xlarge", 1},
    {"i8g.metal-48xl", 1},
    {"i8ge.48xlarge", 1},
    {"i8ge.metal-48xl", 1},
    {"im4gn.16xlarge", 1},
    {"m7g.16xlarge", 1},
    {"m7g.metal", 1},
    {"m7gd.16xlarge", 1},
    {"m7gd.metal", 1},
    {"m8g.24xlarge", 1},
    {"m8g.48xlarge", 1},
    {"m8g.metal-24xl", 1},
    {"m8g.metal-48xl", 1},
    {"m8gb.16xlarge", 1},
    {"m8gb.24xlarge", 1},
    {"m8gb.48xlarge", 2},
    {"m8gb.metal-24xl", 1},
    {"m8gb.metal-48xl", 2},
    {"m8gd.24xlarge", 1},
    {"m8gd.48xlarge", 1},
    {"m8gd.metal-24xl", 1},
    {"m8gd.metal-48xl", 1},
    {"m8gn.16xlarge", 1},
    {"m8gn.24xlarge", 1},
    {"m8gn.48xlarge", 2},
    {"m8gn.metal-24xl", 1},
    {"m8gn.metal-48xl", 2},
    {"r7g.16xlarge", 1},
    {"r7g.metal", 1},
    {"r7gd.16xlarge", 1},
    {"r7gd.metal", 1},
    {"r8g.24xlarge", 1},
    {"r8g.48xlarge", 1},
    {"r8g.metal-24xl", 1},
    {"r8g.metal-48xl", 1},
    {"r8gb.16xlarge", 1},
    {"r8gb.24xlarge", 1},
    {"r8gb.48xlarge", 2},
    {"r8gb.metal-24xl", 1},
    {"r8gb.metal-48xl", 2},
    {"r8gd.24xlarge", 1},
    {"r8gd.48xlarge", 1},
    {"r8gd.metal-24xl", 1},
    {"r8gd.metal-48xl", 1},
    {"r8gn.16xlarge", 1},
    {"r8gn.24xlarge", 1},
    {"r8gn.48xlarge", 2},
    {"r8gn.metal-24xl", 1},
    {"r8gn.metal-48xl", 2},
    {"x8g.24xlarge", 1},
    {"x8g.48xlarge", 1},
    {"x8g.metal-24xl", 1},
    {"x8g.metal-48xl", 1},
};

std::string Article(std::string_view word) {
  const bool vowel =
      !word.empty() && std::string_view("aeiou").find(word[0]) != std::string_view::npos;
  return absl::StrCat(vowel ? "an " : "a ", std::string(word));
}

std::string Efas(int n) { return absl::StrCat(n, n == 1 ? " EFA" : " EFAs"); }

}  // namespace

std::optional<int> SupportedEfaCount(std::string_view instance_type) {
  if (instance_type.substr(0, 3) == "ml.") instance_type.remove_prefix(3);
  for (const TypeCount& t : kEfaCounts) {
    if (t.type == instance_type) return t.efas;
  }
  return std::nullopt;
}

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
    check.expected = SupportedEfaCount(instance_type);
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
