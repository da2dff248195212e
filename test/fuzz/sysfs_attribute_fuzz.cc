// Fuzzes the parsers behind the sysfs attribute readers: ParseHex (vendor,
// device), ParseInt (numa_node) and ParseDevNumbers (uverbsN/dev), each
// given the whole input as the attribute's text. A value that parses prints
// back to the same value; an error says what was expected and quotes at
// most 40 bytes of the input.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "test/fuzz/fuzz_check.h"
#include "topology/sysfs.h"

using namespace efa::topology;

namespace {

// "expected ..., got "<at most 40 bytes, escaped>"..."": bounded whatever the input.
void CheckError(const absl::Status& status, absl::string_view expected_start) {
  FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  FUZZ_CHECK_MSG(absl::StartsWith(status.message(), expected_start), status.message());
  FUZZ_CHECK_MSG(status.message().size() <= expected_start.size() + 40 * 4 + 8, status.message());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = efa::fuzz::AsText(data, size);

  if (auto hex = ParseHex(text); hex.ok()) {
    FUZZ_CHECK(*ParseHex(absl::StrCat(absl::Hex(*hex))) == *hex);
    FUZZ_CHECK(*ParseHex(absl::StrCat("0x", absl::Hex(*hex), "\n")) == *hex);
  } else {
    CheckError(hex.status(), "expected a hexadecimal number, got \"");
  }

  if (auto value = ParseInt(text); value.ok()) {
    FUZZ_CHECK(*ParseInt(absl::StrCat(*value, "\n")) == *value);
  } else {
    CheckError(value.status(), "expected an integer, got \"");
  }

  if (auto numbers = ParseDevNumbers(text); numbers.ok()) {
    FUZZ_CHECK(*ParseDevNumbers(absl::StrCat(numbers->first, ":", numbers->second)) == *numbers);
  } else {
    CheckError(numbers.status(), "expected a device number like \"231:192\", got \"");
  }
  return 0;
}
