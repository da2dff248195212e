#include "topology/pci_address.h"

#include <cstdio>

namespace efa::topology {
namespace {

// Parses exactly `digits` hex digits from the front of `text`.
std::optional<unsigned> TakeHex(std::string_view& text, size_t digits) {
  if (text.size() < digits) return std::nullopt;
  unsigned value = 0;
  for (size_t i = 0; i < digits; ++i) {
    char c = text[i];
    unsigned d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
      d = c - 'A' + 10;
    else
      return std::nullopt;
    value = value * 16 + d;
  }
  text.remove_prefix(digits);
  return value;
}

bool TakeChar(std::string_view& text, char c) {
  if (text.empty() || text.front() != c) return false;
  text.remove_prefix(1);
  return true;
}

}  // namespace

std::optional<PciAddress> PciAddress::Parse(std::string_view text) {
  PciAddress addr;
  if (text.size() == 12) {
    auto domain = TakeHex(text, 4);
    if (!domain || !TakeChar(text, ':')) return std::nullopt;
    addr.domain = static_cast<uint16_t>(*domain);
  }
  auto bus = TakeHex(text, 2);
  if (!bus || !TakeChar(text, ':')) return std::nullopt;
  auto dev = TakeHex(text, 2);
  if (!dev || *dev > 0x1f || !TakeChar(text, '.')) return std::nullopt;
  auto fn = TakeHex(text, 1);
  if (!fn || *fn > 7 || !text.empty()) return std::nullopt;
  addr.bus = static_cast<uint8_t>(*bus);
  addr.device = static_cast<uint8_t>(*dev);
  addr.function = static_cast<uint8_t>(*fn);
  return addr;
}

std::string PciAddress::ToString() const {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", domain, bus, device, function);
  return buf;
}

}  // namespace efa::topology
