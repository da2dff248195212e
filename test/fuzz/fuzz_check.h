// Checks inside fuzz targets. A failed check prints what failed and aborts,
// which libFuzzer reports as a crash (and the corpus runner as a failure),
// so a target can assert properties of the parser beyond "does not crash".
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string_view>

#define FUZZ_CHECK(cond)                                                                 \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: fuzz check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

// Like FUZZ_CHECK, also printing `text` (a message or a value) on failure.
#define FUZZ_CHECK_MSG(cond, text)                                                             \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      const auto& fuzz_text_ = (text);                                                         \
      std::fprintf(stderr, "%s:%d: fuzz check failed: %s (%.*s)\n", __FILE__, __LINE__, #cond, \
                   static_cast<int>(fuzz_text_.size()), fuzz_text_.data());                    \
      std::abort();                                                                            \
    }                                                                                          \
  } while (0)

namespace efa::fuzz {

inline std::string_view AsText(const unsigned char* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace efa::fuzz
