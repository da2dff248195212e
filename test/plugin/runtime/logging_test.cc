// The JSON log format: one object per line with time, level and msg.
#include "plugin/runtime/logging.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <string>

#include "nlohmann/json.hpp"
#include "spdlog/details/log_msg.h"

using namespace efa::plugin;

namespace {

std::string Format(spdlog::level::level_enum level, std::string_view text,
                   std::chrono::system_clock::time_point time) {
  spdlog::details::log_msg msg(spdlog::source_loc{}, "", level,
                               spdlog::string_view_t(text.data(), text.size()));
  msg.time = time;
  spdlog::memory_buf_t out;
  MakeJsonLogFormatter()->format(msg, out);
  return std::string(out.data(), out.size());
}

}  // namespace

TEST_CASE("JSON log lines carry the UTC time, the level and the escaped message", "[logging]") {
  // 2024-05-01T12:00:00.123Z
  const auto t = std::chrono::system_clock::time_point(std::chrono::milliseconds(1714564800123));
  CHECK(Format(spdlog::level::warn, "EFA rdmap79s0 is unhealthy: \"gone\"\n\tagain", t) ==
        "{\"time\":\"2024-05-01T12:00:00.123Z\",\"level\":\"warn\",\"msg\":\"EFA rdmap79s0 is "
        "unhealthy: \\\"gone\\\"\\n\\tagain\"}\n");
  CHECK(Format(spdlog::level::err, "x", t).find("\"level\":\"error\"") != std::string::npos);
  CHECK(Format(spdlog::level::debug, "x", t).find("\"level\":\"debug\"") != std::string::npos);
}

TEST_CASE("A JSON log line stays valid JSON whatever bytes the message holds", "[logging]") {
  const std::string line = Format(spdlog::level::info, std::string("bad \xff\xfe utf-8 \x01"),
                                  std::chrono::system_clock::time_point());
  REQUIRE(nlohmann::json::accept(line));
  auto j = nlohmann::json::parse(line);
  CHECK(j["time"] == "1970-01-01T00:00:00.000Z");
  CHECK(j["msg"] == "bad \xef\xbf\xbd\xef\xbf\xbd utf-8 \x01");
}
