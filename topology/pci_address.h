// PCI function addresses ("0000:4f:00.0") as used in sysfs and by hwloc.
#pragma once

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace efa::topology {

struct PciAddress {
  uint16_t domain = 0;
  uint8_t bus = 0;
  uint8_t device = 0;
  uint8_t function = 0;

  // Parses the canonical sysfs form "dddd:bb:dd.f" (hex, any case); also
  // accepts "bb:dd.f" with domain 0. Returns nullopt on anything else.
  static std::optional<PciAddress> Parse(std::string_view text);
  // Canonical lower-case form, e.g. "0000:4f:00.0".
  std::string ToString() const;

  auto operator<=>(const PciAddress&) const = default;
};

}  // namespace efa::topology
