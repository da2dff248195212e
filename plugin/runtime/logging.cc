#include "plugin/runtime/logging.h"

#include <time.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "nlohmann/json.hpp"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace efa::plugin {
namespace {

const char* LevelName(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::trace:
      return "trace";
    case spdlog::level::debug:
      return "debug";
    case spdlog::level::info:
      return "info";
    case spdlog::level::warn:
      return "warn";
    case spdlog::level::err:
      return "error";
    case spdlog::level::critical:
      return "critical";
    default:
      return "off";
  }
}

class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const auto since_epoch = msg.time.time_since_epoch();
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(since_epoch);
    const auto millis =
        std::chrono::duration_cast<std::chrono::milliseconds>(since_epoch - seconds).count();
    const time_t t = static_cast<time_t>(seconds.count());
    struct tm utc;
    gmtime_r(&t, &utc);
    char time_text[96];
    std::snprintf(time_text, sizeof time_text, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ",
                  utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min,
                  utc.tm_sec, static_cast<int>(millis));
    nlohmann::ordered_json line;
    line["time"] = time_text;
    line["level"] = LevelName(msg.level);
    line["msg"] = std::string(msg.payload.data(), msg.payload.size());
    // Messages carry paths and device names read from the host: never let
    // a stray byte make the line invalid JSON.
    const std::string text =
        line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
    dest.append(text.data(), text.data() + text.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }
};

spdlog::level::level_enum ToSpdlog(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace:
      return spdlog::level::trace;
    case LogLevel::kDebug:
      return spdlog::level::debug;
    case LogLevel::kInfo:
      return spdlog::level::info;
    case LogLevel::kWarn:
      return spdlog::level::warn;
    case LogLevel::kError:
      return spdlog::level::err;
  }
  return spdlog::level::info;
}

}  // namespace

const std::vector<std::pair<LogLevel, std::string>>& LogLevelNames() {
  static const auto* names =
      new std::vector<std::pair<LogLevel, std::string>>{{LogLevel::kTrace, "trace"},
                                                        {LogLevel::kDebug, "debug"},
                                                        {LogLevel::kInfo, "info"},
                                                        {LogLevel::kWarn, "warn"},
                                                        {LogLevel::kError, "error"}};
  return *names;
}

const std::vector<std::pair<LogFormat, std::string>>& LogFormatNames() {
  static const auto* names = new std::vector<std::pair<LogFormat, std::string>>{
      {LogFormat::kText, "text"}, {LogFormat::kJson, "json"}};
  return *names;
}

std::unique_ptr<spdlog::formatter> MakeJsonLogFormatter() {
  return std::make_unique<JsonFormatter>();
}

void ConfigureLogging(LogLevel level, LogFormat format, bool to_stderr) {
  if (to_stderr) {
    auto logger = std::make_shared<spdlog::logger>(
        "", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    spdlog::set_default_logger(std::move(logger));
  }
  spdlog::set_level(ToSpdlog(level));
  if (format == LogFormat::kJson) spdlog::set_formatter(MakeJsonLogFormatter());
}

}  // namespace efa::plugin
