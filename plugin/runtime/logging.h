// Log output: spdlog's default text lines, or one JSON object per line
// ({"time":"2024-05-01T12:00:00.123Z","level":"warn","msg":"..."}) for log
// collectors.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "spdlog/formatter.h"

namespace efa::plugin {

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError };
enum class LogFormat { kText, kJson };

// The names of the levels and formats on the command line and in the
// configuration, in declaration order.
const std::vector<std::pair<LogLevel, std::string>>& LogLevelNames();
const std::vector<std::pair<LogFormat, std::string>>& LogFormatNames();

// Sets the default logger's level and format, and sends it to stderr when
// `to_stderr` (commands whose stdout is their output) instead of stdout.
// Call once at start, before other threads log.
void ConfigureLogging(LogLevel level, LogFormat format, bool to_stderr = false);

// The formatter of the json format: time (UTC, milliseconds), level (trace,
// debug, info, warn, error, critical) and msg, with invalid UTF-8 replaced.
std::unique_ptr<spdlog::formatter> MakeJsonLogFormatter();

}  // namespace efa::plugin
