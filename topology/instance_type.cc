#include "topology/instance_type.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "topology/sysfs.h"

namespace efa::topology {
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

}  // namespace

absl::StatusOr<std::string> ReadInstanceType(const std::filesystem::path& sysfs_root) {
  const std::filesystem::path path = sysfs_root / "devices/virtual/dmi/id/product_name";
  auto name = ReadAttribute(path);
  if (!name.ok()) return name.status();
  if (name->empty()) return absl::NotFoundError(absl::StrCat(path.string(), ": empty"));
  return name;
}

std::string_view WithoutHyperPodPrefix(std::string_view instance_type) {
  if (instance_type.starts_with("ml.")) instance_type.remove_prefix(3);
  return instance_type;
}

std::string_view InstanceFamily(std::string_view instance_type) {
  instance_type = WithoutHyperPodPrefix(instance_type);
  return instance_type.substr(0, instance_type.find('.'));
}

std::optional<int> SupportedEfaCount(std::string_view instance_type) {
  instance_type = WithoutHyperPodPrefix(instance_type);
  for (const TypeCount& t : kEfaCounts) {
    if (t.type == instance_type) return t.efas;
  }
  return std::nullopt;
}

int DefaultNeuronCoresPerDevice(std::string_view instance_type) {
  const std::string_view family = InstanceFamily(instance_type);
  if (family == "inf1") return 4;
  if (family == "inf2" || family.starts_with("trn1")) return 2;
  return 4;  // trn2, trn3: 8 physical cores, logical NeuronCore size 2
}

}  // namespace efa::topology
