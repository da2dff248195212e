// Fuzzes PciAddress::Parse, which reads the PCI address out of sysfs link
// targets and the NVIDIA driver's "Bus Location". An address that parses
// prints (ToString) in the canonical form, which parses to the same
// address; a 12-character input is the canonical form up to case.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/ascii.h"
#include "test/fuzz/fuzz_check.h"
#include "topology/pci_address.h"

using efa::topology::PciAddress;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = efa::fuzz::AsText(data, size);
  const std::optional<PciAddress> addr = PciAddress::Parse(text);
  if (!addr) return 0;
  const std::string canonical = addr->ToString();
  FUZZ_CHECK_MSG(canonical.size() == 12, canonical);
  FUZZ_CHECK_MSG(PciAddress::Parse(canonical) == addr, canonical);
  FUZZ_CHECK(addr->device <= 0x1f && addr->function <= 7);
  if (text.size() == 12) {
    FUZZ_CHECK_MSG(absl::AsciiStrToLower(std::string(text)) == canonical, canonical);
  } else {
    FUZZ_CHECK(text.size() == 7 && addr->domain == 0);
  }
  return 0;
}
